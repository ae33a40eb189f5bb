"""The executor: one collective of a :class:`RankPlan` on a :class:`Transport` (mccl-paper §3.3).

Buffers (see :mod:`buffers`): every chunk a rank touches lives in one region of one
tensor; senders read, receivers write these regions; a relay forwards from where it
received. Reducing receives land in a private buffer and are added in canonical
order, so a sum is the same on every run.

Drivers. ``_run_stepwise`` issues one group per step (receives first) and waits per
step: NCCL and gloo both run it. ``_run_eager`` (gloo, see :mod:`transport`) posts
every operation as soon as the operations it depends on have finished, so chunk
``k + 1`` is in flight while chunk ``k`` is forwarded: several trees or paths and
several chunks of one path are in flight at once (pipelining across chunks).
``_run_exchange`` (gloo) moves each step as one gloo alltoallv.
"""

from __future__ import annotations

import torch
from torch._C._distributed_c10d import AllToAllOptions

from mccl.errors import MCCLError
from mccl.runtime.buffers import (
    REDUCERS,
    Buffers,
    all_gather_buffers,
    all_reduce_buffers,
    all_to_all_buffers,
    even_blocks,
    reduce_scatter_buffers,
)
from mccl.runtime.plan import RankPlan
from mccl.runtime.telemetry import Meters
from mccl.runtime.transport import P2P, TAG_SPAN, Transport
from mccl.schedule import Collective, TransferOp

__all__ = ["Buffers", "execute", "default_driver", "all_gather_buffers", "all_to_all_buffers",
           "reduce_scatter_buffers", "all_reduce_buffers", "even_blocks", "REDUCERS"]

def execute(transport: Transport, plan: RankPlan, buffers: Buffers, *, seq: int = 0,
            meters: Meters | None = None, layout_cache: dict | None = None, driver: str | None = None) -> None:
    """Run ``plan`` once over ``buffers``; blocks until this rank's part is done.

    ``driver``: ``"eager"``, ``"exchange"`` (gloo only) or ``"stepwise"``; default:
    :func:`default_driver`.
    """
    if plan.n_ranks != transport.size:
        raise MCCLError(f"the schedule has {plan.n_ranks} ranks, the transport group {transport.size}")
    views, spans = regions(plan, buffers, layout_cache)
    tag_base = (seq % 1024) * TAG_SPAN
    temps: dict[int, torch.Tensor] = {}
    chosen = driver or default_driver(transport, plan)
    if chosen in ("eager", "exchange") and not transport.dependency_driven:
        raise MCCLError(f"the {chosen} driver needs a gloo transport")
    if chosen == "exchange":
        _run_exchange(transport, plan, views, spans, buffers, meters)
    elif chosen in ("eager", "stepwise"):
        for op in plan.ops:
            if views[op.index] is not None and not op.is_send and op.op is TransferOp.REDUCE:
                temps[op.index] = torch.empty_like(views[op.index])
        runner = _run_eager if chosen == "eager" else _run_stepwise
        runner(transport, plan, views, temps, buffers.reducer, tag_base, meters)
    else:
        raise MCCLError(f"unknown driver {chosen!r}: eager, exchange (gloo) or stepwise")
    if buffers.finish is not None:
        buffers.finish()


def regions(plan: RankPlan, buffers: Buffers, layout_cache: dict | None = None) -> tuple[list, list]:
    """Every operation's tensor view and (tensor, start, length) span; None for empty chunks.

    This, with building the :class:`Buffers`, is the executor's Python work per call
    before the first operation is issued (benchmarks/runtime.py measures it)."""
    key = buffers.block_elems.tobytes()
    layout = layout_cache.get(key) if layout_cache is not None else None
    if layout is None:
        layout = plan.layout(buffers.block_elems)
        if layout_cache is not None:
            if len(layout_cache) > 64:
                layout_cache.clear()
            layout_cache[key] = layout
    views: list[torch.Tensor | None] = []
    spans: list[tuple[torch.Tensor, int, int] | None] = []
    for op in plan.ops:
        length = int(layout.length[op.chunk])
        if length == 0:
            views.append(None)
            spans.append(None)
            continue
        tensor, base = buffers.region(op.chunk, layout)
        start = base + int(layout.offset[op.chunk])
        if start + length > tensor.numel():
            raise MCCLError(f"chunk {op.chunk} ends at element {start + length}, beyond the {tensor.numel()} "
                            "elements of its buffer")
        views.append(tensor[start:start + length])
        spans.append((tensor, start, length))
    return views, spans


def default_driver(transport: Transport, plan: RankPlan) -> str:
    """NCCL: stepwise. gloo: exchange for AllToAll (a step is one gloo alltoallv, all waits in C++;
    individual gloo sends measured 1.5–2× slower than gloo's own alltoall), eager otherwise
    (forwarding chunk by chunk pipelines rings and trees)."""
    if not transport.dependency_driven:
        return "stepwise"
    return "exchange" if plan.collective is Collective.ALLTOALL else "eager"


