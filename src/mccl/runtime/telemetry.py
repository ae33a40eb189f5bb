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
opens when at least N receives of that kind (inter / intra) are in flight (posted, not yet
complete), whichever peers they come from, and closes when none is left — per pair, the 1–2
chunks a tree sends through one NIC per collective would rarely open one. Concurrent transfers
on the port are one window: its rate is the port's.

**What a sample means: the port's rate while it was busy.** Each window's rate is computed by
:func:`mccl.runtime.windows.port_rate` from what the window knows — when each receive's last
byte arrived (:mod:`mccl.runtime.arrivals`: waiter threads stamp nearly every arrival; the
executor alone saw half of them late), and on the NIC its byte counter, read at every stamped
arrival and every ``counter_interval_s`` while the window is open. The rate counts from the
first known arrival to the last (the first transfer's unknown start, gloo's rendezvous and the
first chunk's latency drop out), and **time when the port carried nothing is not busy time**: a
relay waiting for its own input, the PXN AllToAll's rail peer waiting for what it forwards —
from the counter where it is read, from one sender's own sequence of arrivals otherwise. Each
peer's sample is its bytes in the window over the window's busy time, so a window's per-peer
samples add up to the port's busy rate: its capacity whenever the port was saturated at all in
the window (the emulated fabric: within 5 % of the shaped rate for the loop's AllGather and
AllToAll, healthy and with the NIC halved; BENCHMARKS.md, 2026-12-01 fifth session). When no
arrival of a window has a known time (gloo's alltoallv completes every receive of a step at
once), the window runs from the N-th post to the last completion, which includes the ranks'
skew: the exchange driver's samples read low (the loop's AllToAll −49 %), so a metered
communicator runs the eager driver for every collective
(:func:`mccl.runtime.executor.default_driver`).

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

from mccl.runtime.arrivals import ArrivalClock, TimedReceive, nic_payload_share, nic_rx_counter, stamp
from mccl.runtime.calls import CallTotals
from mccl.runtime.sources import CallSink, Sample, TelemetrySink
from mccl.runtime.windows import Arrival, port_rate
from mccl.telemetry import COLLECTIVE, INTER, INTRA

__all__ = ["TelemetryConfig", "TelemetryBuffer", "Meters"]

log = logging.getLogger("mccl.runtime")


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    """``threshold_inter`` / ``threshold_intra``: receives from one peer in flight (N of §5.1) that
    open its window.
    ``capacity``: samples buffered before dropping; ``batch``: samples per ``submit``;
    ``flush_interval_s``: how often the telemetry thread wakes up.
    ``nic_counter``: read the NIC's received-bytes counter (the NIC named by ``GLOO_SOCKET_IFNAME``; none
    named, or the loopback: not read) at every arrival through it, timed by ``arrival_waiters`` threads
    (:mod:`mccl.runtime.arrivals`; 0: no counter, only the executor's own blocked waits are timed), and every
    ``counter_interval_s`` while a NIC window is open (a thread that sleeps otherwise)."""

    enabled: bool = True
    threshold_inter: int = 2
    threshold_intra: int = 2
    capacity: int = 8192
    batch: int = 512
    flush_interval_s: float = 0.05
    arrival_waiters: int = 8
    nic_counter: bool = True
    counter_interval_s: float = 0.01


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
        self.on_close: list[Callable[[], None]] = []  # e.g. the meters' arrival waiters
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
        for close in self.on_close:
            close()

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
    """One receiving port's window (module docstring)."""

    __slots__ = ("inflight", "opened", "arrivals", "noticed", "base", "readings")

    def __init__(self) -> None:
        self.inflight = 0  # receives of this port posted and not yet complete
        self.opened: float | None = None  # when the N-th receive was posted (None: closed)
        self.arrivals: list[Arrival] = []  # the receives completed in the window
        self.noticed = 0.0  # when the last of them was noticed complete
        self.base: int | None = None  # the NIC's byte counter when the window opened (inter port, if read)
        self.readings: list[tuple[float, int]] = []  # (time, NIC counter) read by the sampler meanwhile


