"""The executor's drivers: how one rank issues and waits for its operations (mccl-paper §3.3).

``run_stepwise`` issues one group per step (receives first) and waits per step: NCCL
and gloo both run it. ``run_eager`` (gloo, see :mod:`transport`) posts every operation
as soon as the operations it depends on have finished, so chunk ``k + 1`` is in flight
while chunk ``k`` is forwarded: several trees or paths and several chunks of one path
are in flight at once (pipelining across chunks). ``run_exchange`` (gloo) moves each
step as one gloo alltoallv.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from mccl.errors import MCCLError
from mccl.runtime.binding import Bound, copy_own_block
from mccl.runtime.buffers import Buffers
from mccl.runtime.plan import RankPlan
from mccl.runtime.transport import P2P, TAG_SPAN, wait
from mccl.schedule import TransferOp

__all__ = ["ExchangeStep", "EagerTables", "run_exchange", "run_stepwise", "run_eager"]


@dataclass(frozen=True, eq=False)
class ExchangeStep:
    """One step of the exchange driver: one gloo alltoallv.

    In place (``packed`` False): ``send_region``/``recv_region`` are (tensor index, start,
    end) covering the step's chunks in peer order around this rank's own block. Packed:
    the sends are concatenated, the receives unpacked, in (peer, operation) order.
    """

    sends: tuple[int, ...]
    recvs: tuple[int, ...]
    in_split: list[int]
    out_split: list[int]
    packed: bool
    send_region: tuple[int, int, int] | None = None
    recv_region: tuple[int, int, int] | None = None


def _exchange_program(plan: RankPlan, bound: Bound, buffers: Buffers) -> list[ExchangeStep]:
    """The exchange driver's steps: every step of the schedule is one ``alltoall_base`` with split
    sizes (zero for peers without transfers in that step); every rank takes part in every step. A
    step's data to a peer is the concatenation of its chunks in the plan's per-pair order, so both
    ends agree. When a step's chunks already lie back to back in one tensor in peer order around
    this rank's own block (direct AllToAll), gloo reads and writes them in place; otherwise they
    are packed into and unpacked from staging buffers."""
    n, rank = plan.n_ranks, plan.rank
    spans = bound.spans
    by_step: dict[int, list] = {}
    for op in plan.ops:
        if spans[op.index] is not None:
            by_step.setdefault(op.step, []).append(op)
    program = []
    for step in range(plan.n_steps):
        ops = sorted(by_step.get(step, []), key=lambda o: (o.peer, o.index))
        sends = [o for o in ops if o.is_send]
        recvs = [o for o in ops if not o.is_send]
        in_split, out_split = [0] * n, [0] * n
        for o in sends:
            in_split[o.peer] += spans[o.index][2]
        for o in recvs:
            out_split[o.peer] += spans[o.index][2]
        send_region = recv_region = None
        if buffers.self_segments is not None and sends and recvs:
            send_region = _in_place(sends, spans, rank, buffers.self_segments[0], in_split)
            recv_region = _in_place(recvs, spans, rank, buffers.self_segments[1], out_split)
        packed = send_region is None or recv_region is None
        if not packed:
            in_split[rank] = out_split[rank] = buffers.self_segments[0][2]
        program.append(ExchangeStep(tuple(o.index for o in sends), tuple(o.index for o in recvs), in_split, out_split,
                                    packed, send_region, recv_region))
    return program


def run_exchange(transport, plan, bound: Bound, tensors, buffers: Buffers, meters) -> None:
    """gloo only: runs :func:`_exchange_program` (built once per block sizes). An in-place step
    also carries this rank's own block (gloo copies it), otherwise it is copied here."""
    if bound.exchange is None:
        bound.exchange = _exchange_program(plan, bound, buffers)
    if all(step.packed for step in bound.exchange):
        copy_own_block(buffers, tensors)
    spans, ops = bound.spans, plan.ops
    itemsize = buffers.template.element_size()
    for step in bound.exchange:
        if step.packed:
            inp = (torch.cat([_view(tensors, spans[i]) for i in step.sends]) if step.sends
                   else buffers.template.new_empty(0))
            out = buffers.template.new_empty(sum(step.out_split))
        else:
            inp, out = _whole_or_slice(tensors, step.send_region), _whole_or_slice(tensors, step.recv_region)
        if meters is not None:
            for i in step.sends:
                meters.posted(ops[i].peer, spans[i][2] * itemsize)
        transport.native_all_to_all(out, inp, step.out_split, step.in_split)
        if meters is not None:
            for i in step.sends:
                meters.completed(ops[i].peer, spans[i][2] * itemsize)
        if not step.packed:
            continue
        position = 0
        for i in step.recvs:  # peers ascending, each peer's chunks in the plan's order: the sender's packing order
            length = spans[i][2]
            incoming = out[position:position + length]
            if ops[i].op is TransferOp.REDUCE:
                buffers.reducer(_view(tensors, spans[i]), incoming)
            else:
                _view(tensors, spans[i]).copy_(incoming)
            position += length


