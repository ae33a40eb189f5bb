"""The eager driver (gloo): every operation is posted as soon as the ones it depends on are done.

So chunk ``k + 1`` is in flight while chunk ``k`` is forwarded: several trees or paths
and several chunks of one path are in flight at once (pipelining across chunks,
mccl-paper §3.3). Operations queue per stream, (direction, peer, chunk): a stream's
operations (in a sliced plan, its slices, :func:`mccl.runtime.plan.slice_plan`) are
posted in plan order, and no stream waits behind another one — the streams the
simulator's executor model shares links between (``SimOptions.executor``). gloo needs the CPU to wait for a chunk before forwarding it (see
:mod:`mccl.runtime.transport`); the wait happens in ``Work.wait()``, which releases
the GIL.

One call is a small state machine (:class:`_EagerRun`). The operations whose completion
unlocks others (a relay's receive, a reducing receive: "watched") are handed, the head of
each stream at a time, to the transport's waiter threads (:mod:`mccl.runtime.completions`),
which report each completion the moment it happens; the call blocks on their reports, marks
the operation done, adds in the partial sums whose turn has come and posts what became
ready. Why not wait on the earliest posted operation, as this driver did until the
fourteenth session: gloo cannot wait for "any", and while the driver blocked on one
receive (a slower peer's, a degraded NIC's) a relay's chunk that had already arrived was
not forwarded — a schedule that splits a source's block over several trees then ran at
half its model on the emulated fabric. The other operations unlock nothing; they are
waited on, earliest step first, once no watched operation is out. A rank whose watched
operations all exchange with one peer (a ring's: one upstream, whose chunks arrive in the
order it sends them) waits the old way: a hand-over costs a thread switch per completion,
which a CPU-bound run on the loopback pays (measured: the 1 MiB ring AllGather at 8 ranks
19.5 against 14.6 ms) and a single upstream cannot repay.

Why it cannot hang where the old order could not: the call only blocks on the reports
while some watched operation has a thread, and every watched operation posted has one or
queues behind its stream's head, which completes first (one socket per pair, slices in
order); whatever completes is taken at once, and the partial sums it completes are added
in before the call blocks again (a sum left pending there is what the peers may be
waiting for: the hang the first version had). If the waiter pool is full, an operation it
refuses is waited on the old way (earliest step first, never one a thread waits on: gloo
lets a Work be waited on once). Everything that depends only on the plan and which chunks
are empty is in the :class:`EagerProgram`.
"""

from __future__ import annotations

import collections
import heapq
import queue
import time
from dataclasses import dataclass

import torch

from mccl.errors import MCCLError
from mccl.runtime.binding import Bound
from mccl.runtime.buffers import Buffers, Reducer
from mccl.runtime.completions import CompletionWaiters
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
    handover: bool  # watched operations go to the waiter threads: they come from more than one peer


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
        unlocks = tuple(bool(dependents[op.index]) or op.index in in_apply or
                        (not op.is_send and op.op is TransferOp.REDUCE) for op in ops)
        return EagerProgram(
            p2p=point_to_point(plan, bound, buffers),
            empty=empty,
            live=len(ops) - sum(empty),
            dependents=tuple(tuple(items) for items in dependents),
            waiting=tuple(sum(1 for d in op.deps if not empty[d]) for op in ops),
            queues={key: tuple(items) for key, items in queues.items()},
            queue_order={key: (key[0], (key[1] - plan.rank) % plan.n_ranks, key[2]) for key in queues},
            unlocks=unlocks,
            handover=len({op.peer for op in ops if unlocks[op.index] and not empty[op.index]}) > 1,
        )

    def run(self, program: EagerProgram, transport: Transport, tensors: list[torch.Tensor], buffers: Buffers, *,
            seq: int, meters: Meters | None) -> None:
        views, temps = call_views(program.p2p, tensors, buffers)
        _EagerRun(program, transport, views, temps, buffers.reducer, tag_base(seq), meters).run()


