"""Passive telemetry of the executor (mccl-paper §5, adapted to point-to-point operations).

What is measured: the **receives** a rank performs — a receive completes when its last
byte has arrived, so the receiving end is where the wire's rate shows. (Timed at the send
side, a window opened when a send was posted, but a gloo send transmits only once the
peer's receive-ready notice has arrived, and it "completes" once its bytes are in the
socket buffer: the 2026-12-01 loop read 42–49 % of the shaped rate that way.) A sample
describes the path ``sender → this rank`` and is reported as ``Sample(rank=sender,
peer=receiver)`` (:class:`mccl.telemetry.Sample`: the path's ends, whichever one measured).

**Windows per receiving port.** Every receive from another host arrives through this
rank's NIC, every receive from its own host through its host fabric (NVLink), so the
saturation rule of §5.1 ("active channels ≥ threshold N") is applied per port: a window
is open while at least N receives of that kind (inter / intra) are in flight (posted,
not yet complete), whichever peers they come from — per pair, the 1–2 chunks a tree
sends through one NIC per collective would rarely open one.

**Rate: the dispersion of arrivals.** A window runs from its first arrival whose time is
known exactly (the executor was blocked waiting for it: ``completed(at=)``,
:meth:`Meters.arrival`) to its last arrival (exact, or when it was noticed: a bound from
above), and counts the bytes that arrived after the first. That leaves out the sender's
start, gloo's receive-ready rendezvous and the first chunk's latency. Only the sum means
something: the executor waits for receives in its own order, so arrivals in between are
noticed only later, in bunches (measured: every other 64 KiB slice of a ring noticed at the
end), and the time between two single arrivals is not one chunk's transfer time. Each peer's
sample is its bytes in the window over the window's time, so a window's per-peer samples add
up to the port's rate. When no arrival of a window has a known time (gloo's alltoallv
completes every receive of a step at once), the window runs from the N-th post to the last
completion, which includes the ranks' skew: the exchange driver's samples read low (the loop's
AllToAll −49 %), so a metered communicator runs the eager driver for every collective
(:func:`mccl.runtime.executor.default_driver`). The rate is right only while the port is saturated
from the first timed arrival to the last: a sender with nothing to send in between (a relay waiting
for its own input) reads as a slower link, and arrivals in lumps (an emulated NIC passing 64 KiB GSO
segments whole at 20 Mbit/s: one per 27 ms) leave a window a handful of lump edges
(BENCHMARKS.md, 2026-12-01 fourth session).

Off the critical path: a collective only appends to a bounded deque; a thread that
idle-waits on an event hands batches to the sink. A full buffer drops the sample and
counts it (``dropped``); nothing ever blocks a collective.

**One rank's whole collective** (:meth:`Meters.collective`): besides the path windows, a rank reports
each collective it ran on a schedule as a ``"collective"`` sample — its time from the executor's start
to its completion on this rank, ``peer`` -1, ``bytes`` the collective's nccl-tests size S, tagged with
the collective and the schedule version — the samples the simulator's virtual executors send
(:mod:`mccl.experiments.closedloop_sim`). Why: the controller's guard checks that its measured fabric
explains the time the active collective is observed to take (:mod:`mccl.control.guard`).

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
from mccl.telemetry import COLLECTIVE, INTER, INTRA

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
BLOCKED_WAIT_S = 1e-3


class _Window:
    """One receiving port's window (module docstring)."""

    __slots__ = ("inflight", "opened", "first", "last", "after", "total")

    def __init__(self) -> None:
        self.inflight = 0  # receives of this port posted and not yet complete
        self.opened: float | None = None  # when the N-th receive was posted (None: closed)
        self.first: float | None = None  # the first arrival with a known time in the window
        self.last = 0.0  # the latest arrival (known, or when it was noticed)
        self.after: dict[int, int] = {}  # bytes per peer that arrived after ``first``
        self.total: dict[int, int] = {}  # bytes per peer of every completion in the window


class Meters:
    """The receive windows of one rank of one communicator, per port (module docstring)."""

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
        self._port = [1 if same else 0 for same in same_host]  # 0: the NIC (inter), 1: the host fabric (intra)
        self._windows = (_Window(), _Window())
        self._thresholds = (self.config.threshold_inter, self.config.threshold_intra)

    def posted(self, peer: int, nbytes: int) -> None:
        """A receive of ``nbytes`` from ``peer`` was posted."""
        port = self._port[peer]
        window = self._windows[port]
        window.inflight += 1
        if window.opened is None and window.inflight >= self._thresholds[port]:
            window.opened = time.perf_counter()
            window.first = None
            window.after, window.total = {}, {}

    @staticmethod
    def arrival(began: float) -> float | None:
        """Called right after a wait that began at ``began`` (``time.perf_counter()``) returned: now,
        if the wait was blocked until the operation completed; None if it had completed before."""
        now = time.perf_counter()
        return now if now - began > BLOCKED_WAIT_S else None

    def completed(self, peer: int, nbytes: int, at: float | None = None) -> None:
        """A receive from ``peer`` completed. ``at``: when its last byte arrived
        (``time.perf_counter()``), if known — the executor's wait for it was blocked until then
        (:meth:`arrival`); None: it completed at an unknown time before now."""
        port = self._port[peer]
        window = self._windows[port]
        window.inflight -= 1
        if window.opened is None:
            return
        window.total[peer] = window.total.get(peer, 0) + nbytes
        if window.first is not None:
            window.after[peer] = window.after.get(peer, 0) + nbytes
            window.last = max(window.last, time.perf_counter() if at is None else at)
        elif at is not None:
            window.first = window.last = at
        if window.inflight < self._thresholds[port]:
            self._close(window, port)

    def _close(self, window: _Window, port: int) -> None:
        opened, window.opened = window.opened, None
        if window.first is None:  # no arrival with a known time: from the N-th post to now
            per_peer, seconds = window.total, time.perf_counter() - opened
        else:
            per_peer, seconds = window.after, window.last - window.first
        if seconds <= 0:
            return
        kind, end = (INTRA if port else INTER), time.time()
        for sender, nbytes in per_peer.items():
            if nbytes > 0:
                self.buffer.offer(Sample(kind, self.communicator, sender, self.rank, nbytes, seconds, end, self.seq))

    def collective(self, seq: int, collective: str, version: int, size_bytes: int, seconds: float) -> None:
        """This rank ran collective ``seq`` (``collective``, schedule ``version``, nccl-tests size
        ``size_bytes``) in ``seconds`` from start to completion: one ``"collective"`` sample (module
        docstring); never blocks (a full buffer drops it, as any sample)."""
        if seconds > 0 and size_bytes > 0:
            self.buffer.offer(Sample(COLLECTIVE, self.communicator, self.rank, -1, int(size_bytes), float(seconds),
                                     time.time(), seq, collective, int(version)))
