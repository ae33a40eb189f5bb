"""The guard's part of a schedule manager's decisions (split from :mod:`mccl.control.manager`, which keeps the
decisions): the comparison before a swap (:mod:`.guard`), whether a schedule for a recovered fabric is worth its
swap (:mod:`.opportunity`), and a kept schedule's cut re-based on the measured fabric. A base class:
:class:`~mccl.control.manager.ScheduleManager` sets up every attribute used here in its ``__init__``."""

from __future__ import annotations

import logging

import numpy as np

from mccl.control.drift import CutProfile, profile
from mccl.control.guard import ACTIVE, GuardDecision
from mccl.control.manager_evidence import _Evidence
from mccl.control.records import _Active, _Communicator
from mccl.errors import MCCLError
from mccl.schedule import Collective, Schedule, bottleneck_cut
from mccl.synth import SynthesisResult
from mccl.topology import Topology

__all__: list[str] = []

log = logging.getLogger("mccl.control")


class _Guarded(_Evidence):
    """The guard's comparison, the swap back's worth and the kept schedule's re-based cut (module docstring)."""

    def _worth(self, comm: _Communicator, kind: Collective, active: _Active, result: SynthesisResult,
               measured: Topology, guarded: tuple[GuardDecision, SynthesisResult | None] | None) -> bool:
        """Does the schedule for a recovered fabric win over the active one (:mod:`.opportunity`)? The guard's
        choice when it compared them (its own "kept" path records a kept one), and then by more than the guard's
        tolerance on its (calibrated) times: the guard gives ties to the candidate, but a tie is no reason to
        leave a schedule nothing flagged (measured, emulated fabric: a predicted 1.000x swap). Without the guard,
        predicted here."""
        if guarded is not None:
            verdict = guarded[0]
            return verdict.chosen == ACTIVE or verdict.calibrated_s(ACTIVE) > \
                verdict.calibrated_s(verdict.chosen) * (1.0 + self.config.guard_tolerance)
        with self._lock:
            size = self.guard.size(comm.sizes.get(kind), comm.meter, kind, active.schedule, comm.clock)[0]
        try:
            return self.guard.predict(active.schedule, measured, size) > \
                self.guard.predict(result.schedule, measured, size) * (1.0 + self.config.guard_tolerance)
        except MCCLError:
            return False

    def _cut_on(self, schedule: Schedule, measured: Topology) -> CutProfile:
        """Algorithm 1's profile of a kept ``schedule`` re-based on ``measured``: its own cut links and those binding on
        ``measured``, base slacks taken there. The manager flags a kept schedule again only when this profile flags
        (a change beyond Γ since the keep) and a link the schedule loads reads Γ below its reading then (the fault
        deepened): not on the same evidence, nor on a uniform change (scale-free) or a recovery (the uniform
        slowdown the guard keeps, then clearing, in :mod:`mccl.experiments.loop_scenarios`: 0 swaps). Why its own
        links too: a cut of the one link the evidence blames has slack 0 at any capacity of it, blind to the fault
        deepening (pacer demo: a reading of rank 0's NIC kept and re-based, the NIC then at 1/8 unflagged for 26
        collectives)."""
        load = self.guard.link_load(schedule)  # cached by the α-β predictor (~70 ms each at 512 GPUs otherwise)
        binding = [item.link for item in bottleneck_cut(schedule, measured, load=load)]
        links = np.union1d([item.link for item in schedule.meta.bottleneck_cut], binding).astype(int)
        return profile(schedule.with_meta(bottleneck_cut=bottleneck_cut(schedule, measured, cut_links=links, load=load)),
                       len(measured.links))

    def _compare(self, name: str, comm: _Communicator, kind: Collective, active: _Active, result: SynthesisResult,
                 measured: Topology, observed: tuple[float, float] | None,
                 ) -> tuple[GuardDecision, SynthesisResult | None] | None:
        """The guard's comparison (:mod:`.guard`); None (issue the candidate) if the predictor fails.
        ``observed``: the active one's clock (reference, now) read when ``measured`` was: a synthesis lasting
        seconds (noisy capacities, a loaded CPU) would otherwise set a fabric measured early in a fault against a
        time observed after it had fully set in (measured on the pacer demo: r 0.31–0.37 after 1.4–2.1 s
        synthesis, 1.1–1.7 after 6–18 ms)."""
        try:
            baseline = self.guard.baseline(name, kind, active.schedule.ranks)
            schedules = {"candidate": result.schedule, "active": active.schedule}
            if baseline is not None:
                schedules["baseline"] = baseline.schedule
            with self._lock:
                size = self.guard.size(comm.sizes.get(kind), comm.meter, kind, active.schedule, comm.clock)
                base = None if comm.base is None else comm.base.copy()
            return self.guard.compare(name, kind, active.version, schedules, measured, size, observed=observed,
                                      base_gbps=base), baseline
        except MCCLError as error:
            log.warning("mccl controller: the guard could not compare schedules (%s); issuing the candidate", error)
            return None