def _run_exchange(transport, plan, views, spans, buffers: Buffers, meters) -> None:
    """gloo only: every step of the schedule is one ``alltoall_base`` with split sizes (zero for peers
    without transfers in that step); every rank takes part in every step. A step's data to a peer is
    the concatenation of its chunks in the plan's per-pair order, so both ends agree. When a step's
    chunks already lie back to back in one tensor in peer order around this rank's own block
    (direct AllToAll), gloo reads and writes them in place; otherwise they are packed into and
    unpacked from staging buffers."""
    n, rank = plan.n_ranks, plan.rank
    by_step: dict[int, list] = {}
    for op in plan.ops:
        if views[op.index] is not None:
            by_step.setdefault(op.step, []).append(op)
    template = buffers.template
    for step in range(plan.n_steps):
        ops = sorted(by_step.get(step, []), key=lambda o: (o.peer, o.index))
        sends = [o for o in ops if o.is_send]
        recvs = [o for o in ops if not o.is_send]
        in_split, out_split = [0] * n, [0] * n
        for o in sends:
            in_split[o.peer] += spans[o.index][2]
        for o in recvs:
            out_split[o.peer] += spans[o.index][2]
        inp = out = None
        if buffers.self_segments is not None and sends and recvs:
            inp = _in_place(sends, spans, rank, buffers.self_segments[0], in_split)
            out = _in_place(recvs, spans, rank, buffers.self_segments[1], out_split)
        packed = inp is None or out is None
        if packed:
            inp = torch.cat([views[o.index] for o in sends]) if sends else template.new_empty(0)
            out = template.new_empty(sum(out_split))
        else:
            in_split[rank] = out_split[rank] = buffers.self_segments[0][2]
        if meters is not None:
            for o in sends:
                meters.posted(o.peer, views[o.index].numel() * views[o.index].element_size())
        transport.group.alltoall_base(out, inp, out_split, in_split, AllToAllOptions()).wait()
        if meters is not None:
            for o in sends:
                meters.completed(o.peer, views[o.index].numel() * views[o.index].element_size())
        if not packed:
            continue
        position = 0
        for o in recvs:  # peers ascending, each peer's chunks in the plan's order: the sender's packing order
            length = spans[o.index][2]
            incoming = out[position:position + length]
            if o.op is TransferOp.REDUCE:
                buffers.reducer(views[o.index], incoming)
            else:
                views[o.index].copy_(incoming)
            position += length


def _in_place(ops, spans, rank, own, split) -> torch.Tensor | None:
    """One view covering the ops' regions in peer order with this rank's own block in its place, or None."""
    if any(o.op is TransferOp.REDUCE for o in ops) or any(split[p] == 0 for p in range(len(split)) if p != rank):
        return None
    own_tensor = own[0]
    segments = [spans[o.index] for o in ops if o.peer < rank] + [own] + [spans[o.index] for o in ops if o.peer > rank]
    start = segments[0][1]
    end = start
    for tensor, segment_start, length in segments:
        if tensor is not own_tensor or segment_start != end:
            return None
        end = segment_start + length
    return own_tensor[start:end]


def _p2p(op, views, temps, tag_base: int) -> P2P:
    tensor = temps.get(op.index, views[op.index])
    return P2P(op.is_send, tensor, op.peer, tag_base + op.tag % TAG_SPAN)


def _run_stepwise(transport, plan, views, temps, reducer, tag_base, meters) -> None:
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
        for work in works:
            work.wait()
        if meters is not None:
            for op in live:
                if op.is_send:
                    meters.completed(op.peer, views[op.index].numel() * views[op.index].element_size())
        for op in live:
            if op.index in temps:
                reducer(views[op.index], temps[op.index])


def _run_eager(transport, plan, views, temps, reducer, tag_base, meters) -> None:
    ops = plan.ops
    count = len(ops)
    done = [views[i] is None for i in range(count)]  # empty chunks are done before they start
    applied = list(done)
    posted = list(done)
    works: dict[int, object] = {}
    waiting_deps = [sum(1 for d in op.deps if not done[d]) for op in ops]
    dependents: list[list[int]] = [[] for _ in range(count)]
    for op in ops:
        for d in op.deps:
            dependents[d].append(op.index)
    # a peer's operations are issued in the plan's order (NCCL's rule; gloo also matches tags)
    queues: dict[tuple[bool, int], list[int]] = {}
    for op in ops:
        queues.setdefault((op.is_send, op.peer), []).append(op.index)
    heads = dict.fromkeys(queues, 0)
    nbytes = [0 if v is None else v.numel() * v.element_size() for v in views]
    remaining = count - sum(done)
    pending_apply: list[int] = []
    touched: set[tuple[bool, int]] = set(queues)

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

    while True:
        # receives before sends; peers staggered by distance so that ranks do not all start on rank 0
        for key in sorted(touched, key=lambda k: (k[0], (k[1] - plan.rank) % plan.n_ranks)):
            post_ready(key)
        touched.clear()
        if remaining == 0:
            break
        candidates = [i for i in works if not done[i]]
        if not candidates:
            raise MCCLError("the executor stalled: operations wait on each other (a schedule this rank cannot run)")
        first = min(candidates, key=lambda i: (ops[i].step, ops[i].is_send, i))
        works[first].wait()  # no timeout: an expired wait breaks a gloo group for good
        for index in candidates:
            if index == first or works[index].is_completed():
                complete(index)
        apply_ready()
    apply_ready()
    if pending_apply:
        raise MCCLError("the executor ended with partial sums not added (inconsistent plan)")
