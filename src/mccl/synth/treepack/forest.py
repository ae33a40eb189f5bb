"""A schedule's trees as flat numpy rows: what the warm start reads and writes (mccl-paper §4.3).

The warm start works chunk by chunk on the previous schedule's transfers without
turning them into Python objects: a 512-GPU schedule has 5,120 chunks and 2.6
million transfers. Every chunk of a tree-packing AllGather is one spanning
out-tree of its source (ReduceScatter: the reversed tree of its owner, read on the
reversed fabric), so a :class:`Forest` keeps, per row, the tree edge
``tail → head`` in AllGather direction and its physical route (link ids in that
direction), rows grouped by chunk; and per chunk the depth of every rank in its
tree (pointer doubling on a chunks × ranks parent table, ``log2 n`` vectorized
steps), or ``valid = False`` when the chunk is not a spanning arborescence of its
root (a previous schedule from another synthesizer may hold anything).

:func:`lower_rows` is the inverse: chosen rows of a forest plus new rows become the
transfers of a new schedule, with steps from the depths (AllGather: a rank sends at
its depth; ReduceScatter: at ``D - depth`` of the sender, so that a rank forwards its
partial sum after all its children have), all with numpy gathers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.schedule import Chunks, Collective, Schedule, TransferOp, Transfers
from mccl.schedule.incremental import TransferOrigin
from mccl.synth.treepack.warmscan import depths_from_steps, gather_routes, group_by_chunk

__all__ = ["Forest", "forest_of", "segments", "lower_rows", "tree_depths", "readonly"]


@dataclass(frozen=True, eq=False)
class Forest:
    """Rows (tree edges in AllGather direction) grouped by chunk; routes as CSR over link ids."""

    n: int
    root: np.ndarray  # int64 per chunk
    row_start: np.ndarray  # int64, chunks + 1: the rows of chunk c are row_start[c]:row_start[c + 1]
    tail: np.ndarray  # int per row (int32: the schedule's own column when it is grouped by chunk)
    head: np.ndarray  # int per row
    route_offsets: np.ndarray  # int64, rows + 1
    route_links: np.ndarray  # int link ids (int32, as the schedule's), AllGather direction
    depth: np.ndarray  # int32, chunks × n: depth of each rank in the chunk's tree (valid chunks)
    valid: np.ndarray  # bool per chunk: a spanning out-tree of its root
    transfers: Transfers | None = None  # the schedule's transfers the rows were read from
    row_transfer: np.ndarray | None = None  # int64 per row: its transfer there (None: row i is transfer i)

    @property
    def n_chunks(self) -> int:
        return len(self.root)

    @property
    def row_chunk(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_chunks), np.diff(self.row_start))

    @property
    def route_lengths(self) -> np.ndarray:
        return np.diff(self.route_offsets)


def segments(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, *, reverse: bool = False) -> np.ndarray:
    """``values[starts[i]:starts[i] + lengths[i]]`` for every i, concatenated (each reversed if asked)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=values.dtype)
    ends = np.cumsum(lengths)
    if reverse:  # position p of segment i reads starts[i] + (ends[i] - 1 - p)
        return values[np.repeat(starts + ends - 1, lengths) - np.arange(total)]
    return values[np.repeat(starts - (ends - lengths), lengths) + np.arange(total)]


def readonly(values: np.ndarray) -> np.ndarray:
    """A read-only view of ``values`` (no copy)."""
    view = values.view()
    view.setflags(write=False)
    return view


def forest_of(previous: Schedule, collective: Collective) -> Forest:
    """The previous schedule's chunks as trees in AllGather direction (ReduceScatter: reversed)."""
    transfers = previous.transfers
    grouped = len(transfers.chunk) < 2 or bool(np.all(transfers.chunk[1:] >= transfers.chunk[:-1]))
    reduce = collective is Collective.REDUCESCATTER
    if grouped:  # rows are the transfers themselves: the schedule's own (read-only) columns, no copy
        order = None
        chunk, senders, receivers, steps = transfers.chunk, transfers.sender, transfers.receiver, transfers.step
    else:
        n_chunks = len(previous.chunks)
        in_range = int(transfers.chunk.min()) >= 0 and int(transfers.chunk.max()) < n_chunks  # 2+ transfers here
        order = (group_by_chunk(readonly(transfers.chunk), n_chunks) if in_range
                 else np.argsort(transfers.chunk, kind="stable"))  # the same permutation (a stable sort)
        chunk, senders, receivers = transfers.chunk[order], transfers.sender[order], transfers.receiver[order]
        steps = transfers.step[order]
    # Read-only views throughout (no copy): the compiled scans see one array type whether the schedule
    # was made here (its columns read-only) or unpickled (writable), so numba compiles each kernel once.
    chunk, senders, receivers, steps = map(readonly, (chunk, senders, receivers, steps))
    tail, head = (receivers, senders) if reduce else (senders, receivers)
    if grouped and not reduce:  # already rows by chunk, routes in AllGather direction: no gather needed
        links = transfers.route_links
        offsets = transfers.route_offsets.astype(np.int64, copy=False)
    else:  # the routes in row order, each reversed for ReduceScatter (segments() of them, in one pass)
        rows = np.arange(len(transfers), dtype=np.int64) if order is None else order
        offsets, links = gather_routes(readonly(transfers.route_offsets), readonly(transfers.route_links),
                                       readonly(rows), reduce)
    links, offsets = readonly(links), readonly(offsets)
    n_chunks = len(previous.chunks)
    row_start = np.searchsorted(chunk, np.arange(n_chunks + 1, dtype=chunk.dtype)).astype(np.int64)
    root = (previous.chunks.destination if reduce else previous.chunks.source).astype(np.int64)
    n = previous.n_ranks
    found = _depths_from_steps(n, root, chunk, tail, head, steps, reduce)
    depth, valid = found if found is not None else tree_depths(n, root, chunk, tail, head)
    return Forest(n, root, row_start, tail, head, offsets, links, depth, valid, transfers,
                  None if order is None else order.astype(np.int64))


