"""The never-worse comparison as a schedule manager runs it (split from :mod:`mccl.control.manager`, which keeps
the decisions): the guard's comparison of a candidate with the active schedule and the baseline (:mod:`.guard`),
whether a schedule for a recovered fabric is worth a swap (:mod:`.opportunity`), a kept schedule's cut re-based on
the measured fabric (``_cut_on``), and the flag's own synthesis when the guard did not choose the one made ahead of it.

A speculation the guard did not choose (issue 11, eighth session). A flag takes the synthesis made ahead of it
(:mod:`.ahead`) when the capacities at the flag are within its band, or when the drift only went further its way
("The drift that kept going"). In the second case the speculation was made for a *shallower* fault than the flag
measures, and the guard, comparing on the flag's capacities, may rightly find it no faster than the active one.
Before this, that ended the flag ("kept", the active one re-based on the flag's fabric), and the schedule made for the
fabric measured at the flag was never synthesized. Measured (flow loop, Fail1 AllGather, 16 GPUs, seed 1): the
speculation was made for GPU 0's NVLink egress read at 1444 Gbit/s (the scale-free reading; its traffic reading was
not adopted at that check, :mod:`.saturation`), the flag read it at 778 (true 800); the guard predicted the
speculation at 2.488 ms against the active 2.272 (on the true fabric 2.501 against 2.219) and kept v0; the schedule
synthesized for the flag's capacities runs 1.828 ms there (1.21x faster). (Measured with the seventh session's
adoption rule; since the exact reading is adopted on its own, :func:`.saturation.adopted`, seed 1's speculation is made
for the link's traffic reading and its flag takes it within the band: 1.166x.) So a speculation taken beyond its band that
the guard does not choose is not the flag's answer: the flag synthesizes for its own capacities, as it would have with
nothing held, and the guard compares that instead (its decision is the flag's; both are in ``Guard.decisions``). One
taken within its band was made for the flag's fabric within the telemetry's noise: the guard's verdict on it stands
(measured, the same run's swap back: a second synthesis there chose the same baseline, 80 ms later). What it costs:
one synthesis and one comparison on the flag's path, only when such a speculation lost — the path a flag without a
speculation takes anyway.

The same rule serves the wider band of reuse (issue 15, eighth session; :mod:`.ahead`, "The wider band"): a
speculation within ``speculate_band`` of the flag's capacities is offered, issued only if the guard chooses it, and
otherwise refused the same way; an issued band reuse takes its cut on the flag's fabric (:func:`rebased_on`). Both
refusals count in ``Speculations.refused`` and leave a "refused" event before the flag's own synthesis.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from mccl.control.ahead import Reaction
from mccl.control.drift import CutProfile, profile
from mccl.control.guard import ACTIVE, CANDIDATE, GuardDecision, explained_text
from mccl.control.manager_evidence import _Evidence
from mccl.control.prepared import PreparedSchedule, prepare_update
from mccl.control.records import _Active, _Communicator
from mccl.errors import MCCLError
from mccl.schedule import Collective, Schedule, bottleneck_cut
from mccl.synth import SynthesisResult
from mccl.topology import Topology

__all__: list[str] = []

log = logging.getLogger("mccl.control")


def rebased_on(result: SynthesisResult, prepared: PreparedSchedule, measured: Topology,
               ) -> tuple[SynthesisResult, PreparedSchedule]:
    """A band reuse's result and preparation with its bottleneck cut (and base slacks) taken on the flag's
    ``measured`` fabric (:mod:`.ahead`, "The wider band"). Why: the issued version's references are learned as
    standing for that fabric (its base), and a cut made for the speculation's capacities, up to the band away, would
    start the new version's drift test off zero (measured on a recorded AllToAll: δ 0.094 at its own base, a third
    of Γ)."""
    schedule = result.schedule.with_meta(bottleneck_cut=bottleneck_cut(result.schedule, measured))
    return replace(result, schedule=schedule), replace(prepared, cut=profile(schedule, len(measured.links)))


class _Guarded(_Evidence):
    """The guard's part of a schedule manager's decisions (module docstring). A base class:
    :class:`~mccl.control.manager.ScheduleManager` sets up every attribute used here in its ``__init__``."""

    def _resynthesize(self, active: _Active, kind: Collective, measured: Topology) -> SynthesisResult:
        """``active``'s collective synthesized on ``measured``, warm from the active result (or schedule)."""
        previous = active.result if active.result is not None else active.schedule
        return self._synthesize(measured, kind, active.schedule.ranks, previous=previous,
                                method=self.config.methods.get(kind), options=self.config.synth_options.get(kind))

    def _instead_of_speculation(self, name: str, comm: _Communicator, kind: Collective, active: _Active,
                                measured: Topology, observed: tuple[float, float] | None, rejected: GuardDecision,
                                reaction: Reaction, taken: str,
                                ) -> tuple[SynthesisResult, PreparedSchedule, tuple[GuardDecision, SynthesisResult | None],
                                           float] | None:
        """The flag's own synthesis on ``measured`` and the guard's comparison of it, after the guard chose
        ``rejected.chosen`` over the speculation (module docstring), which was ``taken`` "continued" (made for a
        shallower fault) or from the wider "band" (:mod:`.ahead`): (result, its prepared update, the guard's
        decision and the baseline, synthesis wall seconds); None (the first decision stands) when that synthesis or
        comparison fails."""
        self._speculations.refused += 1
        with self._lock:
            self._event("refused", name, kind, active.version, rejected.speedup(CANDIDATE),
                        f"the speculation taken {taken} was not chosen ({rejected.chosen}): synthesized on the flag's "
                        "capacities")
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            result = self._resynthesize(active, kind, measured)
            prepared = prepare_update(active.schedule, result, self.topology)
        except MCCLError as error:
            log.warning("mccl controller: the flag's own synthesis after a rejected speculation failed (%s)", error)
            return None
        seconds = time.perf_counter() - start
        reaction.ahead, reaction.ahead_synth_s = False, None
        reaction.synth_end = time.time()
        reaction.synth_cpu_s = (reaction.synth_cpu_s or 0.0) + time.thread_time() - cpu
        with self._lock:
            self._event("synthesized", name, kind, active.version, seconds,
                        f"after a refused speculation, for the capacities measured at the flag: the guard chose the {rejected.chosen} over the "
                        f"synthesis made ahead of the flag ({dict(rejected.predicted_s)}{explained_text(rejected)})")
        guard_start = time.perf_counter()
        guarded = self._compare(name, comm, kind, active, result, measured, observed)
        reaction.guard_s = (reaction.guard_s or 0.0) + time.perf_counter() - guard_start
        return None if guarded is None else (result, prepared, guarded, seconds)

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
