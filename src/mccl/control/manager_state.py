"""The Schedule Manager's state and intake (split from :mod:`mccl.control.manager`, which keeps the decisions):
registering schedules, the versions the ranks fetch, and folding telemetry into the EWMAs; a new version's
references relearned (:meth:`_ManagerState._relearn`; why per version: the manager's module docstring,
"References per version"). A base class: :class:`~mccl.control.manager.ScheduleManager` sets up every attribute
used here in its ``__init__``."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from mccl.control.config import ControlConfig
from mccl.control.drift import merge_maps, overlay_map, profile
from mccl.control.ewma import OverlayEWMA
from mccl.control.guard import Guard
from mccl.control.intake import Batch, fold
from mccl.control.observed import CollectiveClock
from mccl.control.opportunity import Opportunities
from mccl.control.prepared import PreparedSchedule
from mccl.control.records import Event, EventLog, _Active, _Communicator
from mccl.errors import ControllerError, MCCLError
from mccl.schedule import Collective, Schedule, validate
from mccl.schedule.serialize import schedule_digest
from mccl.synth import SynthesisResult
from mccl.telemetry import Sample
from mccl.topology import Topology

__all__: list[str] = []

log = logging.getLogger("mccl.control")


class _ManagerState:
    """Registration, the versions the ranks fetch, and the telemetry intake of a schedule manager."""

    topology: Topology
    config: ControlConfig
    guard: Guard
    events: EventLog
    opportunities: Opportunities
    samples_taken: int
    samples_ignored: int
    _nominal: np.ndarray
    _lock: threading.Lock
    _comms: dict[str, _Communicator]
    _ingested_at: dict[str, float]
    _adopted: dict[str, SynthesisResult]  # by schedule digest: results this controller made (:meth:`adopt`)

    # ---- state ------------------------------------------------------------------------
    def _event(self, kind: str, comm: str, collective: Collective, version: int, value: float = 0.0,
               text: str = "") -> None:
        self.events.append(Event(time.time(), kind, comm, collective.value, version, value, text))

    def _activate(self, comm: _Communicator, schedule: Schedule, result: SynthesisResult | None, version: int,
                  on: Topology, text: str | None = None, prepared: PreparedSchedule | None = None) -> _Active:
        covered = overlay_map(schedule, on) if prepared is None else prepared.coverage
        comm.coverage = covered if comm.coverage is None else merge_maps(comm.coverage, covered)
        if self.config.guard:
            self.guard.prepare(schedule)  # a cache hit for a candidate the guard just predicted
        cut = profile(schedule, len(on.links)) if prepared is None else prepared.cut
        return _Active(schedule, result, version, cut,
                       judge_after_seq=comm.last_seq + self.config.settle_collectives, _text=text,
                       schedule_format=self.config.schedule_format)

    def adopt(self, result: SynthesisResult) -> None:
        """Keep ``result``, synthesized by this controller on its own topology, for a rank's registration of the
        same schedule (:mod:`.ahead`, "The registered schedule's solver state"): the first flag's synthesis then
        restarts from its solver state instead of the schedule's routes."""
        made_for = result.schedule.meta.topology
        if made_for != self.topology.name:
            raise ControllerError(f"adopt: the result was made for topology {made_for!r}, not the manager's "
                                  f"{self.topology.name!r}")
        with self._lock:
            self._adopted[schedule_digest(result.schedule)] = result

    def _adopted_for(self, schedule: Schedule) -> SynthesisResult | None:
        """The adopted result whose schedule makes the ranks do what ``schedule`` does, around ``schedule``."""
        with self._lock:
            if not self._adopted:
                return None
            adopted = self._adopted.get(schedule_digest(schedule))
        return None if adopted is None else replace(adopted, schedule=schedule, origin=None)

    def register(self, communicator: str, schedule: Schedule, *, result: SynthesisResult | None = None,
                 size_bytes: float | None = None, text: str | None = None,
                 prepared: PreparedSchedule | None = None) -> int:
        """Make ``schedule`` the active one of ``communicator`` (startup, §3.1 ⓪); returns its version.
        ``text``: ``dumps_schedule(schedule)`` when the caller has it (the service computes it in its
        parser process: 1.7 s of GIL-holding work for a 38 MiB schedule, issue 13). ``prepared``: the
        schedule validated and its overlay map and profile computed (:mod:`.prepared`; the service's parser
        process does it, another ~0.75 s for 38 MiB), taken instead of computing them here.

        A version not newer than the active one is ignored (every rank may register). ``result``: the
        synthesis result ``schedule`` comes from, when the caller has it (its warm state is then used
        by the first re-synthesis, as for the manager's own). ``size_bytes``: the job's nccl-tests size
        S of this collective, for the guard (else inferred from telemetry)."""
        if result is not None and result.schedule is not schedule:
            raise ControllerError("register: result= must be the synthesis result of the registered schedule")
        if size_bytes is not None and not (size_bytes > 0 and math.isfinite(size_bytes)):
            raise ControllerError(f"register: size_bytes must be a positive number of bytes, got {size_bytes}")
        if prepared is None:
            validate(schedule, self.topology)
        else:
            prepared.check(schedule, self.topology)
        if result is None:
            result = self._adopted_for(schedule)
        version = int(schedule.meta.version)
        if self.config.guard:  # the NCCL-style baseline is built now, at start-up, not in the first decision
            try:
                self.guard.baseline(communicator, schedule.collective, schedule.ranks)
            except MCCLError as error:
                log.warning("mccl controller: no NCCL-style baseline for %s (%s)", communicator, error)
        with self._lock:
            comm = self._comms.get(communicator)
            if comm is None:
                comm = self._comms[communicator] = _Communicator(
                    OverlayEWMA(schedule.n_ranks, self.config.alpha, warmup=self.config.warmup),
                    clock=CollectiveClock(self.config.alpha_level or self.config.alpha, keep=self.config.warmup))
                if self.config.alpha_level is not None:
                    comm.level = OverlayEWMA(schedule.n_ranks, self.config.alpha_level, warmup=self.config.warmup)
                comm.startup_through = comm.ignore_through = self.config.settle_collectives
            elif comm.ewma.n_ranks != schedule.n_ranks:
                raise ControllerError(f"communicator {communicator!r} has {comm.ewma.n_ranks} ranks, the schedule "
                                      f"{schedule.n_ranks}")
            current = comm.active.get(schedule.collective)
            if size_bytes is not None:
                comm.sizes[schedule.collective] = float(size_bytes)
            if current is not None and current.version >= version:
                return current.version
            self.opportunities.remember(communicator, schedule, result)
            if current is not None:  # a newer version registered by a rank: its own references
                self._relearn(comm, comm.base if comm.base is not None else self._nominal)
            comm.active[schedule.collective] = self._activate(comm, schedule, result, version, self.topology, text,
                                                             prepared)
            self._event("registered", communicator, schedule.collective, version)
            return version

    def latest(self, communicator: str, collective: Collective | str) -> tuple[int, str] | None:
        """(version, schedule file text) of the active schedule, or None. The text is encoded on the
        first fetch of a version (:class:`~mccl.control.records._Active`), outside the manager's lock."""
        with self._lock:
            comm = self._comms.get(communicator)
            active = comm.active.get(Collective(collective)) if comm else None
        return (active.version, active.text) if active else None

    def latest_schedule(self, communicator: str, collective: Collective | str) -> tuple[int, Schedule] | None:
        """(version, schedule) of the active schedule, or None: what a pushed version's digest is taken of
        (:mod:`.candidates`, "Activation by digest")."""
        with self._lock:
            comm = self._comms.get(communicator)
            active = comm.active.get(Collective(collective)) if comm else None
        return (active.version, active.schedule) if active else None

    def active_result(self, communicator: str, collective: Collective | str) -> SynthesisResult | None:
        """The synthesis result behind the active schedule (with its warm state), or None when the
        active schedule was registered by a rank rather than synthesized here."""
        with self._lock:
            comm = self._comms.get(communicator)
            active = comm.active.get(Collective(collective)) if comm else None
            return active.result if active else None

    def versions(self, communicator: str) -> dict[str, int]:
        with self._lock:
            comm = self._comms.get(communicator)
            return {kind.value: item.version for kind, item in comm.active.items()} if comm else {}

    # ---- telemetry --------------------------------------------------------------------
    def ingest(self, samples: Iterable[Sample]) -> int:
        """Fold samples into the EWMAs of their communicators; returns how many were used.
        Vectorized per communicator (:mod:`.intake`): the same state as folding them one by one."""
        batch = samples if isinstance(samples, list) else list(samples)
        if not batch:
            return 0
        first = batch[0].communicator
        groups = {first: batch} if all(s.communicator == first for s in batch) else {}
        if not groups:
            for sample in batch:
                groups.setdefault(sample.communicator, []).append(sample)
        taken = ignored = 0
        with self._lock:
            for name, group in groups.items():
                comm = self._comms.get(name)
                if comm is None:
                    ignored += len(group)
                    continue
                try:
                    parts = [Batch.of(group)]
                except (TypeError, ValueError, OverflowError):  # a malformed field: fold the good ones
                    parts = []
                    for sample in group:
                        try:
                            parts.append(Batch.of([sample]))
                        except (TypeError, ValueError, OverflowError):
                            ignored += 1
                for part in parts:
                    used, unused = fold(comm, part)
                    taken += used
                    ignored += unused
                if parts:
                    self._ingested_at[name] = time.time()
            self.samples_taken += taken
            self.samples_ignored += ignored
        return taken

    def _relearn(self, comm: _Communicator, base: np.ndarray) -> None:
        """A new version takes over: forget the references, remember what fabric they will stand for."""
        comm.base = np.array(base, dtype=float)
        comm.ewma.reset()
        comm.clock.forget_untagged()
        if comm.level is not None:
            comm.level.reset()
        comm.ignore_through = max(comm.ignore_through, comm.last_seq + self.config.settle_collectives)
