"""Rules 1–4 of :func:`mccl.schedule.validate.validate`: the schedule is well formed against its topology.

Ranks are distinct GPUs, chunks partition every block, transfers name existing chunks and ranks on
compactly numbered steps with an operation the collective does, and every route is a path of existing
links from the sender's GPU to the receiver's through switches only. What these checks establish is
what the replay (rules 5–6, in :mod:`.validate`) relies on: it indexes state by chunk and rank without
bounds checks. The name helpers (:func:`_transfer_name` & co.) give every message of both halves the
same words.
"""

from __future__ import annotations

import numpy as np

from mccl.errors import InvalidSchedule
from mccl.schedule.ir import Collective, Schedule, TransferOp
from mccl.topology import Topology, fabric_view

_FRACTION_TOLERANCE = 1e-9


def _rank_name(schedule: Schedule, rank: int) -> str:
    return f"rank {rank} ({schedule.ranks[rank]})"


def _chunk_name(schedule: Schedule, chunk: int) -> str:
    source = int(schedule.chunks.source[chunk])
    destination = int(schedule.chunks.destination[chunk])
    kind = schedule.collective
    if kind is Collective.ALLGATHER:
        return f"chunk {chunk} (of source rank {source})"
    if kind is Collective.ALLTOALL:
        return f"chunk {chunk} (block rank {source} -> rank {destination})"
    return f"chunk {chunk} (of block {destination})"


def _transfer_name(schedule: Schedule, index: int) -> str:
    transfers = schedule.transfers
    return (f"transfer {index} ({_chunk_name(schedule, int(transfers.chunk[index]))}, "
            f"rank {int(transfers.sender[index])} -> rank {int(transfers.receiver[index])}, "
            f"step {int(transfers.step[index])})")


def _check_ranks(schedule: Schedule, topology: Topology) -> None:
    if schedule.n_ranks < 2:
        raise InvalidSchedule(f"a collective needs at least 2 ranks, the schedule has {schedule.n_ranks}")
    seen: dict[str, int] = {}
    for rank, gpu in enumerate(schedule.ranks):
        if gpu not in topology.node_index:
            raise InvalidSchedule(f"rank {rank} is placed on {gpu!r}, which topology {topology.name!r} does not have")
        if not topology.node(gpu).is_gpu:
            raise InvalidSchedule(f"rank {rank} is placed on {gpu!r}, a {topology.node(gpu).kind.value}, not a GPU")
        if gpu in seen:
            raise InvalidSchedule(f"ranks {seen[gpu]} and {rank} are both placed on {gpu!r}")
        seen[gpu] = rank


def _check_chunks(schedule: Schedule) -> None:
    chunks, n, kind = schedule.chunks, schedule.n_ranks, schedule.collective
    if len(chunks) == 0:
        raise InvalidSchedule("the schedule has no chunks")
    source, destination = chunks.source, chunks.destination
    needs_source = kind in (Collective.ALLGATHER, Collective.ALLTOALL)
    needs_destination = kind is not Collective.ALLGATHER
    for name, values, needed in (("source", source, needs_source), ("destination", destination, needs_destination)):
        if needed:
            bad = np.flatnonzero((values < 0) | (values >= n))
            if bad.size:
                raise InvalidSchedule(f"chunk {bad[0]} has {name} {values[bad[0]]}, not a rank of 0..{n - 1}")
        else:
            bad = np.flatnonzero(values != -1)
            if bad.size:
                raise InvalidSchedule(f"chunk {bad[0]} has {name} {values[bad[0]]}; a {kind.value} chunk has {name} -1")
    bad = np.flatnonzero(~np.isfinite(chunks.fraction) | (chunks.fraction <= 0))
    if bad.size:
        raise InvalidSchedule(f"chunk {bad[0]} has fraction {chunks.fraction[bad[0]]}; it must be positive")
    blocks = schedule.block_of_chunks()
    n_blocks = n * n if kind is Collective.ALLTOALL else n
    totals = np.bincount(blocks, weights=chunks.fraction, minlength=n_blocks)
    required = np.ones(n_blocks, dtype=bool)
    if kind is Collective.ALLTOALL:
        present = np.bincount(blocks, minlength=n_blocks) > 0
        required[np.arange(n) * n + np.arange(n)] = False  # the self block is a local copy
        required |= present
    for block in np.flatnonzero(required & (np.abs(totals - 1.0) > _FRACTION_TOLERANCE)):
        label = f"block rank {block // n} -> rank {block % n}" if kind is Collective.ALLTOALL else f"block {block}"
        if totals[block] == 0:
            raise InvalidSchedule(f"{label} has no chunks; its data would never move")
        raise InvalidSchedule(f"the chunks of {label} cover {totals[block]:.12g} of it, not all of it (1)")


