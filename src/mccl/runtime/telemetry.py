"""Passive telemetry of the executor (mccl-paper §5, adapted to point-to-point operations).

What is measured: the bytes and arrival times of the **receives** a rank performs, per
sending peer — a receive completes when its last byte has arrived, so the receiving end
is where the wire's rate shows. (Timed at the send side the window opened when a send
was posted, but a gloo send transmits only once the peer's receive-ready notice has
arrived, and it "completes" when its bytes are in the socket buffer: the 2026-12-01 loop
read 42–49 % of the shaped rate that way.) A sample therefore describes the path
``peer → this rank`` and is reported as ``Sample(rank=sender, peer=receiver)``
(:class:`mccl.telemetry.Sample`: the path's two ends, whichever one measured it).

A window is open only while the path is saturated — the "active channels ≥ threshold N"
rule of §5.1, here: while at least N receives from that peer are in flight (posted, not
yet complete) — so start-up and tail transients do not bias the rate. Inside it the rate
is the **dispersion** of the arrivals: from the first arrival whose time is known exactly
(the executor was blocked waiting for it, ``completed(..., at=)``) to the last arrival,
the bytes that arrived after the first. That leaves out the sender's start, gloo's
receive-ready rendezvous and the first chunk's latency. When no arrival in the window has
a known time (a driver that completes every receive of a step at once: gloo's alltoallv),
the window runs from the N-th post to the last completion.

Intra-host and inter-host samples are both per rank pair (``kind`` says which, §3.3).

Off the critical path: a collective only appends to a bounded deque; a thread that
idle-waits on an event hands batches to the sink. A full buffer drops the sample and
counts it (``dropped``); nothing ever blocks a collective.

The same thread reports which path ran the communicator's calls (:mod:`mccl.runtime.calls`)
to a sink that takes them (``submit_calls``, :class:`~mccl.runtime.sources.CallSink`): the
totals, whenever calls were recorded since the last report the sink accepted.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mccl.runtime.calls import CallTotals
from mccl.runtime.sources import CallSink, Sample, TelemetrySink
from mccl.telemetry import INTER, INTRA

__all__ = ["TelemetryConfig", "TelemetryBuffer", "Meters"]

log = logging.getLogger("mccl.runtime")


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    """``threshold_inter`` / ``threshold_intra``: receives from one peer in flight (N of §5.1) that
    open its window.
    ``capacity``: samples buffered before dropping; ``batch``: samples per ``submit``;
    ``flush_interval_s``: how often the telemetry thread wakes up."""

    enabled: bool = True
    threshold_inter: int = 2
    threshold_intra: int = 2
    capacity: int = 8192
    batch: int = 512
    flush_interval_s: float = 0.05


class TelemetryBuffer:
    """A bounded buffer and the thread that drains it into a :class:`TelemetrySink`; ``calls``: the
    communicator's call totals (:meth:`mccl.runtime.calls.CallLog.totals`), reported to a sink that
    is also a :class:`CallSink`."""

    def __init__(self, sink: TelemetrySink, config: TelemetryConfig,
                 calls: Callable[[], CallTotals] | None = None) -> None:
        self.sink = sink
        self.config = config
        self._calls = calls if isinstance(sink, CallSink) else None
        self._calls_reported = 0  # the generation of the last call report the sink accepted
        self.call_reports = 0
        self._samples: collections.deque[Sample] = collections.deque()
        self.dropped = 0
        self.submitted = 0
        self.failed_batches = 0
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._drain_forever, name="mccl-telemetry", daemon=True)
        self._thread.start()

    def offer(self, sample: Sample) -> bool:
        """Append a sample, or drop and count it when the buffer is full; never blocks."""
        if len(self._samples) >= self.config.capacity:
            self.dropped += 1
            return False
        self._samples.append(sample)
        return True

    def flush(self) -> None:
        """Hand every buffered sample to the sink now (from the calling thread)."""
        self._drain()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
        self._drain()

    def _drain(self) -> None:
        while self._samples:
            batch: list[Sample] = []
            while self._samples and len(batch) < self.config.batch:
                batch.append(self._samples.popleft())
            try:
                self.sink.submit(batch)
                self.submitted += len(batch)
            except Exception as error:  # a failing sink must not take the executor down (fail-static)
                self.failed_batches += 1
                if self.failed_batches == 1:
                    log.warning("mccl telemetry: the sink failed (%s); samples are dropped until it recovers", error)
        self._report_calls()

    def _report_calls(self) -> None:
        if self._calls is None:
            return
        totals = self._calls()
        if totals.generation == self._calls_reported:
            return
        try:
            taken = self.sink.submit_calls(totals)
        except Exception as error:  # fail-static, as for samples; tried again on the next drain
            self.failed_batches += 1
            if self.failed_batches == 1:
                log.warning("mccl telemetry: the sink failed (%s); reports are dropped until it recovers", error)
            return
        if taken:
            self._calls_reported = totals.generation
            self.call_reports += 1

    def _drain_forever(self) -> None:
        while not self._stop:
            self._wake.wait(self.config.flush_interval_s)  # idle wait: the GIL is free meanwhile
            self._wake.clear()
            self._drain()


# A wait that returned later than this after it began was blocked on the operation, so the
# operation completed (its last byte arrived) when the wait returned; a quicker return means it
# had completed earlier, at a time nobody saw (gloo's ``is_completed`` stays False until waited).
BLOCKED_WAIT_S = 50e-6


class _Window:
    __slots__ = ("inflight", "opened", "first", "last", "after_first", "total")

    def __init__(self) -> None:
        self.inflight = 0  # receives from the peer posted and not yet complete
        self.opened: float | None = None  # when the N-th receive was posted (None: closed)
        self.first: float | None = None  # the first arrival with a known time in the window
        self.last = 0.0  # the latest completion seen in the window (known, or when noticed)
        self.after_first = 0  # bytes that arrived after ``first``
        self.total = 0  # bytes of every completion in the window


class Meters:
    """The per-peer receive windows of one rank of one communicator (module docstring)."""

    def __init__(self, communicator: str, rank: int, same_host: Sequence[bool], buffer: TelemetryBuffer,
                 config: TelemetryConfig) -> None:
        self.communicator = communicator
        self.rank = rank
        self.buffer = buffer
        self.config = config
        self.seq = 0
        self.set_hosts(same_host)

    def set_hosts(self, same_host: Sequence[bool]) -> None:
        """Which peers share this rank's host (from the topology of the installed schedules)."""
        self._kind = [INTRA if same else INTER for same in same_host]
        self._threshold = [self.config.threshold_intra if same else self.config.threshold_inter for same in same_host]
        self._windows = [_Window() for _ in same_host]

    def posted(self, peer: int, nbytes: int) -> None:
        """A receive of ``nbytes`` from ``peer`` was posted."""
        window = self._windows[peer]
        window.inflight += 1
        if window.opened is None and window.inflight >= self._threshold[peer]:
            window.opened = time.perf_counter()
            window.first = None
            window.after_first = window.total = 0

    @staticmethod
    def arrival(began: float) -> float | None:
        """Called right after a wait that began at ``began`` (``time.perf_counter()``) returned: now,
        if the wait was blocked until the operation completed; None if it had completed before."""
        now = time.perf_counter()
        return now if now - began > BLOCKED_WAIT_S else None

    def completed(self, peer: int, nbytes: int, at: float | None = None) -> None:
        """A receive from ``peer`` completed. ``at``: when its last byte arrived
        (``time.perf_counter()``), if known — the executor's wait for it was blocked until then
        (:data:`BLOCKED_WAIT_S`); None: it completed at an unknown time before now."""
        window = self._windows[peer]
        window.inflight -= 1
        if window.opened is None:
            return
        window.total += nbytes
        if at is None:
            window.last = time.perf_counter()
            if window.first is not None:
                window.after_first += nbytes
        elif window.first is None:
            window.first = window.last = at
        else:
            window.last = at
            window.after_first += nbytes
        if window.inflight >= self._threshold[peer]:
            return
        if window.first is not None:
            nbytes_in, seconds = window.after_first, window.last - window.first
        else:
            nbytes_in, seconds = window.total, window.last - window.opened
        window.opened = None
        if nbytes_in > 0 and seconds > 0:  # one exact arrival alone measures no rate
            self.buffer.offer(Sample(self._kind[peer], self.communicator, peer, self.rank, nbytes_in, seconds,
                                     time.time(), self.seq))
