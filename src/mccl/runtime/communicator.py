"""A communicator: one transport group, its installed schedules, sequence numbers, hot swap.

Split by concern: this module issues and runs collectives (sequence numbers, the order, the worker thread, the
executor and its telemetry); the schedules themselves — prepared, installed, staged and adopted by the hot swap,
candidates prepared ahead — are :mod:`mccl.runtime.communicator_schedules`'s (a base class).

Every collective issued on a communicator gets the next sequence number (under a
short lock, the "issue" of mccl-paper §6.2.2) and the schedule installed for its
kind at that number; collectives then execute strictly in sequence order (sync calls
on the caller's thread, ``async_op=True`` calls on the communicator's worker thread),
so a hot swap never lets two schedules run at once. A collective kind without an
installed schedule runs torch's own collective on the transport group (the vendor
path; also what ReduceScatter keeps, §3). The collectives themselves (tensor shapes,
reductions, the pre-flight agreement) are in :mod:`mccl.runtime.collectives`;
:attr:`Communicator.calls` records which path ran each one (:mod:`mccl.runtime.calls`).
``slice_bytes``: the executor's pipelining grain (:mod:`mccl.schedule.slicing`), the same on
every rank; the torch backend sets it per transport (:func:`mccl.runtime.backend_transports.slice_bytes`).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from mccl.errors import PeerLost
from mccl.runtime import executor, torch_private
from mccl.runtime.calls import CallLog
from mccl.runtime.collectives import Collectives
from mccl.runtime.communicator_schedules import Installed, _Schedules
from mccl.runtime.hotswap import ControlChannel, SwapRecord, SwapThread
from mccl.runtime.sendgate import SendGate
from mccl.runtime.sources import LocalScheduleSource, ScheduleSource, TelemetrySink
from mccl.runtime.telemetry import Meters, TelemetryBuffer, TelemetryConfig
from mccl.runtime.transport import Transport
from mccl.schedule import Collective, Schedule
from mccl.schedule.slicing import SLICE_BYTES
from mccl.topology import Topology

__all__ = ["Communicator", "Installed", "collective_size_bytes"]

log = logging.getLogger("mccl.runtime")


def collective_size_bytes(buffers: executor.Buffers) -> int:
    """The nccl-tests size S of one call on this rank (DESIGN.md, "Units"): AllToAll, the rank's send
    buffer (self block included); AllGather, ReduceScatter and AllReduce, the sum of the call's n blocks
    of S/n (:mod:`mccl.schedule.ir`) — the size the controller's guard predicts at and the simulator's
    executors report."""
    template = buffers.template if buffers.template is not None else next(
        (tensor for tensor in buffers.tensors if tensor is not None), None)
    if template is None:
        return 0
    if buffers.kind == "all_to_all":
        send = buffers.tensors[0]
        return 0 if send is None else send.numel() * send.element_size()
    return int(np.sum(buffers.block_elems)) * template.element_size()


class Communicator(_Schedules, Collectives):
    """See module docstring. Build one with :func:`mccl.runtime.init`; methods mirror torch.distributed."""

    def __init__(self, transport: Transport, *, name: str, topology: Topology | None = None,
                 schedules: Sequence[Schedule] = (), source: ScheduleSource | None = None,
                 sink: TelemetrySink | None = None, telemetry: TelemetryConfig | None = None,
                 control: ControlChannel | None = None, driver: str | None = None, poll_s: float = 0.02,
                 check: bool = False, slice_bytes: float = SLICE_BYTES) -> None:
        self.transport = transport
        self.name = name
        self.rank = transport.rank
        self.size = transport.size
        self.topology = topology
        self.driver = driver
        self.check = check  # the pre-flight agreement of every collective (mccl.runtime.agreement)
        # the executor's pipelining grain (mccl.schedule.slicing); every rank of the group must use the same
        self.slice_bytes = slice_bytes
        self.send_gate: SendGate | None = None  # a time-shared tenant's gate (mccl.runtime.sendgate, MCCS TS)
        self.calls = CallLog()  # which path ran each call (mccl.runtime.calls)
        self._installed: dict[Collective, Installed] = {}
        self._staged: dict[Collective, dict[int, Installed]] = {}
        self._pending: list[tuple[int, dict[Collective, Installed]]] = []
        self._issue_lock = threading.Lock()
        self._seq = 0
        self._turn = threading.Condition()
        self._next_to_run = 1
        self._worker_queue: queue.SimpleQueue | None = None
        self._worker: threading.Thread | None = None
        self._local = LocalScheduleSource()
        self._source = source
        self.swaps: list[SwapRecord] = []
        # candidates prepared ahead (mccl.runtime.hotswap), by schedule digest; (kind, version, wall clock,
        # seconds) of each; how many later stagings found theirs there
        self._prestaged: dict[str, Installed] = {}
        self.prestages: collections.deque[tuple[str, int, float, float]] = collections.deque(maxlen=64)
        self.prestage_hits = 0
        # (seq, wall clock, {collective: version}) of each launch that first ran an adopted version (the last of
        # the reaction path, Fig. 13b: the first collective launched on the new version)
        self.switches: collections.deque[tuple[int, float, dict[str, int]]] = collections.deque(maxlen=256)
        self.events: collections.deque[str] = collections.deque(maxlen=256)
        self.controller_lost = False
        self.broken: str | None = None  # why the transport group broke (a peer lost), once it has
        self.history: collections.deque[tuple[int, str | None, int | None]] = collections.deque(maxlen=4096)
        for schedule in schedules:
            installed = self._prepare(schedule)
            self._installed[installed.schedule.collective] = installed
        self._telemetry: TelemetryBuffer | None = None
        self._meters: Meters | None = None
        if sink is not None:
            self.attach_telemetry(sink, telemetry)
        # the hold (mccl.runtime.hotswap, "The hold"): a launch during a swap round waits, once per round, at most
        # this long for the round to end (None: never); ``holds``: (seq about to launch, wall clock, seconds held)
        self.swap_hold_s: float | None = None
        # the swap thread's niceness steps above this rank's main thread (mccl.runtime.hotswap "Priority"; None: off)
        self.swap_priority: int | None = None
        self.holds: collections.deque[tuple[int, float, float]] = collections.deque(maxlen=256)
        self._round_idle = threading.Event()
        self._round_idle.set()
        self._rounds_opened = 0
        self._held_in_round = 0
        self._swapper = SwapThread(self, control, poll_s) if control is not None else None

    @property
    def seq(self) -> int:
        """The sequence number of the last collective launched on this communicator."""
        return self._seq

    # ---- issuing and running ----------------------------------------------------------
    def _hold_for_round(self) -> None:
        """Wait, once per swap round and at most ``swap_hold_s``, for the round in progress to end
        (:mod:`mccl.runtime.hotswap`, "The hold"); outside the issue lock, which the round's exchange takes."""
        hold = self.swap_hold_s
        if not hold or self._round_idle.is_set() or self._held_in_round == self._rounds_opened:
            return
        self._held_in_round = self._rounds_opened
        start, at = time.perf_counter(), time.time()
        self._round_idle.wait(hold)
        self.holds.append((self._seq + 1, at, time.perf_counter() - start))

    def _launch(self, kind: Collective | None) -> tuple[int, Installed | None]:
        self._hold_for_round()
        with self._issue_lock:
            if self.broken is not None:
                raise PeerLost(f"communicator {self.name!r} cannot run collectives any more: {self.broken}; "
                               "its process group is broken (create a new one)")
            self._seq += 1
            seq = self._seq
            while self._pending and seq > self._pending[0][0]:
                changes = self._pending.pop(0)[1]
                self._installed.update(changes)
                self.switches.append((seq, time.time(), {kind.value: item.version for kind, item in changes.items()}))
            installed = self._installed.get(kind) if kind is not None else None
            self.history.append((seq, kind.value if kind is not None else None,
                                 installed.version if installed is not None else None))
            return seq, installed

    def _run_in_order(self, seq: int, body: Callable[[], None]) -> None:
        with self._turn:
            while self._next_to_run != seq:
                self._turn.wait()
        try:
            body()
        finally:
            with self._turn:
                self._next_to_run = seq + 1
                self._turn.notify_all()

    def _submit(self, kind: Collective | None, op: str, body: Callable[[int, Installed | None], int | None],
                result: list[torch.Tensor], async_op: bool) -> object | None:
        """Run ``body`` in sequence order (now, or on the worker thread when ``async_op``) and record
        which path it took: the schedule version it returns, or None (delegated to the transport)."""
        seq, installed = self._launch(kind)
        name = f"{kind.value if kind is not None else 'barrier'} #{seq}"  # (what PeerLost messages name)

        def run() -> None:
            try:
                self.calls.record(seq, op, body(seq, installed))
            except PeerLost as error:
                self.broken = f"{name} failed on rank {self.rank}: {error}"
                log.error("mccl: communicator %r: %s", self.name, self.broken)
                raise PeerLost(f"communicator {self.name!r}: {self.broken}") from error

        if not async_op:
            self._run_in_order(seq, run)
            return None
        future: torch.futures.Future = torch.futures.Future()
        self._ensure_worker()
        self._worker_queue.put((seq, run, future, result))
        return torch_private.work_from_future(future)

    def _ensure_worker(self) -> None:
        if self._worker is None:
            self._worker_queue = queue.SimpleQueue()
            self._worker = threading.Thread(target=self._work_forever, name="mccl-worker", daemon=True)
            self._worker.start()

    def _work_forever(self) -> None:
        while True:
            item = self._worker_queue.get()
            if item is None:
                return
            seq, run, future, result = item
            try:
                self._run_in_order(seq, run)
                future.set_result(result)
            except BaseException as error:
                future.set_exception(error)

    def _execute(self, installed: Installed, buffers: executor.Buffers, seq: int) -> None:
        meters = self._meters
        if meters is None:
            executor.execute(self.transport, installed.plan, buffers, seq=seq, meters=None,
                             layout_cache=installed.layouts, driver=self.driver, gate=self.send_gate,
                             slice_bytes=self.slice_bytes)
            return
        meters.seq = seq
        start = time.perf_counter()
        executor.execute(self.transport, installed.plan, buffers, seq=seq, meters=meters,
                         layout_cache=installed.layouts, driver=self.driver, gate=self.send_gate,
                         slice_bytes=self.slice_bytes)
        # the rank's whole collective, for the guard's clock (mccl.runtime.telemetry, "One rank's whole collective")
        meters.collective(seq, installed.schedule.collective.value, installed.version, collective_size_bytes(buffers),
                          time.perf_counter() - start)

    # ---- telemetry and shutdown -------------------------------------------------------
    @property
    def telemetry_dropped(self) -> int:
        return self._telemetry.dropped if self._telemetry is not None else 0

    def flush_telemetry(self) -> None:
        if self._telemetry is not None:
            self._telemetry.flush()

    def close(self) -> None:
        """Stop the background threads (after the queued collectives) and say goodbye to the peers'
        liveness watchers (a departure, not a loss: :mod:`mccl.runtime.liveness`); the group stays."""
        if self._swapper is not None:
            self._swapper.stop()
        if self._worker is not None:
            self._worker_queue.put(None)
            self._worker.join(timeout=30)
            self._worker = None
        if self._telemetry is not None:
            self._telemetry.close()
        self.transport.close()

    def attach_telemetry(self, sink: TelemetrySink, config: TelemetryConfig | None = None) -> None:
        """Start measuring into ``sink`` (e.g. on a communicator created by the "mccl" backend)."""
        config = config or TelemetryConfig()
        if not config.enabled:
            return
        if self._telemetry is not None:
            self._telemetry.close()
        self._telemetry = TelemetryBuffer(sink, config, calls=lambda: self.calls.totals(self.name, self.rank))
        self._meters = Meters(self.name, self.rank, self._same_host(), self._telemetry, config)
