"""Lowering a Schedule to one rank's send/receive plan (pure: numpy in, frozen data out).

The executor (mccl-paper §3.3) runs a schedule as point-to-point operations. Every
rank lowers the same validated schedule the same way, so all ranks agree on

* which operations each rank performs, in which order per peer (NCCL matches sends
  and receives of a peer pair in issue order and ignores tags; gloo matches by tag:
  the plan gives both, the per-peer ordinal doubles as the tag);
* which operation must finish before another may start on this rank (a chunk can be
  forwarded only once it has arrived, a partial sum only once the earlier
  contributions are added, a buffer region is overwritten only after the sends that
  read it have finished);
* where every chunk lies in the tensors, in elements: a block of ``E`` elements is
  cut at ``rint(E · cumulative fraction)`` (chunks of a block in chunk-id order), so
  any fractions (tree packing, column generation) and any ``E`` — also ``E`` not
  divisible by the chunk count, or smaller than it (empty chunks move nothing) —
  give the same cut points on every rank.

Nothing here imports torch: a plan is built when a schedule is staged (hot swap,
§6.2.2) off the critical path, and laid out per element count at call time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.errors import InvalidSchedule
from mccl.schedule import Collective, Schedule, TransferOp

__all__ = ["Op", "RankPlan", "build_plan", "slice_plan", "slice_spans", "chunk_layout", "Layout"]


@dataclass(frozen=True)
class Op:
    """One point-to-point operation of a rank.

    ``deps``: indices (into :attr:`RankPlan.ops`) of this rank's operations that must
    be complete — for receives: complete and added in — before this one may start.
    ``apply_deps``: for a reducing receive, operations that must be complete before
    its data is added into the partial sum (sends still reading the partial sum, the
    earlier contributions, in canonical order so the sum is the same on every run).
    ``tag``: the ordinal of this operation among those between the same ordered
    pair of ranks, equal on both ends.
    """

    index: int
    is_send: bool
    transfer: int
    chunk: int
    peer: int
    step: int
    op: TransferOp
    tag: int
    deps: tuple[int, ...]
    apply_deps: tuple[int, ...]
    part: int = 0  # in a sliced plan (:func:`slice_plan`): which slice of the chunk this moves


@dataclass(frozen=True, eq=False)
class Layout:
    """Element offset (inside its block) and length of every chunk, for given block sizes."""

    offset: np.ndarray
    length: np.ndarray


@dataclass(frozen=True, eq=False)
class RankPlan:
    """What one rank does for one schedule; independent of the message size."""

    collective: Collective
    n_ranks: int
    rank: int
    version: int
    chunk_block: np.ndarray
    fraction: np.ndarray
    chunk_source: np.ndarray
    chunk_destination: np.ndarray
    ops: tuple[Op, ...]
    steps: tuple[tuple[int, ...], ...]
    relayed_chunks: tuple[int, ...]
    has_relays: bool
    n_steps: int
    slices: int = 1  # every chunk moves as this many slices (:func:`slice_plan`)
    origin: tuple[int, ...] = ()  # sliced plan: the unsliced operation each one is a slice of
    # a reducing schedule in which no rank forwards a partial sum: every reducing transfer carries its
    # sender's own contribution, so the receiver may add them in any order (mccl.runtime.reduction_order)
    raw_contributions: bool = False

    @property
    def n_blocks(self) -> int:
        return self.n_ranks * self.n_ranks if self.collective is Collective.ALLTOALL else self.n_ranks

    def layout(self, block_elems: np.ndarray) -> Layout:
        return chunk_layout(self.chunk_block, self.fraction, block_elems)


def chunk_layout(chunk_block: np.ndarray, fraction: np.ndarray, block_elems: np.ndarray) -> Layout:
    """Cut every block at ``rint(E_b · cumulative fraction)``; chunks of a block in id order.

    Fractions are renormalized per block (the validator allows a 1e-9 slack), so the
    last chunk of a block always ends exactly at ``E_b``.
    """
    block_elems = np.asarray(block_elems, dtype=np.int64)
    order = np.lexsort((np.arange(len(chunk_block)), chunk_block))
    blocks = chunk_block[order]
    totals = np.bincount(chunk_block, weights=fraction, minlength=len(block_elems))
    cumulative = np.empty(len(order), dtype=np.float64)
    running: dict[int, float] = {}
    for position, chunk in enumerate(order):
        block = int(blocks[position])
        running[block] = running.get(block, 0.0) + float(fraction[chunk])
        cumulative[position] = running[block] / totals[block]
    ends = np.rint(cumulative * block_elems[blocks]).astype(np.int64)
    last_of_block = np.ones(len(order), dtype=bool)
    last_of_block[:-1] = blocks[1:] != blocks[:-1]
    ends[last_of_block] = block_elems[blocks[last_of_block]]
    starts = np.empty_like(ends)
    starts[0:1] = 0
    starts[1:] = np.where(last_of_block[:-1], 0, ends[:-1])
    offset = np.empty(len(order), dtype=np.int64)
    length = np.empty(len(order), dtype=np.int64)
    offset[order] = starts
    length[order] = np.maximum(ends - starts, 0)
    return Layout(offset, length)


def build_plan(schedule: Schedule, rank: int) -> RankPlan:
    """Lower a validated schedule to ``rank``'s operations (see module docstring)."""
    n = schedule.n_ranks
    if not 0 <= rank < n:
        raise InvalidSchedule(f"rank {rank} is not one of the schedule's {n} ranks")
    transfers = schedule.transfers
    kind = schedule.collective
    canonical = np.lexsort((np.arange(len(transfers)), transfers.step))
    sender, receiver = transfers.sender, transfers.receiver
    # per ordered pair ordinal, in canonical (step, transfer id) order: equal on both ends
    pair_key = sender[canonical].astype(np.int64) * n + receiver[canonical]
    ordinal = np.empty(len(transfers), dtype=np.int64)
    seen: dict[int, int] = {}
    for position, transfer in enumerate(canonical):
        key = int(pair_key[position])
        ordinal[transfer] = seen.get(key, 0)
        seen[key] = ordinal[transfer] + 1
    mine = [int(t) for t in canonical if sender[t] == rank or receiver[t] == rank]
    ops: list[Op] = []
    by_chunk: dict[int, list[int]] = {}
    for index, transfer in enumerate(mine):
        chunk = int(transfers.chunk[transfer])
        step = int(transfers.step[transfer])
        is_send = bool(sender[transfer] == rank)
        op = TransferOp(int(transfers.op[transfer]))
        earlier = by_chunk.setdefault(chunk, [])
        deps: list[int] = []
        apply_deps: list[int] = []
        for prior in earlier:
            previous = ops[prior]
            if is_send:
                if not previous.is_send and previous.step < step:
                    deps.append(prior)  # forward only what has arrived (and been added)
            elif op is TransferOp.REDUCE:
                if previous.is_send and previous.step <= step:
                    apply_deps.append(prior)  # do not change a partial sum a send still reads
                elif not previous.is_send:
                    apply_deps.append(prior)  # add contributions in canonical order
            elif (previous.is_send and previous.step <= step) or (not previous.is_send and previous.step < step):
                deps.append(prior)  # a copy overwrites the chunk: reads and writes before it finish first
        peer = int(receiver[transfer] if is_send else sender[transfer])
        ops.append(Op(index, is_send, transfer, chunk, peer, step, op, int(ordinal[transfer]),
                      tuple(deps), tuple(apply_deps)))
        earlier.append(index)
    step_groups: dict[int, list[int]] = {}
    for op_ in ops:
        step_groups.setdefault(op_.step, []).append(op_.index)
    chunks = schedule.chunks
    relayed: list[int] = []
    if kind is Collective.ALLTOALL:
        relayed = sorted({o.chunk for o in ops if chunks.source[o.chunk] != rank and chunks.destination[o.chunk] != rank})
        relays_anywhere = bool(np.any((sender != chunks.source[transfers.chunk])
                                      | (receiver != chunks.destination[transfers.chunk])))
    else:
        relays_anywhere = True
    return RankPlan(kind, n, rank, schedule.meta.version, schedule.block_of_chunks(), chunks.fraction.copy(),
                    chunks.source.copy(), chunks.destination.copy(), tuple(ops),
                    tuple(tuple(step_groups[s]) for s in sorted(step_groups)), tuple(relayed), relays_anywhere,
                    schedule.transfers.n_steps, raw_contributions=_raw_contributions(schedule))


