"""The exchange driver (gloo): every step of the schedule is one gloo alltoallv.

Individual gloo sends measured 1.5–2× slower than gloo's own alltoall, and an
alltoallv does all its waiting in C++: the default on gloo for AllToAll and for every
plan without forwarding (see :func:`mccl.runtime.executor.default_driver`). Every rank
takes part in every step, with split sizes of zero for peers it exchanges nothing with
in that step.

gloo's alltoallv reads one tensor and writes one, each cut into consecutive per-rank
regions, and copies its own region across itself. So each side of a step is either
**in place** — its chunks already lie back to back, in peer order, in one tensor, around
an own slot (nothing, or :attr:`Buffers.slots`) — or **packed** into / unpacked from a
staging tensor. Each side is chosen on its own, once per block sizes: a direct
ReduceScatter sends its input and receives into the fold's stack in place, a direct
AllGather packs its n − 1 sends and receives into the output in place, a direct
AllToAll is in place on both sides.
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

    ``sends``/``recvs``: operation indices in (peer, operation) order, the order both ends
    agree on; ``recv_spans``: where each receive is written (its span, or where a reducing
    receive lands). ``in_split``/``out_split``: elements to / from each rank, the own slot
    (``own``: its length, the same on both sides) included. ``send_region``/``recv_region``:
    (tensor index, start, end) when that side is in place, None when packed; ``send_slot``/
    ``recv_slot``: what fills / takes the own slot of a packed side.
    """

    sends: tuple[int, ...]
    recvs: tuple[int, ...]
    recv_spans: tuple[Span, ...]
    in_split: list[int]
    out_split: list[int]
    own: int = 0
    send_region: Span | None = None
    recv_region: Span | None = None
    send_slot: Span | None = None
    recv_slot: Span | None = None
    folded: tuple[bool, ...] = ()  # per receive: a reduction the buffers' reducer adds in (packed side only)
    own_at: tuple[int, int] = (0, 0)  # how many sends / receives go to / come from ranks before this one

    @property
    def packed(self) -> bool:
        return self.send_region is None or self.recv_region is None


