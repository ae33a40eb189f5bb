"""The exchange driver (gloo): every step of the schedule is one gloo alltoallv.

Individual gloo sends measured 1.5–2× slower than gloo's own alltoall, and an
alltoallv does all its waiting in C++; the default for AllToAll on gloo (see
:func:`mccl.runtime.executor.default_driver`). Every rank takes part in every step,
with split sizes of zero for peers it exchanges nothing with in that step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mccl.runtime.binding import Bound, copy_own_block
from mccl.runtime.buffers import Buffers
from mccl.runtime.plan import Op, RankPlan
from mccl.runtime.telemetry import Meters
from mccl.runtime.transport import Transport
from mccl.schedule import TransferOp

__all__ = ["ExchangeDriver", "ExchangeProgram", "ExchangeStep"]

Span = tuple[int, int, int]  # (tensor index, start, length or end)


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
    send_region: Span | None = None
    recv_region: Span | None = None


@dataclass(frozen=True, eq=False)
class ExchangeProgram:
    """The steps, and what a call needs of the plan: the operations and their spans.
    ``copy_own``: every step is packed, so this rank's own block is copied here (an in-place
    step carries it through gloo, which copies it)."""

    steps: tuple[ExchangeStep, ...]
    ops: tuple[Op, ...]
    spans: list[Span | None]
    copy_own: bool


class ExchangeDriver:
    """See module docstring; implements :class:`~mccl.runtime.drivers.base.Driver`."""

    name = "exchange"
    gloo_only = True

    def prepare(self, plan: RankPlan, bound: Bound, buffers: Buffers) -> ExchangeProgram:
        """A step's data to a peer is the concatenation of its chunks in the plan's per-pair order,
        so both ends agree. When a step's chunks already lie back to back in one tensor in peer
        order around this rank's own block (direct AllToAll), gloo reads and writes them in place;
        otherwise they are packed into and unpacked from staging buffers."""
        n, rank = plan.n_ranks, plan.rank
        spans = bound.spans
        by_step: dict[int, list[Op]] = {}
        for op in plan.ops:
            if spans[op.index] is not None:
                by_step.setdefault(op.step, []).append(op)
        steps = []
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
            steps.append(ExchangeStep(tuple(o.index for o in sends), tuple(o.index for o in recvs), in_split,
                                      out_split, packed, send_region, recv_region))
        return ExchangeProgram(tuple(steps), plan.ops, spans, all(step.packed for step in steps))

    def run(self, program: ExchangeProgram, transport: Transport, tensors: list[torch.Tensor], buffers: Buffers, *,
            seq: int, meters: Meters | None) -> None:
        if program.copy_own:
            copy_own_block(buffers, tensors)
        spans, ops, template = program.spans, program.ops, buffers.template
        itemsize = template.element_size()
        for step in program.steps:
            if step.packed:
                inp = torch.cat([_view(tensors, spans[i]) for i in step.sends]) if step.sends else template.new_empty(0)
                out = template.new_empty(sum(step.out_split))
            else:
                inp, out = _whole_or_slice(tensors, step.send_region), _whole_or_slice(tensors, step.recv_region)
            if meters is not None:  # receive-side telemetry; one alltoallv: no arrival times
                for i in step.recvs:
                    meters.posted(ops[i].peer, spans[i][2] * itemsize)
            transport.native_all_to_all(out, inp, step.out_split, step.in_split)
            if meters is not None:
                for i in step.recvs:
                    meters.completed(ops[i].peer, spans[i][2] * itemsize)
            if step.packed:
                _unpack(out, step.recvs, ops, spans, tensors, buffers)


def _unpack(out: torch.Tensor, recvs: tuple[int, ...], ops: tuple[Op, ...], spans: list[Span | None],
            tensors: list[torch.Tensor], buffers: Buffers) -> None:
    """Peers ascending, each peer's chunks in the plan's order: the sender's packing order."""
    position = 0
    for i in recvs:
        length = spans[i][2]
        incoming = out[position:position + length]
        if ops[i].op is TransferOp.REDUCE:
            buffers.reducer(_view(tensors, spans[i]), incoming, ops[i].peer)
        else:
            _view(tensors, spans[i]).copy_(incoming)
        position += length


def _whole_or_slice(tensors: list[torch.Tensor], region: Span) -> torch.Tensor:
    tensor = tensors[region[0]]
    return tensor if region[1] == 0 and region[2] == tensor.numel() else tensor[region[1]:region[2]]


def _view(tensors: list[torch.Tensor], span: Span) -> torch.Tensor:
    return tensors[span[0]][span[1]:span[1] + span[2]]


def _in_place(ops: list[Op], spans: list[Span | None], rank: int, own: Span, split: list[int]) -> Span | None:
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
