"""The executor: one collective of a :class:`RankPlan` on a :class:`Transport` (mccl-paper §3.3).

Buffers. Every chunk a rank touches lives in exactly one region of one tensor:
AllGather, the output (the rank's own input is copied into its block first);
AllToAll, the input at its source, the output at its destination, a scratch buffer
at a relay; ReduceScatter and AllReduce, a work copy holding the partial sums
(reducing receives land in a private buffer and are added in canonical order, so the
sum is the same on every run). Senders read, receivers write these regions; a relay
forwards from where it received.

Drivers. ``_run_stepwise`` issues one group per step (receives first) and waits per
step: NCCL and gloo both run it. ``_run_eager`` (gloo, see :mod:`transport`) posts
every operation as soon as the operations it depends on have finished, so chunk
``k + 1`` is in flight while chunk ``k`` is forwarded: several trees or paths and
several chunks of one path are in flight at once (pipelining across chunks).

Sizes are checked before anything is issued: on gloo a message larger than its
receive aborts the receiving process without a Python exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllToAllOptions

from mccl.errors import MCCLError
from mccl.runtime.plan import Layout, RankPlan
from mccl.runtime.telemetry import Meters
from mccl.runtime.transport import P2P, TAG_SPAN, Transport
from mccl.schedule import Collective, TransferOp

__all__ = ["Buffers", "execute", "all_gather_buffers", "all_to_all_buffers", "reduce_scatter_buffers",
           "all_reduce_buffers", "even_blocks", "REDUCERS"]

Reducer = Callable[[torch.Tensor, torch.Tensor], None]

REDUCERS: dict[object, Reducer] = {
    dist.ReduceOp.SUM: lambda acc, incoming: acc.add_(incoming),
    dist.ReduceOp.PRODUCT: lambda acc, incoming: acc.mul_(incoming),
    dist.ReduceOp.MIN: lambda acc, incoming: torch.minimum(acc, incoming, out=acc),
    dist.ReduceOp.MAX: lambda acc, incoming: torch.maximum(acc, incoming, out=acc),
}


@dataclass
class Buffers:
    """Where the chunks of one call live on this rank.

    ``block_elems[b]``: elements of block b; ``region(chunk)``: (tensor, element offset
    of the chunk's block in it). ``finish`` runs after the last operation (copy out).
    """

    block_elems: np.ndarray
    region: Callable[[int, Layout], tuple[torch.Tensor, int]]
    finish: Callable[[], None] | None = None
    reducer: Reducer | None = None
    template: torch.Tensor | None = None  # an empty tensor of the call's dtype and device
    # AllToAll: this rank's own block in the input and the output, (tensor, start, length)
    self_segments: tuple[tuple[torch.Tensor, int, int], tuple[torch.Tensor, int, int]] | None = None


def even_blocks(total: int, n: int) -> np.ndarray:
    """Split ``total`` elements into n blocks at ``rint(total · b / n)`` (AllReduce of any size)."""
    bounds = np.rint(np.arange(n + 1) * (total / n)).astype(np.int64)
    return np.diff(bounds)


def _flat(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise MCCLError(f"{name} must be contiguous")
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor.reshape(-1)


def all_gather_buffers(plan: RankPlan, output: torch.Tensor, input: torch.Tensor) -> Buffers:
    n, rank = plan.n_ranks, plan.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    if out.dtype != inp.dtype:
        raise MCCLError(f"all_gather: output dtype {out.dtype} differs from input dtype {inp.dtype}")
    per_rank = inp.numel()
    if out.numel() != n * per_rank:
        raise MCCLError(f"all_gather: the output has {out.numel()} elements; it must have {n} × {per_rank} "
                        f"(world size × input elements)")
    own = out[rank * per_rank:(rank + 1) * per_rank]
    if own.data_ptr() != inp.data_ptr():
        own.copy_(inp)
    source = plan.chunk_source
    return Buffers(np.full(n, per_rank, dtype=np.int64),
                   lambda chunk, _layout: (out, int(source[chunk]) * per_rank), template=out[:0])


def all_to_all_buffers(plan: RankPlan, output: torch.Tensor, input: torch.Tensor,
                       output_splits: Sequence[int] | None, input_splits: Sequence[int] | None,
                       split_matrix: Callable[[list[int]], np.ndarray] | None = None) -> Buffers:
    """``output_splits``/``input_splits`` in rows of dim 0, as torch's ``all_to_all_single``.

    Uneven splits on a schedule with relays need every rank's splits (a relay must
    know the size of what it forwards): ``split_matrix(my_input_splits)`` returns the
    n × n matrix of input splits in elements, gathered over the group.
    """
    n, rank = plan.n_ranks, plan.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    if out.dtype != inp.dtype:
        raise MCCLError(f"all_to_all: output dtype {out.dtype} differs from input dtype {inp.dtype}")
    rows_in, rows_out = (input.shape[0] if input.dim() else 1), (output.shape[0] if output.dim() else 1)
    row_in = inp.numel() // max(rows_in, 1)
    row_out = out.numel() // max(rows_out, 1)
    in_split = _splits(input_splits, rows_in, n, "input") * row_in
    out_split = _splits(output_splits, rows_out, n, "output") * row_out
    if row_in != row_out and inp.numel() and out.numel():
        raise MCCLError("all_to_all: input and output rows differ in size")
    in_offset = np.concatenate([[0], np.cumsum(in_split)])
    out_offset = np.concatenate([[0], np.cumsum(out_split)])
    if int(in_split[rank]) != int(out_split[rank]):
        raise MCCLError(f"all_to_all: rank {rank} sends itself {in_split[rank]} elements but expects {out_split[rank]}")
    out[out_offset[rank]:out_offset[rank + 1]].copy_(inp[in_offset[rank]:in_offset[rank + 1]])
    even = (input_splits is None or len(set(input_splits)) <= 1) and (output_splits is None or len(set(output_splits)) <= 1)
    if even or not plan.relayed_chunks and not plan.has_relays:
        matrix = np.zeros((n, n), dtype=np.int64)
        matrix[rank, :] = in_split
        matrix[:, rank] = out_split
        if even:
            matrix[:, :] = in_split[0] if n else 0
    else:
        if split_matrix is None:
            raise MCCLError("all_to_all with uneven splits on a schedule with relays needs the group's split sizes")
        matrix = split_matrix([int(v) for v in in_split])
        if not np.array_equal(matrix[:, rank], out_split):
            raise MCCLError(f"all_to_all: rank {rank} expects {out_split.tolist()} elements from the ranks, "
                            f"they send {matrix[:, rank].tolist()}")
    block_elems = matrix.reshape(-1).astype(np.int64)
    source, destination = plan.chunk_source, plan.chunk_destination
    scratch_state: dict[str, object] = {}

    def region(chunk: int, layout: Layout) -> tuple[torch.Tensor, int]:
        s, d = int(source[chunk]), int(destination[chunk])
        if s == rank:
            return inp, int(in_offset[d])
        if d == rank:
            return out, int(out_offset[s])
        if "offsets" not in scratch_state:
            relayed = list(plan.relayed_chunks)
            lengths = layout.length[relayed]
            starts = np.concatenate([[0], np.cumsum(lengths)])
            scratch_state["offsets"] = {c: int(starts[i]) - int(layout.offset[c]) for i, c in enumerate(relayed)}
            scratch_state["tensor"] = torch.empty(int(starts[-1]), dtype=inp.dtype, device=inp.device)
        return scratch_state["tensor"], scratch_state["offsets"][chunk]  # type: ignore[index,return-value]

    own = int(in_split[rank])
    return Buffers(block_elems, region, template=out[:0],
                   self_segments=((inp, int(in_offset[rank]), own), (out, int(out_offset[rank]), own)))


def _splits(splits: Sequence[int] | None, rows: int, n: int, name: str) -> np.ndarray:
    if splits is None or len(splits) == 0:
        if rows % n:
            raise MCCLError(f"all_to_all: the {name} has {rows} rows, not divisible by the world size {n}; "
                            f"pass {name}_split_sizes")
        return np.full(n, rows // n, dtype=np.int64)
    values = np.asarray(list(splits), dtype=np.int64)
    if len(values) != n or np.any(values < 0) or values.sum() != rows:
        raise MCCLError(f"all_to_all: {name}_split_sizes {list(splits)} must be {n} non-negative sizes "
                        f"summing to the {rows} rows of the {name}")
    return values


def reduce_scatter_buffers(plan: RankPlan, output: torch.Tensor, input: torch.Tensor, op: object) -> Buffers:
    n, rank = plan.n_ranks, plan.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    if out.dtype != inp.dtype:
        raise MCCLError(f"reduce_scatter: output dtype {out.dtype} differs from input dtype {inp.dtype}")
    per_rank = out.numel()
    if inp.numel() != n * per_rank:
        raise MCCLError(f"reduce_scatter: the input has {inp.numel()} elements; it must have {n} × {per_rank} "
                        f"(world size × output elements)")
    work = inp.clone()

    def finish() -> None:
        out.copy_(work[rank * per_rank:(rank + 1) * per_rank])

    return Buffers(np.full(n, per_rank, dtype=np.int64), lambda chunk, _layout: (work, int(plan.chunk_block[chunk]) * per_rank),
                   finish, _reducer(op), work[:0])


def all_reduce_buffers(plan: RankPlan, tensor: torch.Tensor, op: object) -> Buffers:
    flat = _flat(tensor, "tensor")
    blocks = even_blocks(flat.numel(), plan.n_ranks)
    starts = np.concatenate([[0], np.cumsum(blocks)])
    return Buffers(blocks, lambda chunk, _layout: (flat, int(starts[plan.chunk_block[chunk]])), None, _reducer(op),
                   flat[:0])


def _reducer(op: object) -> Reducer:
    reducer = REDUCERS.get(op)
    if reducer is None:
        raise MCCLError(f"reduction {op} is not supported by the mccl executor (SUM, PRODUCT, MIN, MAX are)")
    return reducer


def execute(transport: Transport, plan: RankPlan, buffers: Buffers, *, seq: int = 0,
            meters: Meters | None = None, layout_cache: dict | None = None, driver: str | None = None) -> None:
    """Run ``plan`` once over ``buffers``; blocks until this rank's part is done.

    ``driver``: ``"eager"`` (gloo only) or ``"stepwise"``; default: eager where the
    transport is dependency-driven.
    """
    if plan.n_ranks != transport.size:
        raise MCCLError(f"the schedule has {plan.n_ranks} ranks, the transport group {transport.size}")
    key = buffers.block_elems.tobytes()
    layout = layout_cache.get(key) if layout_cache is not None else None
    if layout is None:
        layout = plan.layout(buffers.block_elems)
        if layout_cache is not None:
            if len(layout_cache) > 64:
                layout_cache.clear()
            layout_cache[key] = layout
    tag_base = (seq % 1024) * TAG_SPAN
    views: list[torch.Tensor | None] = []
    spans: list[tuple[torch.Tensor, int, int] | None] = []
    temps: dict[int, torch.Tensor] = {}
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
        view = tensor[start:start + length]
        views.append(view)
        spans.append((tensor, start, length))
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
        if ops[index].is_send and meters is not None:
            meters.completed(ops[index].peer, nbytes[index])
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