def _whole_or_slice(tensors, region: tuple[int, int, int]) -> torch.Tensor:
    tensor = tensors[region[0]]
    return tensor if region[1] == 0 and region[2] == tensor.numel() else tensor[region[1]:region[2]]


def _view(tensors, span: tuple[int, int, int]) -> torch.Tensor:
    return tensors[span[0]][span[1]:span[1] + span[2]]


def _in_place(ops, spans, rank, own, split) -> tuple[int, int, int] | None:
    """(tensor index, start, end) of one region covering the ops' spans in peer order with this rank's
    own block in its place, or None."""
    if any(o.op is TransferOp.REDUCE for o in ops) or any(split[p] == 0 for p in range(len(split)) if p != rank):
        return None
    segments = [spans[o.index] for o in ops if o.peer < rank] + [own] + [spans[o.index] for o in ops if o.peer > rank]
    own_index = own[0]
    start = end = segments[0][1]
    for index, segment_start, length in segments:
        if index != own_index or segment_start != end:
            return None
        end = segment_start + length
    return own_index, start, end


def _p2p(op, views, temps, tag_base: int) -> P2P:
    tensor = temps.get(op.index, views[op.index])
    return P2P(op.is_send, tensor, op.peer, tag_base + op.tag % TAG_SPAN)


def run_stepwise(transport, plan, views, temps, reducer, tag_base, meters) -> None:
    for step_ops in plan.steps:
        live = [plan.ops[i] for i in step_ops if views[i] is not None]
        if not live:
            continue
        if meters is not None:
            for op in live:
                if op.is_send:
                    meters.posted(op.peer, views[op.index].numel() * views[op.index].element_size())
        live.sort(key=lambda op: ((op.peer - plan.rank) % plan.n_ranks, op.index))  # stagger, keep per-peer order
        works = transport.post_group([_p2p(op, views, temps, tag_base) for op in live])
        issued = [op for op in live if not op.is_send] + [op for op in live if op.is_send]  # post_group's order
        for position, work in enumerate(works):
            wait(work, issued[position].peer if len(works) == len(issued) else None)  # NCCL: one coalesced work
        if meters is not None:
            for op in live:
                if op.is_send:
                    meters.completed(op.peer, views[op.index].numel() * views[op.index].element_size())
        for op in live:
            if op.index in temps:
                reducer(views[op.index], temps[op.index])


@dataclass(frozen=True, eq=False)
class EagerTables:
    """The eager driver's bookkeeping that depends only on the plan and which chunks are empty
    (cached in :class:`Bound`): who waits on whom, the per-peer issue queues, and which operations
    must be polled after every wait because their completion lets another one start."""

    dependents: tuple[tuple[int, ...], ...]
    waiting: tuple[int, ...]  # not-yet-done dependencies of every operation at the start
    queues: dict[tuple[bool, int], tuple[int, ...]]
    queue_order: dict[tuple[bool, int], tuple[bool, int]]  # receives first, peers staggered by distance
    unlocks: tuple[bool, ...]


