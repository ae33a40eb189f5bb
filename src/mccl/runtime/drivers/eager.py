"""The eager driver (gloo): every operation is posted as soon as the ones it depends on are done.

So chunk ``k + 1`` is in flight while chunk ``k`` is forwarded: several trees or paths
and several chunks of one path are in flight at once (pipelining across chunks,
mccl-paper §3.3). Operations queue per stream, (direction, peer, chunk): a stream's
operations (in a sliced plan, its slices, :func:`mccl.runtime.plan.slice_plan`) are
posted in plan order, and no stream waits behind another one — the streams the
simulator's executor model shares links between (``SimOptions.executor``). gloo needs the CPU to wait for a chunk before forwarding it (see
:mod:`mccl.runtime.transport`); the wait happens in ``Work.wait()``, which releases
the GIL.

One call is a small state machine (:class:`_EagerRun`): wait on the earliest posted
operation (by step), mark it done, poll the posted operations whose completion
unlocks others (O(watched) per wait; the rest are found done when their turn to be
waited on comes, which then returns at once), add in the partial sums whose turn has
come, post what became ready. Everything that depends only on the plan and which
chunks are empty is in the :class:`EagerProgram`.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import torch

from mccl.errors import MCCLError
from mccl.runtime.binding import Bound
from mccl.runtime.buffers import Buffers, Reducer
from mccl.runtime.drivers.base import PointToPoint, call_views, p2p, point_to_point, tag_base
from mccl.runtime.plan import RankPlan
from mccl.runtime.telemetry import Meters
from mccl.runtime.transport import Transport
from mccl.schedule import TransferOp

__all__ = ["EagerDriver", "EagerProgram"]

# (is_send, peer, chunk): one stream; its operations (a sliced plan: the chunk's slices) are issued in plan
# order, and a stream never waits for another one (gloo matches by tag, so the order between streams is free)
QueueKey = tuple[bool, int, int]


@dataclass(frozen=True, eq=False)
class EagerProgram:
    """Who waits on whom, the per-peer issue queues, and which operations must be polled after
    every wait because their completion lets another one start."""

    p2p: PointToPoint
    empty: tuple[bool, ...]  # empty chunks: done before they start
    live: int  # operations that move data
    dependents: tuple[tuple[int, ...], ...]
    waiting: tuple[int, ...]  # not-yet-done dependencies of every operation at the start
    queues: dict[QueueKey, tuple[int, ...]]
    queue_order: dict[QueueKey, tuple[bool, int, int]]  # receives first, peers staggered by distance
    unlocks: tuple[bool, ...]


class EagerDriver:
    """See module docstring; implements :class:`~mccl.runtime.drivers.base.Driver`."""

    name = "eager"
    gloo_only = True

    def prepare(self, plan: RankPlan, bound: Bound, buffers: Buffers) -> EagerProgram:
        ops = plan.ops
        empty = tuple(span is None for span in bound.spans)
        dependents: list[list[int]] = [[] for _ in ops]
        for op in ops:
            for d in op.deps:
                dependents[d].append(op.index)
        in_apply = {d for op in ops for d in op.apply_deps}
        queues: dict[QueueKey, list[int]] = {}
        for op in ops:
            queues.setdefault((op.is_send, op.peer, op.chunk), []).append(op.index)
        return EagerProgram(
            p2p=point_to_point(plan, bound, buffers),
            empty=empty,
            live=len(ops) - sum(empty),
            dependents=tuple(tuple(items) for items in dependents),
            waiting=tuple(sum(1 for d in op.deps if not empty[d]) for op in ops),
            queues={key: tuple(items) for key, items in queues.items()},
            queue_order={key: (key[0], (key[1] - plan.rank) % plan.n_ranks, key[2]) for key in queues},
            unlocks=tuple(bool(dependents[op.index]) or op.index in in_apply or
                          (not op.is_send and op.op is TransferOp.REDUCE) for op in ops),
        )

    def run(self, program: EagerProgram, transport: Transport, tensors: list[torch.Tensor], buffers: Buffers, *,
            seq: int, meters: Meters | None) -> None:
        views, temps = call_views(program.p2p, tensors, buffers)
        _EagerRun(program, transport, views, temps, buffers.reducer, tag_base(seq), meters).run()


class _EagerRun:
    """The state of one eager call, explicit: what is posted, done, added in, still waited on."""

    __slots__ = ("program", "ops", "transport", "views", "temps", "reducer", "tag_base", "meters", "nbytes", "done",
                 "applied", "posted", "works", "waiting", "heads", "remaining", "pending_apply", "touched", "heap",
                 "watched")

    def __init__(self, program: EagerProgram, transport: Transport, views: list[torch.Tensor | None],
                 temps: dict[int, torch.Tensor], reducer: Reducer | None, base: int, meters: Meters | None) -> None:
        self.program = program
        self.ops = program.p2p.ops
        self.transport = transport
        self.views = views
        self.temps = temps
        self.reducer = reducer
        self.tag_base = base
        self.meters = meters
        self.nbytes = [0 if v is None else v.numel() * v.element_size() for v in views] if meters is not None else []
        self.done = list(program.empty)
        self.applied = list(program.empty)  # a partial sum counts once it is added in
        self.posted = list(program.empty)
        self.works: list[object] = [None] * len(views)
        self.waiting = list(program.waiting)
        self.heads = dict.fromkeys(program.queues, 0)  # next position to post in every queue
        self.remaining = program.live
        self.pending_apply: list[int] = []  # reducing receives done but not yet added in
        self.touched: set[QueueKey] = set(program.queues)  # queues that may have something to post
        self.heap: list[tuple[int, bool, int]] = []  # posted operations by (step, receives first, index)
        self.watched: set[int] = set()  # posted operations polled after every wait

    def run(self) -> None:
        order, done, heap, ops = self.program.queue_order, self.done, self.heap, self.ops
        while True:
            for key in sorted(self.touched, key=order.__getitem__):
                self._post_ready(key)
            self.touched.clear()
            if self.remaining == 0:
                break
            while heap and done[heap[0][2]]:
                heapq.heappop(heap)
            if not heap:
                raise MCCLError("the executor stalled: operations wait on each other (a schedule this rank cannot run)")
            first = heapq.heappop(heap)[2]
            began = time.perf_counter()
            self.transport.wait(self.works[first], ops[first].peer)
            self._complete(first, began)
            works = self.works
            for index in [i for i in self.watched if works[i].is_completed()]:
                self._complete(index)
            self._apply_ready()
        self._apply_ready()
        if self.pending_apply:
            raise MCCLError("the executor ended with partial sums not added (inconsistent plan)")

    def _post_ready(self, key: QueueKey) -> None:
        """Post the queue's operations in order until one still waits on a dependency."""
        queue, position = self.program.queues[key], self.heads[key]
        posted, waiting, ops, meters = self.posted, self.waiting, self.ops, self.meters
        unlocks = self.program.unlocks
        while position < len(queue):
            index = queue[position]
            if not posted[index]:
                if waiting[index]:
                    break
                op = ops[index]
                if not op.is_send and meters is not None:
                    meters.posted(op.peer, self.nbytes[index])
                self.works[index] = self.transport.post(p2p(op, self.views, self.temps, self.tag_base))
                posted[index] = True
                heapq.heappush(self.heap, (op.step, op.is_send, index))
                if unlocks[index]:
                    self.watched.add(index)
            position += 1
        self.heads[key] = position

    def _release(self, index: int) -> None:
        """``index`` is done (and added in): its dependents wait on one operation less."""
        waiting, ops = self.waiting, self.ops
        for dependent in self.program.dependents[index]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                self.touched.add((ops[dependent].is_send, ops[dependent].peer, ops[dependent].chunk))

    def _complete(self, index: int, began: float | None = None) -> None:
        """``began``: when the wait that ended with this operation's completion started (None: found done)."""
        self.done[index] = True
        self.remaining -= 1
        self.watched.discard(index)
        op = self.ops[index]
        if not op.is_send and self.meters is not None:  # receive-side telemetry: when the last byte arrived
            self.meters.received(op.peer, self.nbytes[index], began, self.works[index])
        if index in self.temps:
            self.pending_apply.append(index)
        else:
            self.applied[index] = True
            self._release(index)

    def _apply_ready(self) -> None:
        """Add in the partial sums whose earlier contributions and readers are done, in canonical order."""
        pending, done, applied, ops = self.pending_apply, self.done, self.applied, self.ops
        progress = True
        while progress and pending:
            progress = False
            for index in list(pending):
                if all(done[d] and applied[d] for d in ops[index].apply_deps):
                    self.reducer(self.views[index], self.temps[index], ops[index].peer)
                    applied[index] = True
                    pending.remove(index)
                    self._release(index)
                    progress = True
