"""An emulated gray failure: sends to some peers paced at a lower rate (a real delay).

For demos and tests on one machine, where every rank pair runs at loopback speed:
``Transport.throttle(peers, gbps)`` makes every later send from this rank to any of
``peers`` wait for its serialization time at ``gbps`` before it is posted, through
one shared pacer — the peers share the slowed link, as the pairs behind one degraded
NIC cable do. The data really arrives that much later, so the executor's passive
telemetry (§5) sees the slow link exactly as it would see a real one.

The pacer is a thread that idle-waits (no GIL-holding spin: that slows gloo 5–14×)
and posts each send when its time comes, in order; a second thread is the only
one that waits on the posted gloo Work (a gloo send must not be waited on twice)
and stamps :attr:`PacedWork.completed_at` — the time the data really left. The
telemetry meters the receiving end (:mod:`mccl.runtime.telemetry`), where a paced
send's data arrives when the pacer posts it, so the meters need no stamp; it is
kept for callers that time sends. The executor waits on a :class:`PacedWork` as
on any gloo Work. gloo only (NCCL sends are enqueued on a stream, which a
CPU-side delay would not model).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from mccl.errors import MCCLError

__all__ = ["Pacer", "PacedWork"]


class PacedWork:
    """A send that the pacer posts later; ``wait``/``is_completed`` like a torch Work."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.completed_at: float | None = None  # time.perf_counter() when the send completed

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self.completed_at = time.perf_counter()
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self) -> bool:
        self._done.wait()  # idle wait, the GIL is free
        if self._error is not None:
            raise MCCLError(f"a paced send failed: {self._error}") from self._error
        return True


class Pacer:
    """One emulated link at ``gbps``: sends leave in order, each after ``bytes · 8 / gbps`` of link time."""

    def __init__(self, gbps: float) -> None:
        if not gbps > 0:
            raise MCCLError(f"a throttle rate must be positive, got {gbps} Gbit/s")
        self.gbps = float(gbps)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._free_at = 0.0  # when the emulated link is through with the sends handed over so far
        self._sleep = threading.Event()
        self._posted: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="mccl-pacer", daemon=True)
        self._waiter = threading.Thread(target=self._wait_posted, name="mccl-pacer-wait", daemon=True)
        self._thread.start()
        self._waiter.start()

    def submit(self, post: Callable[[], object], nbytes: int) -> PacedWork:
        work = PacedWork()
        self._queue.put((post, nbytes, work, time.perf_counter()))
        return work

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._waiter.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._posted.put(None)
                return
            post, nbytes, work, submitted = item
            # The link's schedule: a send starts when it was handed over or when the one before it is
            # through, whichever is later — not when this thread woke up, so a sleep that overshot (a loaded
            # machine) does not push every later send back: the posts behind schedule go at once, as a link
            # with a backlog sends back to back. Scheduled from the wake-up instead, 2 ranks at load 25–30
            # delivered 0.05–0.09 of 0.2 Gbit/s (the throttle test's flake); capping the catch-up at 1.05× the
            # rate left 0.06–0.18. The price: after a stall, a burst (a receiver's window may read above it).
            self._free_at = max(submitted, self._free_at) + nbytes * 8 / (self.gbps * 1e9)
            delay = self._free_at - time.perf_counter()
            if delay > 0:
                self._sleep.wait(delay)  # idle wait, the GIL is free
            try:
                self._posted.put((post(), work))
            except BaseException as error:  # handed to the waiting executor
                work._finish(error)

    def _wait_posted(self) -> None:
        while True:
            item = self._posted.get()
            if item is None:
                return
            posted, work = item
            try:
                posted.wait()  # no timeout: an expired wait breaks a gloo group for good
                work._finish()
            except BaseException as error:
                work._finish(error)
