"""The stepwise driver: one group of operations per step, waited for per step (NCCL and gloo).

NCCL needs a step's sends and receives in one group (``Transport.post_group``: one
``ncclGroupStart/End``, one Work); on gloo the same call posts them one by one,
receives first. Peers are staggered by distance so that not every rank sends to
rank 0 first; operations to one peer keep the plan's order (NCCL matches in order).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mccl.runtime.binding import Bound
from mccl.runtime.buffers import Buffers
from mccl.runtime.drivers.base import PointToPoint, call_views, p2p, point_to_point, tag_base
from mccl.runtime.plan import Op, RankPlan
from mccl.runtime.telemetry import Meters
from mccl.runtime.transport import Transport

__all__ = ["StepwiseDriver", "StepwiseProgram", "StepOps"]


@dataclass(frozen=True, eq=False)
class StepOps:
    """One step's live operations in ``post_group``'s issue order (receives, then sends; each
    staggered by peer distance, then plan order): the Works come back in this order."""

    issued: tuple[Op, ...]
    sends: tuple[Op, ...]
    recvs: tuple[Op, ...]
    reducing: tuple[int, ...]  # receives to add in after the step, in issue order


@dataclass(frozen=True, eq=False)
class StepwiseProgram:
    p2p: PointToPoint
    steps: tuple[StepOps, ...]  # steps without live operations left out


class StepwiseDriver:
    """See module docstring; implements :class:`~mccl.runtime.drivers.base.Driver`."""

    name = "stepwise"
    gloo_only = False

    def prepare(self, plan: RankPlan, bound: Bound, buffers: Buffers) -> StepwiseProgram:
        base = point_to_point(plan, bound, buffers)
        reducing = set(base.reducing)
        steps = []
        for step_ops in plan.steps:
            live = sorted((plan.ops[i] for i in step_ops if bound.spans[i] is not None),
                          key=lambda op: ((op.peer - plan.rank) % plan.n_ranks, op.index))
            if not live:
                continue
            issued = tuple([op for op in live if not op.is_send] + [op for op in live if op.is_send])
            steps.append(StepOps(issued, tuple(op for op in issued if op.is_send),
                                 tuple(op for op in issued if not op.is_send),
                                 tuple(op.index for op in issued if op.index in reducing)))
        return StepwiseProgram(base, tuple(steps))

    def run(self, program: StepwiseProgram, transport: Transport, tensors: list[torch.Tensor], buffers: Buffers, *,
            seq: int, meters: Meters | None) -> None:
        views, temps = call_views(program.p2p, tensors, buffers)
        base = tag_base(seq)
        reducer, ops = buffers.reducer, program.p2p.ops
        for step in program.steps:
            if meters is not None:  # receive-side telemetry (mccl.runtime.telemetry)
                for op in step.recvs:
                    meters.posted(op.peer, views[op.index].numel() * views[op.index].element_size())
            works = transport.post_group([p2p(op, views, temps, base) for op in step.issued])
            one_each = len(works) == len(step.issued)  # NCCL: one coalesced Work for the step
            for position, work in enumerate(works):
                began = time.perf_counter()
                transport.wait(work, step.issued[position].peer if one_each else None)
                op = step.issued[position]
                if meters is not None and one_each and not op.is_send:
                    meters.completed(op.peer, views[op.index].numel() * views[op.index].element_size(),
                                     Meters.arrival(began))
            if meters is not None and not one_each:  # one Work for the step: no arrival times
                for op in step.recvs:
                    meters.completed(op.peer, views[op.index].numel() * views[op.index].element_size())
            for index in step.reducing:
                reducer(views[index], temps[index], ops[index].peer)
