"""The Schedule Manager (mccl-paper §3.1–§3.2): which collectives to re-optimize, and when.

Split by concern: this module holds the decisions (check, re-optimize, issue); registration, the
versions the ranks fetch and the telemetry intake are :mod:`.manager_state`'s (batches folded by :mod:`.intake`), settings live in :mod:`.config`, records
(events, bounded by ``ControlConfig.max_events``; per-version state, whose schedule text is
encoded on the first fetch) in :mod:`.records`, the never-worse comparison in :mod:`.guard`.

It holds the active schedule of every (communicator, collective) with its version,
folds telemetry into per-overlay-link EWMAs (:mod:`.ewma`), runs the drift test of
Algorithm 1 (:mod:`.drift`) on the measured topology, and for a flagged schedule
calls :func:`mccl.synth.optimize` with the measured capacities and the active
schedule's synthesis result as ``previous`` (warm start: the result carries the
solver state, so AllToAll restarts from its columns and basis or repairs the previous
LP solution; a schedule registered by a rank has no result, and warm-starts from its
routes). Every schedule it issues is validated
against the nominal topology the executors hold (routes and correctness do not
depend on capacities).

Thrashing guard (§3.2): synthesis runs outside the manager's lock, so telemetry
keeps arriving meanwhile; when it returns, the drift test is run again on the
newest measurements, and if the degradation has cleared the new schedule is
dropped ("aborted") and the current one kept. A collective no registered synthesizer
makes (:class:`~mccl.errors.SynthesisUnavailable`) keeps the current schedule and is
logged once.

References per version. A rank pair's rate while sending depends on the schedule as
much as on the fabric: 8 pairs sharing a 400 Gbit/s NIC read 50 each, one pair alone on
a 50 Gbit/s NIC also reads 50. References learned once, under the first schedule, make a
re-synthesized schedule's pairs through a still-degraded NIC read "healthy" (measured: the
tree-packing AllGather under Fail2 swapped three times during one fault). So when a new
version takes over, the EWMAs are reset and relearn their references from the new
version's own samples, and the capacities the new version was made for (the measured
topology) become the *base* those references stand for: the measured topology is
``min(nominal, base × what each overlay link delivers now relative to its reference)``
(:mod:`.drift`). A degradation that deepens flags the new version; one that clears shows
as factors above 1 and flags it too. Which samples belong to the new version: a sample
tagged with its collective and version (:class:`~mccl.telemetry.Sample`) is used iff its
version is the active one; an untagged one iff it measured a collective later than
``settle_collectives`` past the last reported when the version was issued (the swap
lands at some later launch; this also damps thrashing). No decision is taken while an
overlay link is still learning its reference. Samples of a communicator's first
``settle_collectives`` collectives are ignored (start-up transients).

Cost of the reset: ``settle_collectives + warmup`` collectives after each swap without a
decision, and a degradation that starts inside that window is measured relative to it
(its references absorb it; a later clear then reads as a recovery above base, clipped
to nominal).

Late landing (a version made for a fault that cleared before it landed): :mod:`.landing`.

Swap back when the fabric recovers (a version made for a fault loads the degraded link lightly, so its cut does
not drift when the link is repaired): the opportunity check beside the drift test, :mod:`.opportunity`.
The measured fabric and that evidence (the receiving NICs' rates, the reading a re-synthesis is made for) are
:mod:`.manager_evidence`'s, the registration and the telemetry intake :mod:`.manager_state`'s, the guard's comparison
and a kept schedule's re-based cut :mod:`.manager_guard`'s.

Synthesis ahead of the flag and the record of each flag's way to a swap (issue 15, the reaction path):
:mod:`.ahead` (``ScheduleManager.speculate``, ``reactions``). A speculation taken because the drift went further
than it was made for, which the guard then does not choose, is followed by the flag's own synthesis
(:mod:`.manager_guard`, where the guard's part of the decisions lives).

Never worse than what it replaces (:mod:`.guard`): before a re-synthesized schedule is
issued, the candidate, the active schedule and the NCCL-style baseline are predicted at
the job's size on the measured topology and the fastest is kept — the active one ("kept":
its cut is re-based on the measured fabric so the same evidence does not flag it again, a fault that deepens
since still does: :meth:`_Guarded._cut_on`),
or the baseline, issued as the next version. ``ScheduleManager.guard.decisions`` records
each comparison.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from mccl.control.ahead import Reaction, Speculations
from mccl.control.config import ControlConfig
from mccl.control.drift import drift_test
from mccl.control.ewma import OverlayEWMA
from mccl.control.guard import ACTIVE, BASELINE, CANDIDATE, Guard, GuardDecision, Predictor, explained_text
from mccl.control.landing import cleared_before_landing
from mccl.control.manager_guard import _Guarded, rebased_on
from mccl.control.opportunity import (
    Opportunities,
    Opportunity,
    healthy_observed_faster,
)
from mccl.control.prepared import prepare_update
from mccl.control.records import Decision, Event, EventLog, _Active, _Communicator
from mccl.errors import ControllerError, MCCLError, SynthesisError, SynthesisUnavailable
from mccl.schedule import Collective, Schedule, bottleneck_cut
from mccl.synth import SynthesisResult, optimize
from mccl.topology import Topology

__all__ = ["ControlConfig", "Event", "ScheduleManager", "Decision", "GuardDecision", "Reaction"]

log = logging.getLogger("mccl.control")


class ScheduleManager(_Guarded):
    """See module docstring. Thread-safe: ``ingest`` may run while ``step`` synthesizes."""

    def __init__(self, topology: Topology, config: ControlConfig | None = None, *,
                 synthesize: Callable[..., SynthesisResult] = optimize, predict: Predictor | None = None,
                 speculate: float | None = 0.5, speculate_tolerance: float = 0.1,
                 speculate_band: float | None = None) -> None:
        """``synthesize``: the re-synthesis call (default :func:`mccl.synth.optimize`); ``predict``: the
        guard's predictor (:mod:`.guard`; default its α-β model, which needs no simulator). ``speculate``:
        the fraction of Γ at which a drifting schedule is synthesized ahead of its flag (None: never);
        ``speculate_tolerance``: how far (× nominal, per link) the capacities at the flag may be from those
        it was made for (module docstring); ``speculate_band``: a wider band (× nominal) within which a held
        speculation is offered at the flag and issued only if the guard chooses it (:mod:`.ahead`, "The wider
        band"; None: no wider band)."""
        self.topology = topology
        self.config = config or ControlConfig()
        if speculate is not None and not (isinstance(speculate, int | float) and 0 < speculate < 1):
            raise ControllerError(f"speculate must be None or a fraction of gamma in (0, 1), got {speculate!r}")
        self.speculate = speculate
        self._speculations = Speculations(topology.capacities_gbps, speculate_tolerance, speculate_band)
        self._ingested_at: dict[str, float] = {}  # wall clock of each communicator's last folded batch
        self.reactions = Reaction.log()  # one per flag (mccl.control.ahead)
        if self.config.gamma <= 0:
            raise ControllerError(f"the drift threshold gamma must be positive, got {self.config.gamma}")
        OverlayEWMA(2, self.config.alpha)  # checks alpha
        if self.config.alpha_level is not None:
            OverlayEWMA(2, self.config.alpha_level)
        self._synthesize = synthesize
        self.guard = Guard(topology, optimize, predict=predict, tolerance=self.config.guard_tolerance,
                           default_size_bytes=self.config.guard_size_bytes, explain_tolerance=self.config.gamma)
        self._nominal = topology.capacities_gbps
        self._lock = threading.Lock()
        self._comms: dict[str, _Communicator] = {}
        self._unavailable: set[tuple[str, Collective]] = set()
        self._adopted: dict[str, SynthesisResult] = {}
        self.events = EventLog(self.config.max_events)
        self.opportunities = Opportunities(self.config.gamma)  # swap back when the fabric recovers (.opportunity)
        self.samples_taken = 0
        self.samples_ignored = 0

    # ---- decisions --------------------------------------------------------------------
    def _decide(self, name: str, comm: _Communicator, kind: Collective, active: _Active) -> Decision:
        capacities = self._measured(comm, comm.ewma)
        result = drift_test(active.cut, capacities, self.config.gamma)
        if result.flagged and active.kept is not None:  # kept by the guard: flagged by a deeper fault since
            kept_cut, kept_on = active.kept
            since = drift_test(kept_cut, capacities, self.config.gamma)
            loaded = active.cut.links
            deeper = bool(np.any(capacities[loaded] * (1.0 + self.config.gamma) < kept_on[loaded]))
            result = replace(since, flagged=since.flagged and deeper)
        return Decision(name, kind, active.version, result, capacities)

    def check(self) -> list[Decision]:
        """The drift test of every active schedule whose overlay links have references."""
        decisions = []
        with self._lock:
            for name, comm in self._comms.items():
                if comm.ewma.learned == 0 or comm.ewma.learning > 0:
                    continue
                for kind, active in comm.active.items():
                    if active.landing is not None:
                        self._check_landing(name, comm, kind, active)
                    if comm.last_seq > active.judge_after_seq:
                        decisions.append(self._decide(name, comm, kind, active))
        return decisions

    def _check_landing(self, name: str, comm: _Communicator, kind: Collective, active: _Active) -> None:
        """Late landing (:mod:`.landing`): back to the base before, and judged again. Called under the lock."""
        cleared = cleared_before_landing(comm.clock, kind, active, self.config.gamma)
        if cleared is None:
            return
        replaced, at_flag_s, last_s, base_before = cleared
        comm.base = None if base_before is None else np.array(base_before, dtype=float)
        self.guard.forget(name, kind, active.version)
        self._event("rebased", name, kind, active.version, at_flag_s / last_s,
                    f"v{replaced} ran {at_flag_s / last_s:.2f}x faster before v{active.version} landed "
                    f"({at_flag_s * 1e3:.4g} -> {last_s * 1e3:.4g} ms): its references stand for the fabric before")

    def step(self, on_issue: Callable[[], None] | None = None) -> list[Event]:
        """Check every schedule; re-synthesize the flagged ones (synchronously), then synthesize ahead for the
        drifting ones; the events of this step. ``on_issue()`` is called after each issued version, before
        anything else of the step (the service pushes it to the ranks then: measured, a speculation for
        another collective in the same step held a push back 38 ms)."""
        first = self.events.total
        decisions = self.check()
        waiting = []
        for decision in decisions:
            opportunity = None if decision.result.flagged else self._opportunity(decision)
            if (decision.result.flagged or opportunity is not None) and \
                    self.reoptimize(decision, opportunity) is not None and on_issue is not None:
                on_issue()
            if opportunity is None:
                waiting.append(decision)
        for decision in waiting:
            if (not decision.result.flagged and self.speculate is not None
                    and decision.result.max_deviation >= self.speculate * self.config.gamma):
                self.speculate_for(decision)
        return self.events.since(first)

    @property
    def speculations(self) -> int:
        """Syntheses made ahead of a flag so far."""
        return self._speculations.made

    @property
    def speculation_reuse(self) -> dict[str, int]:
        """How flags took held speculations beyond the tolerance (:mod:`.ahead`): ``continued`` (the drift went
        further its way), ``offered`` (from the wider band) and ``refused`` (offered, not chosen by the guard)."""
        held = self._speculations
        return {"continued": held.continued, "offered": held.offered, "refused": held.refused}

    def held_speculations(self) -> dict:
        """The syntheses held ahead of a flag, by (communicator, collective) (:mod:`.ahead`; the service pushes
        them to the ranks as candidates, :mod:`.candidates`)."""
        with self._lock:
            return self._speculations.held()

    def speculate_for(self, decision: Decision) -> bool:
        """Synthesize ahead of the flag for a drifting schedule (module docstring); True if it did."""
        name, kind = decision.communicator, decision.collective
        with self._lock:
            comm, active = self._workable(decision)
            if active is None:
                return False
        capacities = self._synthesis_capacities(comm, decision)
        if not self._speculations.wanted((name, kind), active.version, capacities):
            return False
        start = time.perf_counter()
        try:
            result = self._resynthesize(active, kind, self._measured_topology(capacities))
            prepared = prepare_update(active.schedule, result, self.topology)  # validated; reused at the flag
        except MCCLError:  # SynthesisUnavailable / SynthesisError too: the flag's own synthesis reports it
            return False
        seconds = time.perf_counter() - start
        with self._lock:
            self._speculations.keep((name, kind), active.version, capacities, result, seconds, prepared)
        return True

    def reoptimize(self, decision: Decision, opportunity: Opportunity | None = None) -> Schedule | None:
        """Re-synthesize one flagged schedule on the measured topology; the issued schedule or None.
        ``opportunity``: not flagged, but the fabric recovered beyond what the version was made for
        (:mod:`.opportunity`): the candidate is the healthy schedule where the topology is back to nominal."""
        name, kind = decision.communicator, decision.collective
        with self._lock:
            comm, active = self._workable(decision)
            if active is None:
                return None
            active.busy = True
            reaction = Reaction(name, kind.value, active.version, self._ingested_at.get(name), time.time())
            self.reactions.append(reaction)
            if opportunity is None:
                self._event("flagged", name, kind, active.version, decision.result.max_deviation,
                            f"link {decision.result.worst_link}")
            else:
                self._event("flagged", name, kind, active.version, opportunity.ratio, opportunity.text())
        try:
            return self._reoptimize(name, comm, kind, active, decision, reaction, opportunity)
        finally:
            with self._lock:
                active.busy = False

    def _workable(self, decision: Decision) -> tuple[_Communicator, _Active | None]:
        """The decision's communicator and its active schedule, or None for the schedule when it cannot be
        worked on now (busy, replaced since the decision, or its collective's synthesis is unavailable).
        Called under the lock."""
        name, kind = decision.communicator, decision.collective
        comm = self._comms[name]
        active = comm.active[kind]
        if active.busy or active.version != decision.version or (name, kind) in self._unavailable:
            return comm, None
        return comm, active

    def _reoptimize(self, name: str, comm: _Communicator, kind: Collective, active: _Active,
                    decision: Decision, reaction: Reaction, opportunity: Opportunity | None = None) -> Schedule | None:
        capacities = self._synthesis_capacities(comm, decision)
        measured = self._measured_topology(capacities)
        with self._lock:  # what the active one was observed to take when the fabric was measured, not after synthesis
            observed = comm.clock.observed(kind, active.version)
            # False: the fabric was measured from samples of a collective the clock has not counted yet (a flag on
            # the first samples of a fault, before any slowed collective completed on every rank)
            clock_current = comm.clock.counted_through(kind, active.version) >= comm.last_seq
        start, cpu = time.perf_counter(), time.thread_time()
        reaction.synth_start = time.time()
        healthy = self.opportunities.healthy_result(name, kind) if opportunity and opportunity.back_to_nominal else None
        held, taken = (None, "") if healthy is not None else self._speculations.take_with(
            (name, kind), active.version, capacities, wide=self.config.guard)
        ahead = held is not None
        try:
            if healthy is not None:  # its cut on the fabric it is issued for, as the baseline's
                result = replace(healthy, schedule=healthy.schedule.with_meta(
                    bottleneck_cut=bottleneck_cut(healthy.schedule, measured)))
            else:
                result = held.result if ahead else self._resynthesize(active, kind, measured)
            prepared = held.prepared if ahead and held.prepared is not None else (
                prepare_update(active.schedule, result, self.topology))  # validated where it changed
            if taken == "band":  # its cut on the flag's fabric, which its references will stand for (.ahead)
                result, prepared = rebased_on(result, prepared, measured)
        except SynthesisUnavailable as error:
            with self._lock:
                self._unavailable.add((name, kind))
                log.warning("mccl controller: %s synthesis is not available (%s); keeping the current "
                            "schedules of that collective", kind.value, error)
                self._event("unavailable", name, kind, active.version, text=str(error))
            reaction.outcome = "unavailable"
            return None
        except (SynthesisError, MCCLError) as error:
            if opportunity is not None:  # not retried on every check for the same evidence
                self.opportunities.judged(name, kind, active.version, opportunity)
            with self._lock:
                self._event("failed", name, kind, active.version, text=str(error))
            reaction.outcome = "failed"
            return None
        seconds = time.perf_counter() - start
        reaction.synth_end, reaction.ahead, reaction.synth_cpu_s = time.time(), ahead, time.thread_time() - cpu
        reaction.ahead_synth_s = held.seconds if ahead else None
        with self._lock:
            self._event("synthesized", name, kind, active.version, seconds,
                        f"ahead of the flag: {held.seconds * 1e3:.1f} ms, {(time.time() - held.at) * 1e3:.0f} ms before"
                        if ahead else "")
        guard_start = time.perf_counter()
        guarded = self._compare(name, comm, kind, active, result, measured, observed) if self.config.guard else None
        reaction.guard_s = time.perf_counter() - guard_start if self.config.guard else None
        if taken in ("continued", "band") and guarded is not None and guarded[0].chosen != CANDIDATE:
            # made for a shallower fault, or a band away from the flag's capacities, and not chosen by the guard on
            # them: the flag's own synthesis instead, judged again (.manager_guard; .ahead, "The wider band")
            fresh = self._instead_of_speculation(name, comm, kind, active, measured, observed, guarded[0], reaction,
                                                 taken)
            if fresh is not None:
                result, prepared, guarded, seconds = fresh
                ahead = False
        seen = None  # back to nominal: the healthy schedule's observed time decides (.opportunity)
        if healthy is not None:
            with self._lock:
                seen = healthy_observed_faster(comm.clock, kind, healthy.schedule.meta.version, observed,
                                               self.config.guard_tolerance)
        if opportunity is not None and not (seen if seen is not None else
                                            self._worth(comm, kind, active, result, measured, guarded)):
            self.opportunities.judged(name, kind, active.version, opportunity)
            reaction.outcome = "kept"
            self._event("kept", name, kind, active.version, 0.0, f"{opportunity.text()}: "
                        + ("the healthy schedule was not observed faster" if seen is not None else "no predicted gain"))
            return None
        with self._lock:
            again = self._decide(name, comm, kind, active)
            if opportunity is None and not again.result.flagged:  # cleared during synthesis: keep the current one
                reaction.outcome = "aborted"
                self._event("aborted", name, kind, active.version, seconds, "degradation cleared during synthesis")
                return None
            chosen = "candidate"
            if guarded is not None and not seen:
                verdict, baseline = guarded
                chosen = verdict.chosen
                if chosen == ACTIVE:  # still predicted fastest, or the measured fabric does not explain what the
                    # active one experiences (guard.py): keep it, judged from now — on this fabric, unless the clock
                    # was behind it: then the same evidence is judged again once the slowed collectives are counted
                    # (measured, pacer demo: a flag at δ 0.26 saw 44.77 -> 44.71 ms, was kept and re-based, and the
                    # fault was never flagged again)
                    rebased = verdict.trusted or clock_current
                    if rebased:
                        kept_on = again.capacities_gbps  # what the drift test reads: the same evidence, δ 0 exactly
                        active.kept = (self._cut_on(active.schedule, self._measured_topology(kept_on)), kept_on)
                    if opportunity is not None:
                        self.opportunities.judged(name, kind, active.version, opportunity)
                    active.judge_after_seq = comm.last_seq + self.config.settle_collectives
                    reaction.outcome = "kept"
                    self._event("kept", name, kind, active.version, verdict.speedup("candidate"),
                                f"guard: {dict(verdict.predicted_s)}" + explained_text(verdict)
                                + ("; re-based" if rebased else "; not re-based (the clock is behind the evidence)"))
                    return None
                if chosen == BASELINE and baseline is not None:
                    result = replace(baseline, schedule=baseline.schedule.with_meta(
                        bottleneck_cut=bottleneck_cut(baseline.schedule, measured)))
            version = active.version + 1
            if guarded is not None:
                self.guard.expect(name, kind, version, guarded[0])
            result = result.with_version(version)
            schedule = result.schedule
            base_before = None if comm.base is None else comm.base.copy()
            comm.active[kind] = self._activate(comm, schedule, result, version, measured,
                                               prepared=prepared if chosen == "candidate" else None)
            back_to_healthy = healthy is not None and chosen == "candidate"
            if observed is not None and not back_to_healthy:  # the replaced one speeding up is why, not a late landing
                comm.active[kind].landing = (active.version, observed, base_before)
            # the healthy schedule, issued because the fabric reads back to nominal: its references stand for nominal
            # (measured, emulated fabric: the measured topology then still had NVLinks at 0.72 of nominal from the
            # fault's evidence, and a base there would let a path's noise reopen the opportunity after the repair)
            self._relearn(comm, self._nominal if back_to_healthy else capacities)
            reaction.issued_at, reaction.issued_version, reaction.outcome = time.time(), version, "issued"
            self._event("issued", name, kind, version, float(schedule.meta.achieved_gbs or 0.0),
                        f"synthesized in {seconds * 1e3:.1f} ms{' (ahead of the flag)' if ahead else ''}; {chosen}"
                        + ("; the healthy schedule, observed faster" if seen else "")
                        + ("" if guarded is None else explained_text(guarded[0])))
            return schedule
