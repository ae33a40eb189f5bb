"""The driver protocol, and what the point-to-point drivers (stepwise, eager) share.

A driver turns a plan into issued and waited-for operations. Its work splits in two:

* ``prepare(plan, bound, buffers) -> program``: everything that depends only on the
  plan and the block sizes (which operations are live, in which order they are issued,
  who waits on whom). The executor calls it on the first call with given sizes and
  keeps the program in :attr:`~mccl.runtime.binding.Bound.programs`, so a training
  step that repeats its sizes pays it once.
* ``run(program, transport, tensors, buffers, seq=, meters=)``: one call. It gets the
  call's tensors (scratch allocated) and does only per-call work: slicing, posting,
  waiting, adding partial sums, telemetry.

The program carries the plan's pieces it needs, so ``run`` needs no plan and no
:class:`Bound`. NCCL and gloo reach the network only through
:class:`~mccl.runtime.transport.Transport`, the same interface for every driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from mccl.runtime.binding import Bound, copy_own_block
from mccl.runtime.buffers import Buffers
from mccl.runtime.plan import Op, RankPlan
from mccl.runtime.telemetry import Meters
from mccl.runtime.transport import P2P, TAG_SPAN, Transport
from mccl.schedule import TransferOp

__all__ = ["Driver", "PointToPoint", "point_to_point", "call_views", "p2p", "tag_base"]

Program = TypeVar("Program")


class Driver(Protocol[Program]):
    """How one rank issues and waits for its operations (see module docstring).

    ``name``: what ``execute(driver=...)`` and ``init(driver=...)`` call it, and the key
    of its program in :attr:`Bound.programs`. ``gloo_only``: it waits on the CPU for
    individual operations (or uses gloo's alltoallv), which an NCCL stream does not allow.
    """

    name: str
    gloo_only: bool

    def prepare(self, plan: RankPlan, bound: Bound, buffers: Buffers) -> Program:
        """The per-size program: computed once per (plan, buffer kind, block sizes)."""
        ...

    def run(self, program: Program, transport: Transport, tensors: list[torch.Tensor], buffers: Buffers, *,
            seq: int, meters: Meters | None) -> None:
        """Run one call; blocks until this rank's operations are done."""
        ...


@dataclass(frozen=True, eq=False)
class PointToPoint:
    """What every point-to-point program holds: the plan's operations, the call's spans
    (:attr:`Bound.spans`), and the live reducing receives, which land in a temporary of their
    own and are added into the partial sum in canonical order (so a sum is the same every run)."""

    ops: tuple[Op, ...]
    spans: list[tuple[int, int, int] | None]
    reducing: tuple[int, ...]
    landings: dict[int, tuple[int, int, int]]  # where a reducing receive lands, when the buffers say (Buffers.landing)


def point_to_point(plan: RankPlan, bound: Bound, buffers: Buffers) -> PointToPoint:
    reducing = tuple(op.index for op in plan.ops
                     if bound.spans[op.index] is not None and not op.is_send and op.op is TransferOp.REDUCE)
    landings = {}
    if buffers.landing is not None:
        for index in reducing:
            _, start, length = bound.spans[index]
            landings[index] = buffers.landing(start, length, plan.ops[index].peer)
    return PointToPoint(plan.ops, bound.spans, reducing, landings)


def call_views(program: PointToPoint, tensors: list[torch.Tensor],
               buffers: Buffers) -> tuple[list[torch.Tensor | None], dict[int, torch.Tensor]]:
    """One call's operation views and reduce temporaries; AllToAll's own block copied across first."""
    copy_own_block(buffers, tensors)
    views = [None if span is None else tensors[span[0]][span[1]:span[1] + span[2]] for span in program.spans]
    if program.landings:  # the reduction keeps every contribution (an order to add them in)
        return views, {index: tensors[span[0]][span[1]:span[1] + span[2]] for index, span in program.landings.items()}
    return views, {index: torch.empty_like(views[index]) for index in program.reducing}


def tag_base(seq: int) -> int:
    """The call's tag space: collectives cycle through 1024 of them, so a late message of one
    call never matches a receive of the next on gloo (which matches by tag)."""
    return (seq % 1024) * TAG_SPAN


def p2p(op: Op, views: list[torch.Tensor | None], temps: dict[int, torch.Tensor], base: int) -> P2P:
    """``op`` as a transport operation; a reducing receive lands in its temporary."""
    return P2P(op.is_send, temps.get(op.index, views[op.index]), op.peer, base + op.tag % TAG_SPAN)
