"""The warm lowering of :func:`.forest.lower_rows`, compiled (numba): kept chunks copied, changed ones written.

The same transfers, in the same order, with the same copy claims as :func:`.forest.lower_rows`
(kept as the reference the tests compare against): rows grouped by new chunk (a counting sort,
the kept rows before the new ones as the concatenation had them), and within a chunk by the
reference's key — AllGather: a kept row's previous transfer, then new rows by depth; ReduceScatter:
every row by depth. A chunk kept whole is already in that order (its rows are one previous chunk's,
in order), so it is only scanned; only a repaired chunk is sorted.

Why compiled: at 512 GPUs a warm re-synthesis lowers ~2.1 million transfers of which ~90 % copy
the previous schedule; the numpy lowering spent 0.6–1.3 s in a stable argsort of every row,
the gathers it feeds, and the first-use and order checks of the copy claims.
"""

from __future__ import annotations

import numba
import numpy as np

from mccl.schedule import Chunks, Collective, Schedule, TransferOp, Transfers
from mccl.schedule.incremental import TransferOrigin
from mccl.synth.treepack.forest import Forest

__all__ = ["lower_warm"]

_jit = numba.njit(cache=True, nogil=True)


@_jit
def _order(n_chunks: int, rows: np.ndarray, row_chunk: np.ndarray, new_chunk: np.ndarray, row_key: np.ndarray,
           new_key: np.ndarray) -> np.ndarray:
    """Items (i ≥ 0: kept row i; -1 - j: new row j) grouped by chunk, each chunk stably by key."""
    counts = np.zeros(n_chunks + 1, dtype=np.int64)
    for i in range(len(rows)):
        counts[row_chunk[i] + 1] += 1
    for j in range(len(new_chunk)):
        counts[new_chunk[j] + 1] += 1
    for c in range(n_chunks):
        counts[c + 1] += counts[c]
    cursor = counts[:-1].copy()
    items = np.empty(len(rows) + len(new_chunk), dtype=np.int64)
    keys = np.empty(len(items), dtype=np.int64)
    for i in range(len(rows)):
        position = cursor[row_chunk[i]]
        items[position] = i
        keys[position] = row_key[i]
        cursor[row_chunk[i]] += 1
    for j in range(len(new_chunk)):
        position = cursor[new_chunk[j]]
        items[position] = -1 - j
        keys[position] = new_key[j]
        cursor[new_chunk[j]] += 1
    for c in range(n_chunks):
        a, b = counts[c], counts[c + 1]
        ordered = True
        for p in range(a + 1, b):
            if keys[p] < keys[p - 1]:
                ordered = False
                break
        if not ordered:
            permutation = np.argsort(keys[a:b], kind="mergesort")
            items[a:b] = items[a:b][permutation]
    return items


