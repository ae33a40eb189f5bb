"""Waiter threads that report a posted operation's completion the moment it happens (gloo, eager driver).

Why. gloo has no "wait for any": a ``Work`` is waited on alone, and its ``is_completed()`` stays False until
someone waits on it (torch 2.13). The eager driver used to block on the earliest posted operation, so a relay
whose chunk had arrived could not forward it while the driver still waited on an earlier receive — from a slower
peer, say, or through a degraded NIC. The forwarding then followed the slowest path's arrivals, and a schedule that
routes around a slow link by splitting a source's block over several trees (what a re-synthesis does) ran at
0.42–0.57 of its model on the emulated fabric, where one-tree schedules reached 0.86–0.90 (BENCHMARKS.md,
thirteenth and fourteenth sessions).

So every posted operation whose completion lets another start (a relay's receive, a reducing receive) is handed to
one of these threads, which blocks in ``wait()`` on it (the GIL released) and puts ``(index, began, ended, error)``
on the posting call's queue; the driver blocks on that queue instead, and wakes for whichever such operation
completes first. Only the head of each stream (direction, peer, chunk) is handed over at a time: a stream's
operations complete in posting order (one socket per pair of ranks, slices sent in order), so one thread per
stream sees every completion at once, and the threads stay as few as the streams a rank has in flight.

The threads are started on demand, kept by the transport for its lifetime (:meth:`Transport.close` stops them)
and never more than ``limit``; past it, :meth:`submit` says no and the driver waits on that operation itself, as
before (slower, never stuck: see :mod:`mccl.runtime.drivers.eager`).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable

__all__ = ["CompletionWaiters", "Completion"]

Completion = tuple[int, float, float, BaseException | None]
"""(operation index, when the thread's wait began, when it returned, the wait's error or None)."""


class CompletionWaiters:
    """Daemon threads, each blocked on one posted operation at a time (module docstring). ``wait``: how a
    thread waits on a Work (the transport's, which turns a backend error into ``PeerLost``)."""

    def __init__(self, wait: Callable[[object, int], None], limit: int = 128) -> None:
        if limit < 1:
            raise ValueError(f"a waiter pool needs at least one thread, got limit={limit}")
        self._wait = wait
        self.limit = int(limit)
        self._jobs: collections.deque[tuple[object, int, int, queue.SimpleQueue]] = collections.deque()
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._busy = 0  # jobs accepted and not yet reported: never more than the threads
        self._stop = False

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, work: object, peer: int, index: int, sink: queue.SimpleQueue) -> bool:
        """Have a thread wait on ``work`` (posted to or from ``peer``) and put its :data:`Completion` on ``sink``;
        False (nothing done) when every thread is busy and ``limit`` are running, or the pool is closed."""
        with self._ready:
            if self._stop:
                return False
            if self._busy >= len(self._threads):
                if len(self._threads) >= self.limit:
                    return False
                thread = threading.Thread(target=self._serve, name=f"mccl-waiter-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._busy += 1
            self._jobs.append((work, peer, index, sink))
            self._ready.notify()
        return True

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._stop:
                    self._ready.wait()
                if self._stop and not self._jobs:
                    return
                work, peer, index, sink = self._jobs.popleft()
            began = time.perf_counter()
            error: BaseException | None = None
            try:
                self._wait(work, peer)
            except BaseException as caught:  # (re-raised by the driver, in its own thread)
                error = caught
            ended = time.perf_counter()
            with self._ready:
                self._busy -= 1
            sink.put((index, began, ended, error))

    def close(self) -> None:
        """Stop the threads once they are idle (one still blocked on an operation is a daemon and ends with it)."""
        with self._ready:
            self._stop = True
            self._ready.notify_all()
