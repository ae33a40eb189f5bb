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

**Rate: the dispersion of arrivals.** Inside a window, time runs between arrivals whose
time is known exactly (the executor was blocked waiting for them: ``completed(at=)``,
:meth:`Meters.arrival`); each interval carries the bytes that arrived in it. That leaves
out the sender's start, gloo's receive-ready rendezvous and the first chunk's latency.
An interval far slower than the window's rate (below :data:`GAP_FRACTION` of the rate of the
intervals kept so far; a few rounds) held a gap — the senders had nothing ready (store-and-forward chunks wait for their own
arrival elsewhere), so the port was idle, not slow — and is left out: the window measures
the port while it carries data, as §5's saturated windows do. Arrivals the receiving process noticed together
(it was off the CPU while the data piled up) make intervals of almost no time: one faster than
:data:`BUNCHED_FACTOR` × the median interval's rate is first merged into the interval before it, whose
bytes it carries. A uniformly slower port
slows every interval alike and is measured as such. Each peer's sample is its bytes in the
kept intervals over their total time, so a window's per-peer samples add up to the port's
rate. When no arrival of a window has a known time (gloo's alltoallv completes every
receive of a step at once), the window runs from the N-th post to the last completion.

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
import statistics
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
# An interval between arrivals slower than this fraction of the window's rate held a gap (module
# docstring; the rate recomputed over the kept intervals GAP_ROUNDS times). 0.5: a gap longer
# than the interval's own transfer time.
GAP_FRACTION = 0.5
GAP_ROUNDS = 3
# An interval faster than this many times the median interval's rate was noticed together with the arrival
# before it (:func:`_merge_bunched`).
BUNCHED_FACTOR = 2.0


class _Window:
    """One receiving port's window (module docstring)."""

    __slots__ = ("inflight", "opened", "anchor", "pending", "intervals", "total")

    def __init__(self) -> None:
        self.inflight = 0  # receives of this port posted and not yet complete
        self.opened: float | None = None  # when the N-th receive was posted (None: closed)
        self.anchor: float | None = None  # the latest arrival with a known time in the window
        self.pending: dict[int, int] = {}  # bytes per peer that arrived since the anchor
        self.intervals: list[tuple[float, dict[int, int]]] = []  # (seconds, bytes per peer)
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
            window.anchor = None
            window.pending, window.intervals, window.total = {}, [], {}

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
        if window.anchor is not None:
            window.pending[peer] = window.pending.get(peer, 0) + nbytes
            if at is not None:
                window.intervals.append((at - window.anchor, window.pending))
                window.pending = {}
        if at is not None:
            window.anchor = at
        if window.inflight < self._thresholds[port]:
            self._close(window, port)

    def _close(self, window: _Window, port: int) -> None:
        opened, window.opened = window.opened, None
        if window.anchor is None:  # no arrival with a known time: from the N-th post to now
            per_peer, seconds = window.total, time.perf_counter() - opened
        else:
            intervals = window.intervals
            if window.pending:  # arrivals after the last known one: up to when they were noticed (an upper bound)
                intervals.append((time.perf_counter() - window.anchor, window.pending))
            kept = _merge_bunched([(max(seconds, 0.0), moved, sum(moved.values())) for seconds, moved in intervals])
            for _ in range(GAP_ROUNDS):
                seconds = sum(item[0] for item in kept)
                if seconds <= 0:
                    return
                floor = GAP_FRACTION * sum(item[2] for item in kept) / seconds
                kept = [item for item in kept if item[2] >= floor * item[0]]
            per_peer, seconds = {}, sum(item[0] for item in kept)
            for _, moved, _ in kept:
                for sender, nbytes in moved.items():
                    per_peer[sender] = per_peer.get(sender, 0) + nbytes
        if seconds <= 0:
            return
        kind, end = (INTRA if port else INTER), time.time()
        for sender, nbytes in per_peer.items():
            if nbytes > 0:
                self.buffer.offer(Sample(kind, self.communicator, sender, self.rank, nbytes, seconds, end, self.seq))


def _merge_bunched(intervals: list[tuple[float, dict[int, int], int]]) -> list[tuple[float, dict[int, int], int]]:
    """Intervals (seconds, bytes per peer, bytes) with every one faster than :data:`BUNCHED_FACTOR` × the
    (lower) median interval's rate merged into the one before it: arrivals the receiving process noticed together (its
    transport thread or the executor was off the CPU while the data piled up in the socket) carry bytes
    that moved during the interval before. A bunched first interval is dropped (its bytes may have moved
    before the window's first known arrival)."""
    rates = [nbytes / interval_s for interval_s, _, nbytes in intervals if interval_s > 0]
    if not rates:
        return []
    fast = BUNCHED_FACTOR * statistics.median_low(rates)
    merged: list[tuple[float, dict[int, int], int]] = []
    for interval_s, moved, nbytes in intervals:
        if nbytes <= fast * interval_s:
            merged.append((interval_s, moved, nbytes))
        elif merged:
            before_s, before, before_bytes = merged[-1]
            together = dict(before)
            for sender, count in moved.items():
                together[sender] = together.get(sender, 0) + count
            merged[-1] = (before_s + interval_s, together, before_bytes + nbytes)
    return merged