def _depths_from_steps(n: int, root: np.ndarray, chunk: np.ndarray, tail: np.ndarray, head: np.ndarray,
                       step: np.ndarray, reduce: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """Depths read off the steps of a tree packing's schedule, if they are its (else None).

    The lowering (:func:`lower_rows`, :mod:`.treeset`) sends edge ``u → v`` at step depth(u)
    (ReduceScatter: ``D - depth(v)``, D = max step + 1), so depth(v) follows from the step. When
    every chunk has one in-edge per non-root rank and every edge then satisfies depth(v) =
    depth(u) + 1 with depth(root) = 0, each chunk is a spanning out-tree with those depths
    (parents strictly shallower: every rank reaches the root). Two gathers instead of the
    ``log2 n`` pointer-doubling passes of :func:`tree_depths`; any mismatch falls back to those.
    """
    fits, depth = depths_from_steps(n, root, chunk, tail, head, step, reduce)
    return (depth, np.ones(len(root), dtype=bool)) if fits else None


def tree_depths(n: int, root: np.ndarray, chunk: np.ndarray, tail: np.ndarray,
                head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depth of every rank in every chunk's tree (chunks × n, int32) and which chunks are spanning out-trees.

    A chunk is a spanning out-tree of its root iff every other rank has exactly one in-edge, the
    root none, and following parents from every rank reaches the root (no cycle): pointer doubling,
    ``ceil(log2 n) + 1`` steps over the whole table at once.
    """
    n_chunks = len(root)
    if n_chunks == 0:
        return np.zeros((0, n), dtype=np.int32), np.zeros(0, dtype=bool)
    chunk, tail, head = (np.asarray(values, dtype=np.int64) for values in (chunk, tail, head))
    bad_root = (root < 0) | (root >= n)
    safe_root = np.where(bad_root, 0, root)
    # Transfer columns are ranks and chunk ids (the IR's invariants); a self-loop is no tree edge.
    key = chunk * n + head
    counts = np.bincount(key, minlength=n_chunks * n).reshape(n_chunks, n)
    expected = np.ones((n_chunks, n), dtype=np.int64)
    expected[np.arange(n_chunks), safe_root] = 0
    valid = np.all(counts == expected, axis=1) & ~bad_root
    valid &= np.bincount(chunk[tail == head], minlength=n_chunks) == 0
    parent = np.tile(np.arange(n, dtype=np.int64), (n_chunks, 1))
    parent.reshape(-1)[key] = tail
    parent[np.arange(n_chunks), safe_root] = safe_root
    base = (np.arange(n_chunks, dtype=np.int64) * n)[:, None]
    anc = (parent + base).reshape(-1)
    dist = (np.arange(n)[None, :] != safe_root[:, None]).astype(np.int32).reshape(-1)
    for _ in range(int(np.ceil(np.log2(max(n, 2)))) + 1):
        dist = dist + dist[anc]
        anc = anc[anc]
    reached = (anc.reshape(n_chunks, n) - base) == safe_root[:, None]
    valid &= np.all(reached, axis=1)
    depth = np.where(valid[:, None], dist.reshape(n_chunks, n), -1).astype(np.int32)
    return depth, valid


def new_depth_rows(new_chunk: np.ndarray, new_head: np.ndarray, flat_depth: np.ndarray, n: int) -> np.ndarray:
    """Depth of each new row's head in its chunk's tree."""
    return flat_depth[new_chunk.astype(np.int64) * n + new_head]


def lower_rows(collective: Collective, ranks: tuple[str, ...], k: int, forest: Forest, rows: np.ndarray,
               row_chunk: np.ndarray, new_tail: np.ndarray, new_head: np.ndarray, new_chunk: np.ndarray,
               new_route_offsets: np.ndarray, new_route_links: np.ndarray, depth: np.ndarray
               ) -> tuple[Schedule, TransferOrigin | None]:
    """A schedule of ``n · k`` chunks (chunk ``r · k + j`` is rank r's j-th) from forest rows and new rows,
    and (AllGather) which of its transfers copy the previous schedule's: a kept row whose sender sits at
    the same depth as before (same step), :mod:`mccl.schedule.incremental`.

    ``rows``/``row_chunk``: forest rows kept and the new chunk each belongs to; ``new_*``: tree edges
    added by the warm start (AllGather direction), their routes as CSR (``new_route_offsets`` into
    ``new_route_links``, link ids); ``depth``: (n·k) × n tree depths.
    """
    n = forest.n
    tail = np.concatenate([forest.tail[rows], new_tail]).astype(np.int64)
    head = np.concatenate([forest.head[rows], new_head]).astype(np.int64)
    chunk = np.concatenate([row_chunk, new_chunk]).astype(np.int64)
    new_lengths = np.diff(new_route_offsets).astype(np.int64)
    flat_new = np.asarray(new_route_links, dtype=np.int64)
    # One gather from [forest links | new links]: rows by chunk, parents first; each route reversed
    # for ReduceScatter (the forest holds AllGather direction).
    pool = np.concatenate([forest.route_links, flat_new])
    starts = np.concatenate([forest.route_offsets[:-1][rows],
                             len(forest.route_links) + np.cumsum(new_lengths) - new_lengths])
    lengths = np.concatenate([forest.route_lengths[rows], new_lengths])
    reduce = collective is Collective.REDUCESCATTER
    flat_depth = depth.reshape(-1)
    within = flat_depth[chunk * n + head]  # rows by chunk, then by depth (parents first)
    tracked = not reduce and forest.transfers is not None
    if tracked:  # AllGather: a kept row where it was in the previous schedule (the validator compares in
        # that order, :mod:`mccl.schedule.incremental`), new rows after them by depth; steps are explicit
        before = np.arange(len(forest.tail)) if forest.row_transfer is None else forest.row_transfer
        within = np.concatenate([before[rows], len(forest.tail) + new_depth_rows(new_chunk, new_head, flat_depth, n)])
        width = len(forest.tail) + n + 1
    else:
        width = n + 1
    # One key, and timsort is near-linear on the mostly sorted rows.
    order = np.argsort(chunk * width + within, kind="stable")
    tail, head, chunk, lengths = tail[order], head[order], chunk[order], lengths[order]
    links = segments(pool, starts[order], lengths, reverse=reduce)
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if reduce:
        deepest = int(depth.max())
        step = deepest - flat_depth[chunk * n + head]
        sender, receiver = head, tail
    else:
        step = flat_depth[chunk * n + tail]
        sender, receiver = tail, head
    op = TransferOp.REDUCE if reduce else TransferOp.COPY
    transfers = Transfers(chunk, sender, receiver, step, np.full(len(chunk), int(op)), offsets, links)
    sources = np.repeat(np.arange(n), k)
    fractions = np.full(n * k, 1.0 / k)
    none = np.full(n * k, -1)
    table = Chunks(none, sources, fractions) if reduce else Chunks(sources, none, fractions)
    origin = None
    if tracked:
        # A repaired tree seeded from a kept one repeats some of its rows: only the first use (the
        # kept chunk's, listed first) counts as the copy, the others are checked as new.
        first_use = np.empty(len(forest.tail), dtype=np.int64)
        first_use[rows[::-1]] = np.arange(len(rows) - 1, -1, -1)
        claimed = np.where(first_use[rows] == np.arange(len(rows)), rows, -1)
        previous_row = np.concatenate([claimed, np.full(len(new_tail), -1, dtype=np.int64)])[order]
        copied = np.flatnonzero(previous_row >= 0)
        from_rows = previous_row[copied]
        old_chunk = forest.row_chunk[from_rows]
        same_step = forest.depth[old_chunk, forest.tail[from_rows]] == step[copied]
        source = np.full(len(chunk), -1, dtype=np.int64)
        mapped = from_rows if forest.row_transfer is None else forest.row_transfer[from_rows]
        source[copied[same_step]] = mapped[same_step]
        # Claims in any order: the validator's compiled check (schedule/copykernel.py) does not need the
        # previous order. (It once did: the claims of a previous schedule whose transfers were not grouped
        # by chunk — one registered from a file, or made before the cold lowering grouped them — were then
        # mostly dropped: 73 % "new" transfers at 512 GPUs, each validated and mapped again.)
        origin = TransferOrigin(forest.transfers, source)
    return Schedule(collective, ranks, table, transfers), origin