def _raw_contributions(schedule: Schedule) -> bool:
    """A ReduceScatter whose every transfer leaves a rank that has not received that chunk before (so
    it carries that rank's own contribution, unsummed). The same answer on every rank: it reads the
    whole schedule."""
    if schedule.collective is not Collective.REDUCESCATTER:
        return False
    transfers = schedule.transfers
    first_received: dict[tuple[int, int], int] = {}
    for receiver, chunk, step in zip(transfers.receiver.tolist(), transfers.chunk.tolist(), transfers.step.tolist(),
                                     strict=True):
        key = (receiver, chunk)
        first_received[key] = min(step, first_received.get(key, step))
    return all(first_received.get((sender, chunk), step) >= step for sender, chunk, step in
               zip(transfers.sender.tolist(), transfers.chunk.tolist(), transfers.step.tolist(), strict=True))


def slice_plan(plan: RankPlan, slices: int) -> RankPlan:
    """``plan`` with every chunk moved as ``slices`` slices that follow each other down its path.

    How the executor pipelines a schedule over a large buffer (the rule that picks
    ``slices`` is :func:`mccl.schedule.slicing.slice_count`; the simulator models the same,
    :mod:`mccl.sim.compiled`). Operation ``o`` becomes ``o``'s slices ``j = 0 … slices-1``:

    * slice ``j`` waits for slice ``j`` of everything ``o`` waited for (a relay forwards
      slice ``j`` once slice ``j`` has arrived, not the whole chunk); every (chunk, peer) is
      a stream whose slices are posted in order (the eager driver queues per stream), so a
      transport that keeps a connection's order sends them one after another, and streams
      do not wait for each other (no slice waits for the previous one to complete: that would
      only add a round trip per slice, and it hides the link from the telemetry's
      "N sends in flight" windows, §5.1);
    * it runs at step ``step + j`` (a software pipeline: a driver that waits per step,
      :mod:`.drivers.stepwise`, moves one slice of every tree level per step);
    * its tag is ``tag · slices + j``, equal on both ends; operations are ordered by
      (new step, unsliced order, slice), the same per peer pair on both ends.

    Chunk ids do not change (a slice is a part of its chunk's span, :func:`slice_spans`).
    """
    if slices < 1:
        raise InvalidSchedule(f"slices must be >= 1, got {slices}")
    if slices == 1 or plan.slices != 1:
        if plan.slices not in (1, slices):
            raise InvalidSchedule(f"plan is already cut into {plan.slices} slices")
        return plan
    old = plan.ops
    keys = sorted((op.step + j, op.index, j) for op in old for j in range(slices))
    new_index = {(o, j): i for i, (_, o, j) in enumerate(keys)}
    ops = []
    for i, (step, o, j) in enumerate(keys):
        op = old[o]
        deps = [new_index[(d, j)] for d in op.deps]
        ops.append(Op(i, op.is_send, op.transfer, op.chunk, op.peer, step, op.op, op.tag * slices + j, tuple(deps),
                      tuple(new_index[(d, j)] for d in op.apply_deps), j))
    groups: dict[int, list[int]] = {}
    for op_ in ops:
        groups.setdefault(op_.step, []).append(op_.index)
    return RankPlan(plan.collective, plan.n_ranks, plan.rank, plan.version, plan.chunk_block, plan.fraction,
                    plan.chunk_source, plan.chunk_destination, tuple(ops),
                    tuple(tuple(groups[s]) for s in sorted(groups)), plan.relayed_chunks, plan.has_relays,
                    plan.n_steps + slices - 1, slices, tuple(o for _, o, _ in keys), plan.raw_contributions)


def slice_spans(plan: RankPlan, spans: list[tuple[int, int, int] | None]) -> list[tuple[int, int, int] | None]:
    """The (tensor, start, length) of every operation of a sliced ``plan``, from its unsliced operations'
    ``spans``: slice j of a chunk of ``L`` elements is ``[rint(L·j/k), rint(L·(j+1)/k))``, the same cut on
    every rank; an empty slice (``L < k``) is None, as an empty chunk is."""
    k = plan.slices
    out: list[tuple[int, int, int] | None] = []
    for op, origin in zip(plan.ops, plan.origin, strict=True):
        span = spans[origin]
        if span is None:
            out.append(None)
            continue
        index, start, length = span
        lo = int(np.rint(length * op.part / k))
        hi = int(np.rint(length * (op.part + 1) / k))
        out.append((index, start + lo, hi - lo) if hi > lo else None)
    return out
