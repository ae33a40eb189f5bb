"""AllReduce as ReduceScatter then AllGather: two registered schedules joined into one.

Block ``b`` of an AllReduce is the b-th n-th of the buffer. The ReduceScatter leaves
block ``b`` fully reduced at rank ``b``; the AllGather then copies block ``b`` from
rank ``b`` (its source) to every rank. The two phases may cut a block into different
chunks (k trees each, different fractions), so the joined schedule cuts every block
at the union of both phases' chunk boundaries: each piece lies inside exactly one
chunk of each phase and follows that chunk's transfers, the AllGather's shifted past
the ReduceScatter's last step. ``validate`` checks the result like any AllReduce.

Bound: none is claimed. The two phases' steady states overlap when pieces pipeline
(the ReduceScatter of one piece with the AllGather of another, often on opposite link
directions), so neither phase's bound, nor their harmonic sum, bounds the whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta, Transfers
from mccl.synth.common import check_ranks, describe_on
from mccl.synth.options import ComposedOptions
from mccl.synth.result import ComposedStats, SynthesisResult
from mccl.topology import Topology

__all__ = ["compose_allreduce", "join_reducescatter_allgather"]

_BOUNDARY_DECIMALS = 12  # chunk boundaries this close are the same cut (fractions are float sums)


def compose_allreduce(topology: Topology, ranks: Sequence[str] | None, options: ComposedOptions,
                      previous: SynthesisResult | Schedule | None,
                      optimize: Callable[..., SynthesisResult]) -> SynthesisResult:
    """The AllReduce of ``options``' two phases (see the module docstring). A previous composed
    result warm-starts each phase from its own previous phase; a bare schedule is not split."""
    started = time.perf_counter()
    chosen = check_ranks(topology, ranks)
    before = previous.stats if isinstance(previous, SynthesisResult) else None
    before_rs = before.reducescatter if isinstance(before, ComposedStats) else None
    before_ag = before.allgather if isinstance(before, ComposedStats) else None
    reducescatter = optimize(topology, Collective.REDUCESCATTER, chosen, method=options.reducescatter_method,
                             options=options.reducescatter, previous=before_rs)
    allgather = optimize(topology, Collective.ALLGATHER, chosen, method=options.allgather_method,
                         options=options.allgather, previous=before_ag)
    joined = join_reducescatter_allgather(reducescatter.schedule, allgather.schedule)
    meta = ScheduleMeta("allreduce.composed", topology=topology.name,
                        inputs=(("reducescatter", reducescatter.method), ("allgather", allgather.method)))
    schedule = describe_on(replace(joined, meta=meta), topology)
    return SynthesisResult(schedule=schedule, method="allreduce.composed", bound_gbs=None,
                           achieved_gbs=float(schedule.meta.achieved_gbs or 0.0), optimal=False,
                           stats=ComposedStats(solve_time_s=time.perf_counter() - started,
                                               reducescatter=reducescatter, allgather=allgather))


def _pieces(blocks_a: np.ndarray, fraction_a: np.ndarray, blocks_b: np.ndarray, fraction_b: np.ndarray,
            n_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut every block at both chunkings' boundaries: per piece, its block, fraction, and the
    chunk of ``a`` and of ``b`` it lies in (chunks of a block in index order tile it)."""
    piece_block, piece_fraction, piece_a, piece_b = [], [], [], []
    for block in range(n_blocks):
        chunks_a, chunks_b = np.flatnonzero(blocks_a == block), np.flatnonzero(blocks_b == block)
        ends_a = np.round(np.cumsum(fraction_a[chunks_a]), _BOUNDARY_DECIMALS)
        ends_b = np.round(np.cumsum(fraction_b[chunks_b]), _BOUNDARY_DECIMALS)
        ends_a[-1] = ends_b[-1] = 1.0
        cuts = np.union1d(ends_a, ends_b)
        starts = np.concatenate([[0.0], cuts[:-1]])
        middles = (starts + cuts) / 2
        piece_block.append(np.full(len(cuts), block))
        piece_fraction.append(cuts - starts)
        piece_a.append(chunks_a[np.searchsorted(ends_a, middles)])
        piece_b.append(chunks_b[np.searchsorted(ends_b, middles)])
    return tuple(np.concatenate(parts) for parts in (piece_block, piece_fraction, piece_a, piece_b))  # type: ignore[return-value]


def _per_piece(transfers: Transfers, piece_chunk: np.ndarray, step_offset: int) -> tuple[np.ndarray, ...]:
    """``transfers`` repeated for every piece of their chunk: (piece, row) index arrays and new steps."""
    order = np.argsort(piece_chunk, kind="stable")
    sorted_chunks = piece_chunk[order]
    first = np.searchsorted(sorted_chunks, transfers.chunk, side="left")
    last = np.searchsorted(sorted_chunks, transfers.chunk, side="right")
    counts = last - first
    rows = np.repeat(np.arange(len(transfers)), counts)
    offsets = np.repeat(first - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    pieces = order[np.arange(len(rows)) + offsets]
    return pieces, rows, transfers.step[rows].astype(np.int64) + step_offset


def join_reducescatter_allgather(reducescatter: Schedule, allgather: Schedule) -> Schedule:
    """One AllReduce schedule: ``reducescatter``'s transfers, then ``allgather``'s (same ranks)."""
    n = reducescatter.n_ranks
    block, fraction, in_rs, in_ag = _pieces(reducescatter.chunks.destination, reducescatter.chunks.fraction,
                                            allgather.chunks.source, allgather.chunks.fraction, n)
    rs_pieces, rs_rows, rs_steps = _per_piece(reducescatter.transfers, in_rs, 0)
    ag_pieces, ag_rows, ag_steps = _per_piece(allgather.transfers, in_ag, reducescatter.transfers.n_steps)
    parts = ((reducescatter.transfers, rs_pieces, rs_rows, rs_steps), (allgather.transfers, ag_pieces, ag_rows, ag_steps))
    columns: dict[str, list[np.ndarray]] = {name: [] for name in ("chunk", "sender", "receiver", "step", "op")}
    lengths, links = [], []
    for transfers, pieces, rows, steps in parts:
        columns["chunk"].append(pieces)
        columns["sender"].append(transfers.sender[rows])
        columns["receiver"].append(transfers.receiver[rows])
        columns["step"].append(steps)
        columns["op"].append(transfers.op[rows])
        lengths.append(transfers.route_lengths[rows])
        starts = transfers.route_offsets[rows]
        row_lengths = transfers.route_lengths[rows]
        within = np.arange(int(row_lengths.sum())) - np.repeat(np.cumsum(row_lengths) - row_lengths, row_lengths)
        links.append(transfers.route_links[np.repeat(starts, row_lengths) + within])
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))])
    chunks = Chunks(np.full(len(block), -1), block, fraction)
    joined = Transfers(*(np.concatenate(columns[name]) for name in ("chunk", "sender", "receiver", "step", "op")),
                       offsets, np.concatenate(links))
    return Schedule(Collective.ALLREDUCE, reducescatter.ranks, chunks, joined, ScheduleMeta("allreduce.composed"))
