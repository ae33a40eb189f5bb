"""A communicator's schedules (split from :mod:`mccl.runtime.communicator`, which issues and runs collectives):
each one prepared (parsed, validated against the topology, planned for this rank) before it can run, installed at
set-up, staged and adopted through the hot swap (:mod:`mccl.runtime.hotswap`: the swap thread calls the callbacks
here), and candidates prepared ahead of their version by content digest. A base class:
:class:`~mccl.runtime.communicator.Communicator` sets up every attribute used here in its ``__init__``."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mccl.errors import InvalidSchedule, MCCLError
from mccl.runtime.hotswap import ControlChannel, SwapRecord, SwapThread, agree, encode, staged_payload
from mccl.runtime.plan import RankPlan, build_plan
from mccl.runtime.sources import LocalScheduleSource, ScheduleSource
from mccl.runtime.telemetry import Meters
from mccl.schedule import Collective, Schedule, loads_schedule, validate
from mccl.schedule.serialize import schedule_digest
from mccl.topology import Topology

__all__ = ["Installed"]

log = logging.getLogger("mccl.runtime")


@dataclass(frozen=True)
class Installed:
    """A schedule ready to run on this rank: its version and its pre-built plan."""

    version: int
    schedule: Schedule
    plan: RankPlan
    layouts: dict = field(default_factory=dict, compare=False, repr=False)  # element layouts by block sizes


class _Schedules:
    """The installed, staged and prestaged schedules of a communicator, and the swap thread's callbacks."""

    name: str
    rank: int
    size: int
    topology: Topology | None
    _installed: dict[Collective, Installed]
    _staged: dict[Collective, dict[int, Installed]]
    _pending: list[tuple[int, dict[Collective, Installed]]]
    _issue_lock: threading.Lock
    _seq: int
    _local: LocalScheduleSource
    _source: ScheduleSource | None
    _swapper: SwapThread | None
    _meters: Meters | None
    _prestaged: dict[str, Installed]
    prestages: collections.deque[tuple[str, int, float, float]]
    prestage_hits: int
    swaps: list[SwapRecord]
    events: collections.deque[str]
    controller_lost: bool
    _round_idle: threading.Event
    _rounds_opened: int

    # ---- schedules -------------------------------------------------------------------
    def _same_host(self) -> list[bool]:
        installed = next(iter(self._installed.values()), None)
        if self.topology is None or installed is None:
            return [False] * self.size
        hosts = [self.topology.node(gpu).host for gpu in installed.schedule.ranks]
        return [hosts[peer] is not None and hosts[peer] == hosts[self.rank] for peer in range(self.size)]

    def _prepare(self, schedule: Schedule | str | bytes) -> Installed:
        if isinstance(schedule, str | bytes):  # a schedule file's text, as the controller sends it
            schedule = loads_schedule(schedule.decode() if isinstance(schedule, bytes) else schedule)
        if not isinstance(schedule, Schedule):
            raise InvalidSchedule(f"expected a Schedule, got {type(schedule).__name__}")
        if schedule.n_ranks != self.size:
            raise InvalidSchedule(f"the schedule has {schedule.n_ranks} ranks, communicator {self.name!r} {self.size}")
        if self.topology is None:
            raise InvalidSchedule(f"communicator {self.name!r} has no topology to validate the schedule against")
        if self._prestaged:  # prepared ahead as a candidate (mccl.runtime.hotswap): the same content, planned
            ahead = self._prestaged.pop(schedule_digest(schedule), None)
            if ahead is not None:
                self.prestage_hits += 1
                return Installed(int(schedule.meta.version), schedule, ahead.plan)
        validate(schedule, self.topology)
        return Installed(int(schedule.meta.version), schedule, build_plan(schedule, self.rank))

    def _prestage(self, schedule: Schedule) -> None:
        """Prepare a candidate (swap thread): validated and planned now, kept by content digest (the newest
        few) for the version that may follow; one that fails is only logged (it was never adopted)."""
        start = time.perf_counter()
        if schedule_digest(schedule) in self._prestaged:  # the same content again (a re-speculation): held already
            return
        try:
            installed = self._prepare(schedule)
        except MCCLError as error:
            self.events.append(f"candidate refused: {error}")
            return
        self._prestaged[schedule_digest(installed.schedule)] = installed
        while len(self._prestaged) > 4:
            self._prestaged.pop(next(iter(self._prestaged)))
        self.prestages.append((installed.schedule.collective.value, installed.version, time.time(),
                               time.perf_counter() - start))

    def configure(self, *, topology: Topology | None = None, schedules: Sequence[Schedule] = ()) -> None:
        """Set the topology and install schedules: set-up only, before the first collective, on every rank."""
        if topology is not None:
            with self._issue_lock:
                if self._seq:
                    raise MCCLError("configure() is for set-up; once collectives ran, use stage() (hot swap)")
                self.topology = topology
        for schedule in schedules:
            self.install(schedule)

    def install(self, schedule: Schedule) -> None:
        """Install a schedule now, without agreement: only before the first collective, on every rank."""
        installed = self._prepare(schedule)
        with self._issue_lock:
            if self._seq:
                raise MCCLError("install() is for set-up; once collectives ran, use stage() (hot swap)")
            self._installed[installed.schedule.collective] = installed
        if self._meters is not None:
            self._meters.set_hosts(self._same_host())

    def stage(self, schedule: Schedule | str) -> None:
        """Hand a new schedule version (a Schedule or a schedule file's JSON text) to the hot-swap
        thread, which parses, validates and plans it off the critical path; call it on every rank."""
        if self._swapper is None:
            raise MCCLError(f"communicator {self.name!r} has no control channel, so it cannot hot-swap")
        self._local.put(schedule)

    def versions(self) -> dict[str, int]:
        with self._issue_lock:
            return {kind.value: item.version for kind, item in self._installed.items()}

    @property
    def swap_control(self) -> ControlChannel | None:
        """The hot swap's out-of-band channel (None without hot swap)."""
        return self._swapper.control if self._swapper is not None else None

    # ---- hot-swap callbacks (called on the swap thread) ---------------------------------
    def _take_request(self, timeout: float) -> Schedule | None:
        # a source that can wait (the controller's client: the service pushes new versions) is where the idle
        # wait happens, so a pushed version is staged the moment it lands; a schedule stage()d locally is then
        # picked up within ``timeout``
        wait = getattr(self._source, "wait", None)
        staged = self._local.get(0.0 if wait is not None else timeout)  # idle wait
        if staged is not None:
            return staged
        if self._source is not None:  # asked even when lost: a controller that answers again is taken back
            found = wait(timeout) if wait is not None else self._source.poll()
            if self.controller_lost:
                self.controller_lost = False
                self.events.append("controller answers again")
            return found
        return None

    def _controller_lost(self, reason: str) -> None:
        self.controller_lost = True
        self.events.append(f"controller lost: {reason}")

    def _swap_failed(self, reason: str) -> None:
        self.events.append(f"swap failed: {reason}")

    def _stage(self, schedule: Schedule) -> str | None:
        try:
            installed = self._prepare(schedule)  # parse, validate, pre-build the plan
            current = self._installed.get(installed.schedule.collective)
            if current is not None and installed.version <= current.version:
                raise InvalidSchedule(f"version {installed.version} is not newer than the installed "
                                      f"{current.version} of {installed.schedule.collective.value}")
        except MCCLError as error:
            log.error("mccl: rejected a staged schedule on rank %d: %s", self.rank, error)
            self.events.append(f"rejected: {error}")
            return str(error)
        self._staged.setdefault(installed.schedule.collective, {})[installed.version] = installed
        return None

    def _sync_round(self, exchange: Callable[[bytes], list[bytes]]) -> tuple[int, dict[str, int], float]:
        staged = staged_payload(self._staged)  # versions with content digests (issue 13)
        with self._issue_lock:  # hold the issuing of new collectives only for the exchange
            start = time.perf_counter()
            payloads = exchange(encode(self._seq, staged))
            switch_after, adopted = agree(payloads)
            changes: dict[Collective, Installed] = {}
            for kind_name, version in adopted.items():
                kind = Collective(kind_name)
                current = self._installed.get(kind)
                if current is None or version > current.version:
                    changes[kind] = self._staged[kind][version]
            if changes:
                self._pending.append((switch_after, changes))
            oob_s = time.perf_counter() - start
        for kind_name, version in adopted.items():
            kind = Collective(kind_name)
            self._staged[kind] = {v: item for v, item in self._staged[kind].items() if v > version}
        return switch_after, adopted, oob_s

    def _record(self, record: SwapRecord) -> None:
        self.swaps.append(record)

    def _round_opened(self) -> None:
        self._rounds_opened += 1
        self._round_idle.clear()

    def _round_closed(self) -> None:
        self._round_idle.set()