@dataclass(frozen=True, eq=False)
class ExchangeProgram:
    """The steps, and what a call needs of the plan: the operations and their spans.
    ``copy_own``: no step carries AllToAll's own block through gloo's own slot, so it is copied here."""

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
        so both ends agree. Each side in place where its chunks allow (module docstring), with the
        own slot that leaves more sides in place (an empty one on a tie: gloo then copies nothing)."""
        n, rank = plan.n_ranks, plan.rank
        spans = bound.spans
        landings = {}
        if buffers.landing is not None:
            landings = {op.index: buffers.landing(spans[op.index][1], spans[op.index][2], op.peer) for op in plan.ops
                        if spans[op.index] is not None and not op.is_send and op.op is TransferOp.REDUCE}
        by_step: dict[int, list[Op]] = {}
        for op in plan.ops:
            if spans[op.index] is not None:
                by_step.setdefault(op.step, []).append(op)
        steps = []
        for step in range(plan.n_steps):
            ops = sorted(by_step.get(step, []), key=lambda o: (o.peer, o.index))
            sends = [o for o in ops if o.is_send]
            recvs = [o for o in ops if not o.is_send]
            recv_spans = tuple(landings.get(o.index, spans[o.index]) for o in recvs)
            in_split, out_split = [0] * n, [0] * n
            for o in sends:
                in_split[o.peer] += spans[o.index][2]
            for o, span in zip(recvs, recv_spans, strict=True):
                out_split[o.peer] += span[2]
            send_segments = [(o.peer, spans[o.index]) for o in sends]
            recv_segments = [(o.peer, span) for o, span in zip(recvs, recv_spans, strict=True)]
            folded = tuple(o.op is TransferOp.REDUCE and o.index not in landings for o in recvs)
            best = None  # (sides in place, own slot, send region, receive region); the empty slot wins a tie
            for slots in [None] + ([buffers.slots] if buffers.slots is not None and buffers.slots[0][2] else []):
                send_region = _in_place(send_segments, rank, slots[0] if slots else None)
                # a reduction the reducer adds in needs the partial sum kept: it is received beside it
                recv_region = None if any(folded) else _in_place(recv_segments, rank, slots[1] if slots else None)
                if slots is not None and send_region and recv_region and slots[0][:2] == slots[1][:2]:
                    send_region = None  # gloo would copy a region onto itself
                score = (send_region is not None) + (recv_region is not None)
                if best is None or score > best[0]:
                    best = (score, slots, send_region, recv_region)
            _, slots, send_region, recv_region = best
            own = slots[0][2] if slots else 0
            in_split[rank] = out_split[rank] = own
            own_at = (sum(o.peer < rank for o in sends), sum(o.peer < rank for o in recvs))
            steps.append(ExchangeStep(tuple(o.index for o in sends), tuple(o.index for o in recvs), recv_spans,
                                      in_split, out_split, own, send_region, recv_region,
                                      slots[0] if slots else None, slots[1] if slots else None, folded, own_at))
        carried = buffers.self_segments is not None and any(  # gloo copied the own block into the output
            step.own and step.recv_region is not None and step.recv_slot == buffers.self_segments[1]
            for step in steps)
        return ExchangeProgram(tuple(steps), plan.ops, spans, buffers.self_segments is not None and not carried)

    def run(self, program: ExchangeProgram, transport: Transport, tensors: list[torch.Tensor], buffers: Buffers, *,
            seq: int, meters: Meters | None) -> None:
        if program.copy_own:
            copy_own_block(buffers, tensors)
        spans, ops, template = program.spans, program.ops, buffers.template
        itemsize = template.element_size()
        for step in program.steps:
            inp = (_region(tensors, step.send_region) if step.send_region is not None
                   else _pack(tensors, step, spans, template))
            out = (_region(tensors, step.recv_region) if step.recv_region is not None
                   else template.new_empty(sum(step.out_split)))
            if meters is not None:  # receive-side telemetry; one alltoallv: no arrival times
                for i in step.recvs:
                    meters.posted(ops[i].peer, spans[i][2] * itemsize)
            transport.native_all_to_all(out, inp, step.out_split, step.in_split)
            if meters is not None:
                for i in step.recvs:
                    meters.completed(ops[i].peer, spans[i][2] * itemsize)
            if step.recv_region is None:
                _unpack(out, step, ops, tensors, buffers)


def _pack(tensors: list[torch.Tensor], step: ExchangeStep, spans: list[Span | None],
          template: torch.Tensor) -> torch.Tensor:
    """The step's sends concatenated in (peer, operation) order, the own slot in its place."""
    parts = [_view(tensors, spans[i]) for i in step.sends]
    if step.own:
        parts.insert(step.own_at[0], _view(tensors, step.send_slot))
    return torch.cat(parts) if parts else template.new_empty(0)


def _unpack(out: torch.Tensor, step: ExchangeStep, ops: tuple[Op, ...], tensors: list[torch.Tensor],
            buffers: Buffers) -> None:
    """Peers ascending, each peer's chunks in the plan's order (the sender's packing order); the own
    slot skipped (gloo copied it into the staging tensor, and it is already in place)."""
    position = 0
    for number, (i, span, folded) in enumerate(zip(step.recvs, step.recv_spans, step.folded, strict=True)):
        if number == step.own_at[1]:
            position += step.own
        incoming = out[position:position + span[2]]
        if folded:
            buffers.reducer(_view(tensors, span), incoming, ops[i].peer)
        else:
            _view(tensors, span).copy_(incoming)
        position += span[2]


def _region(tensors: list[torch.Tensor], region: Span) -> torch.Tensor:
    tensor = tensors[region[0]]
    return tensor if region[1] == 0 and region[2] == tensor.numel() else tensor[region[1]:region[2]]


def _view(tensors: list[torch.Tensor], span: Span) -> torch.Tensor:
    return tensors[span[0]][span[1]:span[1] + span[2]]


def _in_place(segments: list[tuple[int, Span]], rank: int, own: Span | None) -> Span | None:
    """(tensor index, start, end) of one region holding ``segments`` (peer, span) back to back in peer order
    with ``own`` (or nothing) in this rank's place, or None. (A peer with nothing to exchange has an empty
    region: gloo's offsets are cumulative, so it takes no place.)"""
    ordered = ([span for peer, span in segments if peer < rank] + ([own] if own is not None else [])
               + [span for peer, span in segments if peer > rank])
    if not ordered:
        return None
    index = ordered[0][0]
    start = end = ordered[0][1]
    for tensor, segment_start, length in ordered:
        if tensor != index or segment_start != end:
            return None
        end = segment_start + length
    return index, start, end