def _check_transfers(schedule: Schedule, copies: slice | np.ndarray | None = None) -> None:
    """Rule 3. ``copies``: the transfers (a slice or an index / mask) that equal, field by field, transfers of a
    schedule of this collective that passed it (:mod:`.incremental`): their sender, receiver, step and operation
    are not checked again, their chunk index (renumbered) and the steps in use are. The first violation of
    each check lies among the others, so the message is the full check's."""
    transfers, n, kind = schedule.transfers, schedule.n_ranks, schedule.collective
    if len(transfers) == 0:
        raise InvalidSchedule("the schedule has no transfers")
    pick: slice | np.ndarray = slice(None)
    if isinstance(copies, slice) and copies.start in (None, 0) and copies.step in (None, 1):
        pick = slice(copies.stop, None)  # the copies come first
    elif copies is not None:
        others = np.ones(len(transfers), dtype=bool)
        others[copies] = False
        pick = np.flatnonzero(others)

    def index(i: int) -> int:  # a position among the checked transfers -> the transfer's index
        return int(pick[i]) if isinstance(pick, np.ndarray) else int(range(len(transfers))[pick][i])

    sender, receiver, step, op = (transfers.sender[pick], transfers.receiver[pick], transfers.step[pick],
                                  transfers.op[pick])
    known = np.zeros(256, dtype=bool)  # a table over int8 codes, not np.isin over every transfer
    known[[int(code) % 256 for code in TransferOp]] = True
    checks = (
        ((transfers.chunk < 0) | (transfers.chunk >= len(schedule.chunks)), slice(None), "names a chunk that does not exist"),
        ((sender < 0) | (sender >= n), pick, f"has a sender outside ranks 0..{n - 1}"),
        ((receiver < 0) | (receiver >= n), pick, f"has a receiver outside ranks 0..{n - 1}"),
        (sender == receiver, pick, "sends to its own rank"),
        (step < 0, pick, "has a negative step"),
        (~known[op.view(np.uint8)], pick, "has an unknown operation"),
    )
    for mask, among, message in checks:
        bad = np.flatnonzero(mask)
        if bad.size:
            i = index(bad[0]) if among is pick else int(bad[0])
            raise InvalidSchedule(f"transfer {i} (chunk {transfers.chunk[i]}, rank {transfers.sender[i]} -> "
                                  f"rank {transfers.receiver[i]}, step {transfers.step[i]}) {message}")
    top = int(transfers.step.max())
    # Steps in use: a count per step when they could be compact (no sort of millions of transfers).
    used = np.flatnonzero(np.bincount(transfers.step, minlength=top + 1)) if top < len(transfers) else (
        np.unique(transfers.step))
    if used[-1] != len(used) - 1:
        gap = int(np.flatnonzero(used != np.arange(len(used)))[0])
        raise InvalidSchedule(f"step {gap} has no transfers but step {int(used[-1])} does: steps must be numbered "
                              f"0..{len(used) - 1} without gaps (renumber them in order; reading a file does)")
    allowed = {
        Collective.ALLGATHER: {TransferOp.COPY},
        Collective.ALLTOALL: {TransferOp.COPY},
        Collective.REDUCESCATTER: {TransferOp.REDUCE},
        Collective.ALLREDUCE: {TransferOp.COPY, TransferOp.REDUCE},
    }[kind]
    permitted = np.zeros(256, dtype=bool)
    permitted[[int(code) % 256 for code in allowed]] = True
    bad = np.flatnonzero(~permitted[op.view(np.uint8)])
    if bad.size:
        i = index(bad[0])
        op_name = TransferOp(int(transfers.op[i])).name.lower()
        raise InvalidSchedule(f"{_transfer_name(schedule, i)} is a {op_name}, which a {kind.value} does not do")