class _EagerRun:
    """The state of one eager call, explicit: what is posted, done, added in, still waited on."""

    __slots__ = ("program", "ops", "transport", "views", "temps", "reducer", "tag_base", "meters", "nbytes", "done",
                 "applied", "posted", "works", "waiting", "heads", "remaining", "pending_apply", "touched", "heap",
                 "watched", "pool", "reports", "handed", "stream_head", "behind")

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
        self.watched: set[int] = set()  # watched operations no thread waits on (the pool was full): polled
        waiters = getattr(transport, "waiters", None) if program.handover else None
        self.pool: CompletionWaiters | None = waiters() if waiters is not None else None
        self.reports: queue.SimpleQueue = queue.SimpleQueue()  # the threads' Completions
        self.handed: set[int] = set()  # watched operations a thread waits on, not yet reported
        self.stream_head: dict[QueueKey, int] = {}  # per stream, the operation handed over
        self.behind: dict[QueueKey, collections.deque[int]] = {}  # per stream, watched operations queued behind it

    def run(self) -> None:
        order, done, heap, ops = self.program.queue_order, self.done, self.heap, self.ops
        while True:
            if self.handed:
                self._take_reports(block=False)
            self._apply_ready()  # (before any block: a partial sum reported here may be what the peers wait for)
            for key in sorted(self.touched, key=order.__getitem__):
                self._post_ready(key)
            self.touched.clear()
            if self.remaining == 0:
                break
            while heap and done[heap[0][2]]:
                heapq.heappop(heap)
            if not heap:
                raise MCCLError("the executor stalled: operations wait on each other (a schedule this rank cannot run)")
            first = heap[0][2]
            if self.handed and (first in self.handed or not self.watched):
                with self.transport.waiting(None):  # (any peer may hold this up: the liveness watcher's question)
                    self._take_reports(block=True)  # (module docstring: why this cannot hang)
                continue
            heapq.heappop(heap)
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

    def _hand(self, index: int) -> None:
        """A watched operation was posted: a thread waits on it, or it queues behind its stream's head, or
        (the pool is full) it is polled and waited on the old way."""
        op = self.ops[index]
        key = (op.is_send, op.peer, op.chunk)
        if key in self.stream_head:
            self.behind.setdefault(key, collections.deque()).append(index)
        elif self.pool is not None and self.pool.submit(self.works[index], op.peer, index, self.reports):
            self.stream_head[key] = index
            self.handed.add(index)
        else:
            self.watched.add(index)

    def _take_reports(self, block: bool) -> None:
        """Complete what the waiter threads reported (``block``: wait for one report first)."""
        reports = self.reports
        while True:
            try:
                index, began, ended, error = reports.get() if block else reports.get_nowait()
            except queue.Empty:
                return
            block = False
            if error is not None:
                raise error
            self.handed.discard(index)
            op = self.ops[index]
            key = (op.is_send, op.peer, op.chunk)
            del self.stream_head[key]
            self._complete(index, began, ended)
            waiting = self.behind.get(key)
            while waiting:
                following = waiting.popleft()
                if not self.done[following]:  # (one the old way's wait already took is not handed again)
                    self._hand(following)
                    break

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
                    self._hand(index)
            position += 1
        self.heads[key] = position

    def _release(self, index: int) -> None:
        """``index`` is done (and added in): its dependents wait on one operation less."""
        waiting, ops = self.waiting, self.ops
        for dependent in self.program.dependents[index]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                self.touched.add((ops[dependent].is_send, ops[dependent].peer, ops[dependent].chunk))

    def _complete(self, index: int, began: float | None = None, ended: float | None = None) -> None:
        """``began``: when the wait that ended with this operation's completion started (None: found done);
        ``ended``: when it returned (None: now)."""
        self.done[index] = True
        self.remaining -= 1
        self.watched.discard(index)
        op = self.ops[index]
        if not op.is_send and self.meters is not None:  # receive-side telemetry: when the last byte arrived
            self.meters.received(op.peer, self.nbytes[index], began, self.works[index], ended)
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
