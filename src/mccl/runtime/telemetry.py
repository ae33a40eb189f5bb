"""Passive telemetry of the executor (mccl-paper §5, adapted to point-to-point operations).

What is measured: the bytes and time of the sends a rank actually performs, per
peer. A measurement window is open only while the path is saturated — the "active
channels ≥ threshold N" rule of §5.1, here: while at least N sends to that peer
(inter-host) or to the rank's host (intra-host) are in flight — so start-up and tail
transients do not bias the rate. The window opens when the N-th send is posted,
counts the bytes of sends that complete while it is open, and closes (emitting one
:class:`~mccl.telemetry.Sample`) when fewer than N remain in flight.

Intra-host samples are the rank's cumulative injection rate into its host fabric
(all same-host peers together), inter-host samples are per rank pair (§3.3).

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

__all__ = ["TelemetryConfig", "TelemetryBuffer", "Meters"]

log = logging.getLogger("mccl.runtime")


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    """``threshold_inter`` / ``threshold_intra``: sends in flight (N of §5.1) that open a window.
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


class _Window:
    __slots__ = ("inflight", "start", "bytes")

    def __init__(self) -> None:
        self.inflight = 0
        self.start: float | None = None
        self.bytes = 0


class Meters:
    """The per-peer measurement windows of one rank of one communicator."""

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
        # key -1: all same-host peers together (injection rate); key p: the pair (rank, p)
        self._key = [-1 if same else peer for peer, same in enumerate(same_host)]
        self._threshold = [self.config.threshold_intra if same else self.config.threshold_inter for same in same_host]
        self._windows: dict[int, _Window] = {key: _Window() for key in set(self._key)}

    def posted(self, peer: int, nbytes: int) -> None:
        key = self._key[peer]
        window = self._windows[key]
        window.inflight += 1
        if window.start is None and window.inflight >= self._threshold[peer]:
            window.start = time.perf_counter()
            window.bytes = 0

    def completed(self, peer: int, nbytes: int, at: float | None = None) -> None:
        """A send finished; ``at``: when it did (``time.perf_counter()``) if the transport knows,
        else now — the time the executor noticed it."""
        key = self._key[peer]
        window = self._windows[key]
        window.inflight -= 1
        if window.start is None:
            return
        window.bytes += nbytes
        if window.inflight < self._threshold[peer]:
            seconds = (time.perf_counter() if at is None else at) - window.start
            window.start = None
            self.buffer.offer(Sample("intra" if key == -1 else "inter", self.communicator, self.rank, key,
                                     window.bytes, seconds, time.time(), self.seq))