class Meters:
    """The receive windows of one rank of one communicator, per port (module docstring)."""

    def __init__(self, communicator: str, rank: int, same_host: Sequence[bool], buffer: TelemetryBuffer,
                 config: TelemetryConfig) -> None:
        self.communicator = communicator
        self.rank = rank
        self.buffer = buffer
        self.config = config
        self.seq = 0
        # waiters only where the NIC's counter is read: it needs its points at the arrivals, and elsewhere
        # (the host fabric, a loopback transport) a waiter's hand-over per receive costs more CPU than the
        # arrival times gain (measured on loopback: +55 % CPU per AllGather with every receive watched)
        self._counter = nic_rx_counter() if config.nic_counter and config.arrival_waiters > 0 else None
        self._wire_share = nic_payload_share() if self._counter is not None else None  # payload per counted byte
        self.arrivals = (ArrivalClock(config.arrival_waiters, self._counter, counted=self._through_nic)
                         if self._counter is not None else None)
        if self.arrivals is not None:
            buffer.on_close.append(self.arrivals.close)
        self._sampling = threading.Event()  # set while the NIC's window is open
        self._closed = False
        if self._counter is not None:
            threading.Thread(target=self._sample_forever, name="mccl-nic-counter", daemon=True).start()
            buffer.on_close.append(self._stop_sampling)
        self.set_hosts(same_host)

    def _through_nic(self, peer: int) -> bool:
        return 0 <= peer < len(self._port) and self._port[peer] == 0

    def set_hosts(self, same_host: Sequence[bool]) -> None:
        """Which peers share this rank's host (from the topology of the installed schedules)."""
        self._port = [1 if same else 0 for same in same_host]  # 0: the NIC (inter), 1: the host fabric (intra)
        self._windows = (_Window(), _Window())
        self._thresholds = (self.config.threshold_inter, self.config.threshold_intra)

    def posted(self, peer: int, nbytes: int, now: float | None = None) -> None:
        """A receive of ``nbytes`` from ``peer`` was posted (``now``: ``time.perf_counter()``, default now)."""
        port = self._port[peer]
        window = self._windows[port]
        window.inflight += 1
        if window.opened is None and window.inflight >= self._thresholds[port]:
            window.opened = time.perf_counter() if now is None else now
            window.arrivals = []
            window.base = self._counter() if self._counter is not None and port == 0 else None
            window.readings = []
            if window.base is not None:
                self._sampling.set()

    @staticmethod
    def arrival(began: float | None, work: object = None, ended: float | None = None) -> float | None:
        """Called after the executor's wait (begun at ``began``, ``time.perf_counter()``; None: the
        operation was found done) on ``work`` returned (at ``ended``; None: just now): when its last byte
        arrived, or None if unknown. A :class:`~mccl.runtime.arrivals.TimedReceive` knows (a waiter thread or
        this wait stamped it); otherwise the return, if the wait was blocked until the operation completed."""
        if isinstance(work, TimedReceive):
            return work.arrived
        return None if began is None else stamp(began, ended)

    def received(self, peer: int, nbytes: int, began: float | None, work: object, ended: float | None = None) -> None:
        """The wait on the receive ``work`` from ``peer`` (begun at ``began``; None: found done) returned (at
        ``ended``, a waiter thread's; None: just now): :meth:`completed` with what is known of its arrival."""
        counted = work.counted if isinstance(work, TimedReceive) else None
        self.completed(peer, nbytes, self.arrival(began, work, ended), now=ended, counted=counted)

    def completed(self, peer: int, nbytes: int, at: float | None = None, now: float | None = None,
                  counted: int | None = None) -> None:
        """A receive from ``peer`` completed. ``at``: when its last byte arrived (``time.perf_counter()``),
        if known (:meth:`arrival`); None: it completed at an unknown time before now. ``now``: when the
        completion was noticed (default: now). ``counted``: the NIC's byte counter right after ``at``."""
        port = self._port[peer]
        window = self._windows[port]
        window.inflight -= 1
        if window.opened is None:
            return
        window.noticed = time.perf_counter() if now is None else now
        window.arrivals.append(Arrival(peer, nbytes, at, counted if port == 0 else None, window.noticed))
        if window.inflight <= 0:
            self._close(window, port)

    def _sample_forever(self) -> None:
        """Read the NIC's counter every ``counter_interval_s`` while its window is open (idle otherwise)."""
        interval, counter, window = self.config.counter_interval_s, self._counter, None
        while not self._closed:
            if not self._sampling.wait(1.0):
                continue
            window = self._windows[0]
            if window.opened is not None:
                window.readings.append((time.perf_counter(), counter()))
            time.sleep(interval)  # an idle wait: the GIL is free

    def _stop_sampling(self) -> None:
        self._closed = True
        self._sampling.set()

    def _close(self, window: _Window, port: int) -> None:
        window.inflight = 0
        opened, window.opened = window.opened, None
        if port == 0:
            self._sampling.clear()
        rate = port_rate(window.arrivals, base=window.base, readings=window.readings,
                         wire_share=self._wire_share if port == 0 else None)
        if rate is not None:
            per_peer, seconds = rate.per_peer, rate.seconds
        else:  # fewer than two known arrivals (one alltoallv per step): from the N-th post to the last notice
            per_peer, seconds = {}, window.noticed - opened
            for arrival in window.arrivals:
                per_peer[arrival.peer] = per_peer.get(arrival.peer, 0) + arrival.nbytes
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