def _eager_tables(plan: RankPlan, empty: list[bool]) -> EagerTables:
    ops = plan.ops
    dependents: list[list[int]] = [[] for _ in ops]
    for op in ops:
        for d in op.deps:
            dependents[d].append(op.index)
    in_apply = {d for op in ops for d in op.apply_deps}
    queues: dict[tuple[bool, int], list[int]] = {}
    for op in ops:
        queues.setdefault((op.is_send, op.peer), []).append(op.index)
    return EagerTables(
        dependents=tuple(tuple(items) for items in dependents),
        waiting=tuple(sum(1 for d in op.deps if not empty[d]) for op in ops),
        queues={key: tuple(items) for key, items in queues.items()},
        queue_order={key: (key[0], (key[1] - plan.rank) % plan.n_ranks) for key in queues},
        unlocks=tuple(bool(dependents[op.index]) or op.index in in_apply or
                      (not op.is_send and op.op is TransferOp.REDUCE) for op in ops),
    )


def run_eager(transport, plan, views, temps, reducer, tag_base, meters, bound: Bound) -> None:
    """Post every operation as soon as its dependencies are done; wait on the earliest posted one
    (by step), then poll the posted operations whose completion unlocks others (O(watched) per wait;
    the rest are found done when their turn to be waited on comes, which then returns at once)."""
    ops = plan.ops
    count = len(ops)
    done = [views[i] is None for i in range(count)]  # empty chunks are done before they start
    if bound.eager is None:
        bound.eager = _eager_tables(plan, done)
    tables = bound.eager
    applied = list(done)
    posted = list(done)
    works: list[object] = [None] * count
    waiting_deps = list(tables.waiting)
    dependents, queues, unlocks = tables.dependents, tables.queues, tables.unlocks
    heads = dict.fromkeys(queues, 0)
    nbytes = [0 if v is None else v.numel() * v.element_size() for v in views]
    remaining = count - sum(done)
    pending_apply: list[int] = []
    touched: set[tuple[bool, int]] = set(queues)
    heap: list[tuple[int, bool, int]] = []  # posted operations by (step, receives first, index)
    watched: set[int] = set()

    def post_ready(key: tuple[bool, int]) -> None:
        queue, position = queues[key], heads[key]
        while position < len(queue):
            index = queue[position]
            if not posted[index]:
                if waiting_deps[index]:
                    break
                op = ops[index]
                if op.is_send and meters is not None:
                    meters.posted(op.peer, nbytes[index])
                works[index] = transport.post(_p2p(op, views, temps, tag_base))
                posted[index] = True
                heapq.heappush(heap, (op.step, op.is_send, index))
                if unlocks[index] or (op.is_send and meters is not None):
                    watched.add(index)
            position += 1
        heads[key] = position

    def release(index: int) -> None:
        for dependent in dependents[index]:
            waiting_deps[dependent] -= 1
            if waiting_deps[dependent] == 0:
                touched.add((ops[dependent].is_send, ops[dependent].peer))

    def complete(index: int) -> None:
        nonlocal remaining
        done[index] = True
        remaining -= 1
        watched.discard(index)
        if ops[index].is_send and meters is not None:  # a paced send knows when it really completed
            meters.completed(ops[index].peer, nbytes[index], getattr(works[index], "completed_at", None))
        if index in temps:
            pending_apply.append(index)  # a partial sum counts once it is added in
        else:
            applied[index] = True
            release(index)

    def apply_ready() -> None:
        progress = True
        while progress and pending_apply:
            progress = False
            for index in list(pending_apply):
                if all(done[d] and applied[d] for d in ops[index].apply_deps):
                    reducer(views[index], temps[index])
                    applied[index] = True
                    pending_apply.remove(index)
                    release(index)
                    progress = True

    order = tables.queue_order
    while True:
        for key in sorted(touched, key=order.__getitem__):
            post_ready(key)
        touched.clear()
        if remaining == 0:
            break
        while heap and done[heap[0][2]]:
            heapq.heappop(heap)
        if not heap:
            raise MCCLError("the executor stalled: operations wait on each other (a schedule this rank cannot run)")
        first = heapq.heappop(heap)[2]
        wait(works[first], ops[first].peer)
        complete(first)
        for index in [i for i in watched if works[i].is_completed()]:
            complete(index)
        apply_ready()
    apply_ready()
    if pending_apply:
        raise MCCLError("the executor ended with partial sums not added (inconsistent plan)")