def _check_routes(schedule: Schedule, topology: Topology) -> None:
    transfers = schedule.transfers
    lengths = transfers.route_lengths
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise InvalidSchedule(f"{_transfer_name(schedule, empty[0])} has an empty route")
    links = transfers.route_links.astype(np.int64)
    bad = np.flatnonzero((links < 0) | (links >= len(topology.links)))
    if bad.size:
        owner = int(np.searchsorted(transfers.route_offsets, bad[0], side="right") - 1)
        raise InvalidSchedule(f"{_transfer_name(schedule, owner)} uses link {links[bad[0]]}, "
                              f"which topology {topology.name!r} does not have")
    # Positions in the view: rank r is position r, so a route's ends compare with sender / receiver directly.
    view = fabric_view(topology, schedule.ranks)
    link_src, link_dst = view.link_src, view.link_dst
    first = transfers.route_offsets[:-1]
    last = transfers.route_offsets[1:] - 1

    def describe(index: int) -> str:
        hops = " ".join(f"{link}({topology.links[link].src}->{topology.links[link].dst})"
                        for link in transfers.route(index))
        return f"{_transfer_name(schedule, index)} with route [{hops}]"

    bad = np.flatnonzero(link_src[links[first]] != transfers.sender)
    if bad.size:
        i = bad[0]
        raise InvalidSchedule(f"{describe(i)} does not start at the sender's GPU {schedule.ranks[transfers.sender[i]]}")
    bad = np.flatnonzero(link_dst[links[last]] != transfers.receiver)
    if bad.size:
        i = bad[0]
        raise InvalidSchedule(f"{describe(i)} does not end at the receiver's GPU {schedule.ranks[transfers.receiver[i]]}")
    inner = np.ones(len(links), dtype=bool)
    inner[last] = False  # positions followed by another hop of the same route
    positions = np.flatnonzero(inner)
    broken = positions[link_dst[links[positions]] != link_src[links[positions + 1]]]
    if broken.size:
        owner = int(np.searchsorted(transfers.route_offsets, broken[0], side="right") - 1)
        raise InvalidSchedule(f"{describe(owner)} is not contiguous: link {links[broken[0]]} ends where "
                              f"link {links[broken[0] + 1]} does not start")
    through_gpu = positions[view.is_gpu_position(link_dst[links[positions]])]
    if through_gpu.size:
        owner = int(np.searchsorted(transfers.route_offsets, through_gpu[0], side="right") - 1)
        gpu = view.name(int(link_dst[links[through_gpu[0]]]))
        raise InvalidSchedule(f"{describe(owner)} passes through GPU {gpu}; forwarding through a GPU "
                              "must be a relay (a transfer of its own)")
    _check_simple(schedule, view.n_nodes + len(view.foreign), link_src, link_dst, describe, view.name)


def _check_simple(schedule: Schedule, n_positions: int, link_src: np.ndarray, link_dst: np.ndarray,
                  describe, name_of) -> None:
    """No route visits a node twice. Called after the contiguity and GPU checks: the ends are the two
    distinct GPUs and every inner node a switch, so only a route of 3+ links can repeat (a switch)."""
    transfers = schedule.transfers
    lengths = transfers.route_lengths
    links = transfers.route_links.astype(np.int64)
    starts_all = transfers.route_offsets[:-1].astype(np.int64)
    # Short routes (the bulk: 3-6 links through ToR / aggregation) compare their inner nodes pairwise, by
    # length class, without a sort; a repeated node among them is named by the general check below.
    # (The ends are the sender's and receiver's GPUs, distinct, and the inner nodes switches: checked before.)
    short_ok = True
    for length in range(3, 7):
        of_length = np.flatnonzero(lengths == length)
        if not of_length.size:
            continue
        inner = link_dst[links[starts_all[of_length][:, None] + np.arange(length - 1)]]  # the switches
        same = np.zeros(len(of_length), dtype=bool)
        for a in range(length - 1):
            for b in range(a + 1, length - 1):
                same |= inner[:, a] == inner[:, b]
        if same.any():
            short_ok = False  # the general check below names the first route that repeats a node
            break
    long_routes = np.flatnonzero(lengths >= (7 if short_ok else 3))
    if not long_routes.size:
        return
    sizes = lengths[long_routes].astype(np.int64)
    starts = transfers.route_offsets[:-1][long_routes].astype(np.int64)
    ends = np.cumsum(sizes)
    positions = np.repeat(starts - (ends - sizes), sizes) + np.arange(int(ends[-1]))
    owner = np.repeat(long_routes.astype(np.int64), sizes)
    nodes = np.concatenate([link_src[links[starts]], link_dst[links[positions]]])
    owners = np.concatenate([long_routes.astype(np.int64), owner])
    key = np.sort(owners * (n_positions + 1) + nodes)
    repeated = key[1:][key[1:] == key[:-1]]
    if repeated.size:
        index, node = divmod(int(repeated[0]), n_positions + 1)
        raise InvalidSchedule(f"{describe(index)} visits {name_of(node)} twice; a route must be a path "
                              "(each node at most once): the loop only adds hops and load")