@_jit
def _write(items: np.ndarray, n: int, reduce: bool, rows: np.ndarray, row_chunk: np.ndarray, new_tail: np.ndarray,
           new_head: np.ndarray, new_chunk: np.ndarray, new_offsets: np.ndarray, new_links: np.ndarray,
           depth: np.ndarray, deepest: int, tail: np.ndarray, head: np.ndarray, route_offsets: np.ndarray,
           route_links: np.ndarray, weight: float, n_links: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The transfer columns (chunk, sender, receiver, step, route offsets, route links) of the items,
    the link load (``weight`` per chunk crossing, summed in link order as ``link_load``'s bincount) and
    the crossings per link (``chunks_per_link``)."""
    count = len(items)
    chunk = np.empty(count, dtype=np.int32)
    sender = np.empty(count, dtype=np.int32)
    receiver = np.empty(count, dtype=np.int32)
    step = np.empty(count, dtype=np.int32)
    offsets = np.empty(count + 1, dtype=np.int64)
    offsets[0] = 0
    for p in range(count):
        item = items[p]
        if item >= 0:
            row = rows[item]
            c, u, v = row_chunk[item], tail[row], head[row]
            length = route_offsets[row + 1] - route_offsets[row]
        else:
            j = -1 - item
            c, u, v = new_chunk[j], new_tail[j], new_head[j]
            length = new_offsets[j + 1] - new_offsets[j]
        chunk[p] = c
        if reduce:
            sender[p], receiver[p], step[p] = v, u, deepest - depth[c, v]
        else:
            sender[p], receiver[p], step[p] = u, v, depth[c, u]
        offsets[p + 1] = offsets[p] + length
    links = np.empty(offsets[count], dtype=np.int32)
    load = np.zeros(n_links, dtype=np.float64)
    crossings = np.zeros(n_links, dtype=np.int64)
    for p in range(count):
        item = items[p]
        if item >= 0:
            row = rows[item]
            source, start, stop = route_links, route_offsets[row], route_offsets[row + 1]
        else:
            j = -1 - item
            source, start, stop = new_links, new_offsets[j], new_offsets[j + 1]
        out = offsets[p]
        for q in range(stop - start):
            link = source[stop - 1 - q] if reduce else source[start + q]
            links[out + q] = link
            load[link] += weight
            crossings[link] += 1
    return chunk, sender, receiver, step, offsets, links, load, crossings


@_jit
def _claims(items: np.ndarray, rows: np.ndarray, step: np.ndarray, n_rows: int, row_start: np.ndarray,
            tail: np.ndarray, forest_depth: np.ndarray, row_transfer: np.ndarray, mapped: bool) -> np.ndarray:
    """Per transfer, the previous transfer it copies or -1 (the rules of :func:`.forest.lower_rows`)."""
    first = np.zeros(len(rows), dtype=np.bool_)  # the first use of each forest row in ``rows``
    used = np.zeros(n_rows, dtype=np.bool_)
    for i in range(len(rows)):
        if not used[rows[i]]:
            used[rows[i]] = True
            first[i] = True
    source = np.full(len(items), -1, dtype=np.int64)
    old_chunk = 0
    for p in range(len(items)):
        item = items[p]
        if item < 0 or not first[item]:
            continue
        row = rows[item]
        if not (row_start[old_chunk] <= row < row_start[old_chunk + 1]):  # rows come chunk by chunk
            old_chunk = np.searchsorted(row_start, row, side="right") - 1
        if forest_depth[old_chunk, tail[row]] != step[p]:
            continue
        source[p] = row_transfer[row] if mapped else row  # in any order (:func:`.forest.lower_rows`)
    return source


def lower_warm(collective: Collective, ranks: tuple[str, ...], k: int, forest: Forest, rows: np.ndarray,
               row_chunk: np.ndarray, new_tail: np.ndarray, new_head: np.ndarray, new_chunk: np.ndarray,
               new_route_offsets: np.ndarray, new_route_links: np.ndarray, depth: np.ndarray, n_links: int
               ) -> tuple[Schedule, TransferOrigin | None, np.ndarray]:
    """:func:`.forest.lower_rows` (same arguments, same schedule and origin), compiled; also the schedule's
    :func:`~mccl.schedule.link_load` on ``n_links`` links (the same floats: summed in the same order)."""
    n = forest.n
    reduce = collective is Collective.REDUCESCATTER
    tracked = not reduce and forest.transfers is not None
    as64 = lambda values: np.ascontiguousarray(values, dtype=np.int64)  # noqa: E731
    rows, row_chunk, new_tail, new_head, new_chunk = map(as64, (rows, row_chunk, new_tail, new_head, new_chunk))
    depth = np.ascontiguousarray(depth, dtype=np.int32)
    new_depth = depth[new_chunk, new_head].astype(np.int64)
    mapped = forest.row_transfer is not None
    if tracked:
        row_key = forest.row_transfer[rows] if mapped else rows
        new_key = len(forest.tail) + new_depth
    else:
        row_key = depth[row_chunk, forest.head[rows]].astype(np.int64)
        new_key = new_depth
    # A new edge's tie order in the reference: its place in the concatenation (stable), which the
    # counting sort keeps.
    items = _order(n * k, rows, row_chunk, new_chunk, as64(row_key), as64(new_key))
    deepest = int(depth.max()) if depth.size else 0
    forest_links = np.ascontiguousarray(forest.route_links, dtype=np.int32)  # the schedule's own: no copy
    chunk, sender, receiver, step, offsets, links, load, crossings = _write(
        items, n, reduce, rows, row_chunk, new_tail, new_head, new_chunk, as64(new_route_offsets),
        np.ascontiguousarray(new_route_links, dtype=np.int32), depth, deepest, forest.tail, forest.head,
        as64(forest.route_offsets), forest_links, 1.0 / k, n_links)
    op = np.full(len(chunk), int(TransferOp.REDUCE if reduce else TransferOp.COPY), dtype=np.int8)
    for column in (chunk, sender, receiver, step, offsets, links, op):
        column.setflags(write=False)
    transfers = Transfers(chunk, sender, receiver, step, op, offsets, links)
    sources = np.repeat(np.arange(n), k)
    fractions = np.full(n * k, 1.0 / k)
    none = np.full(n * k, -1)
    table = Chunks(none, sources, fractions) if reduce else Chunks(sources, none, fractions)
    # The loads the schedule's accounting, its Algorithm 1 profile and the guard's α-β predictions ask for
    # (``link_load``, ``chunks_per_link``: ~45 ms a pass over 6 M route links at 512 GPUs), already summed.
    transfers.remember_link_sums(table.fraction, n_links, load)
    transfers.remember_link_sums(None, n_links, crossings)
    origin = None
    if tracked:
        row_transfer = as64(forest.row_transfer) if mapped else np.zeros(0, dtype=np.int64)
        source = _claims(items, rows, step, len(forest.tail), as64(forest.row_start), forest.tail,
                         forest.depth, row_transfer, mapped)
        origin = TransferOrigin(forest.transfers, source)
    return Schedule(collective, ranks, table, transfers), origin, load
