"""The executor's two seams to the controller: where schedules come from, where samples go.

mccl-paper §3 splits mccl into a fast path (the executor, in every rank) and a slow
path (the controller). The executor talks to the controller only through these two
interfaces, so the controller's client (ZeroMQ, a later issue) plugs in without
changing the executor:

* :class:`ScheduleSource` — ``poll()`` returns the next schedule the controller
  issued, or None; it never blocks (the hot-swap thread calls it between idle
  waits) and raises :class:`~mccl.errors.ControllerError` when the controller is
  unreachable (the executor then keeps its last schedule: fail-static).
* :class:`TelemetrySink` — ``submit(samples)`` receives a batch of measurements,
  called from the telemetry thread, never from a collective.
* :class:`CallSink` — optional on a telemetry sink: ``submit_calls(totals)`` receives the
  communicator's call totals by path (:mod:`mccl.runtime.calls`) and says whether it took them
  (a report it could not take is sent again on the next flush).

Local implementations: :class:`LocalScheduleSource` (a queue an operator or test
fills) and :class:`MemorySink` (keeps the samples in memory).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from mccl.errors import ControllerError
from mccl.runtime.calls import CallTotals
from mccl.schedule import Schedule
from mccl.telemetry import Sample

__all__ = ["Sample", "ScheduleSource", "TelemetrySink", "CallSink", "LocalScheduleSource", "MemorySink"]


@runtime_checkable
class ScheduleSource(Protocol):
    def poll(self) -> Schedule | None:
        """The next schedule issued for this rank, or None; never blocks; ControllerError if unreachable."""
        ...


@runtime_checkable
class TelemetrySink(Protocol):
    def submit(self, samples: Sequence[Sample]) -> None:
        """Take a batch of samples (called off the critical path)."""
        ...


@runtime_checkable
class CallSink(Protocol):
    def submit_calls(self, totals: CallTotals) -> bool:
        """Take a communicator's call totals; False if they could not be taken now (sent again later)."""
        ...


class LocalScheduleSource:
    """A schedule source filled in-process (operators, tests); ``close()`` makes it unreachable."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Schedule] = queue.SimpleQueue()
        self._closed = False

    def put(self, schedule: Schedule) -> None:
        self._queue.put(schedule)

    def close(self) -> None:
        self._closed = True

    def get(self, timeout: float) -> Schedule | None:
        """The next schedule put, waiting idle up to ``timeout`` seconds (the hot-swap thread's inbox)."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def poll(self) -> Schedule | None:
        if self._closed:
            raise ControllerError("the local schedule source was closed")
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None


class MemorySink:
    """Keeps every batch it receives, and the latest call totals by (communicator, rank); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._calls: dict[tuple[str, int], CallTotals] = {}
        self.batches = 0

    def submit(self, samples: Sequence[Sample]) -> None:
        with self._lock:
            self._samples.extend(samples)
            self.batches += 1

    def submit_calls(self, totals: CallTotals) -> bool:
        with self._lock:
            self._calls[(totals.communicator, totals.rank)] = totals
        return True

    @property
    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    @property
    def calls(self) -> dict[tuple[str, int], CallTotals]:
        with self._lock:
            return dict(self._calls)
