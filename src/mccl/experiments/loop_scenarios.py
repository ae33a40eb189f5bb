"""Closed-loop scenarios (issue 11): the real controller against faults that start, persist and clear.

Each scenario runs one collective stream (AllGather by tree packing, AllToAll by column
generation) on ``rail_optimized(1, H, 8)`` through :func:`~mccl.experiments.closedloop_sim.run_loop`
(the flow-level simulator) or, at 128 GPUs and more where one simulated collective costs ~25 s
CPU, :func:`~mccl.experiments.closedloop_fluid.run_fluid_loop` (the per-path rate model):
``healthy`` collectives on the healthy fabric, then a change for ``persist`` collectives
(counted at the degraded pace, so at least that many run under it), then ``after``
collectives' worth of healthy fabric again. The changes:

* ``fail1`` / ``fail2`` / ``fail3`` — the paper's gray failures of GPU 0 (§6.1), as capacity
  changes (Fail3's extra latency and its move to another host are not modelled over time:
  the simulator changes capacities, not nodes);
* ``microburst`` — Fail2's depth on GPU 0's NIC for one healthy collective period: shorter
  than the controller's detection delay, it must not trigger a swap;
* ``offcut`` — a loaded link off the schedule's bottleneck cut slowed to twice what the
  schedule needs of it: the schedule is still optimal, no swap;
* ``uniform`` — every link of the bottleneck cut's kinds slowed by the same factor (K_s is one
  of many equal cuts on a symmetric fabric): slacks keep their values (Algorithm 1), no swap.

Expected swaps: one when a persistent change starts and one back when it clears, zero for
the last three. Reported per run: detection time (change → the manager's "flagged"),
synthesis time (the manager's own measurement), time from the change to the first
collective on the new version, swaps, and the algbw of every collective (the timeline).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mccl.control.guard import GuardDecision, Predictor
from mccl.control.manager import ControlConfig
from mccl.experiments.closedloop_fluid import run_fluid_loop
from mccl.experiments.closedloop_sim import LoopResult, TelemetryModel, run_loop, run_version
from mccl.experiments.report import MiB, ScenarioReport, ScenarioRow
from mccl.schedule import Collective, Schedule, link_load
from mccl.sim.analytic import evaluate
from mccl.sim.engine import simulate_schedule
from mccl.sim.inputs import CapacityChange, SimOptions
from mccl.synth import optimize
from mccl.topology import FAULTS, Topology, degrade, rail_optimized

__all__ = ["LOOP_SCENARIOS", "EXPECTED_SWAPS", "DEFAULT_CONFIG", "LoopOutcome", "run_scenario", "loop_report",
           "fault_changes", "simulated_predictor"]

LOOP_SCENARIOS = ("fail1", "fail2", "fail3", "microburst", "offcut", "uniform")
EXPECTED_SWAPS = {"fail1": 2, "fail2": 2, "fail3": 2, "microburst": 0, "offcut": 0, "uniform": 0}
# α, Γ chosen as experiments/README.md "Choosing α and Γ" derives: one sample per overlay link and
# collective, σ ≈ 5 % noise, bursts of one collective filtered; the level EWMA tracks the current rate.
# absolute_rates: both evaluators' samples and collective times are in the topology's units (the topology
# is the fabric), so the link that slowed a collective is read at its traffic (mccl.control.saturation)
DEFAULT_CONFIG = ControlConfig(alpha=0.1, gamma=0.2, alpha_level=1.0, absolute_rates=True)


def fault_changes(healthy: Topology, faulted: Topology, start_s: float, end_s: float) -> list[CapacityChange]:
    """The capacity changes that turn ``healthy`` into ``faulted`` at ``start_s`` and back at ``end_s``."""
    changes = []
    for link in healthy.links:
        new = faulted.links[link.id].gbps
        if new != link.gbps:
            changes.append(CapacityChange(start_s, link.id, new))
            if math.isfinite(end_s):
                changes.append(CapacityChange(end_s, link.id, link.gbps))
    return changes


def simulated_predictor(options: SimOptions | None = None) -> Predictor:
    """The guard's predictor backed by the flow-level simulator (affordable at 16 GPUs: 0.1–0.5 s CPU
    per prediction; ~25 s at 128, where the manager's α-β default is used instead)."""
    options = options or SimOptions(keep_chain=False)

    def predict(schedule: Schedule, topology: Topology, size_bytes: float) -> float:
        return simulate_schedule(schedule, topology, size_bytes, options=options).time_s

    return predict


def _offcut(healthy: Topology, schedule: Schedule) -> Topology:
    """A loaded link off the bottleneck cut slowed to 2× (else 1.25×, 1.1×) what the schedule needs of it;
    where every such link is nearly saturated (tree packings load links evenly), an unloaded link
    halved — still a failure the schedule must ride out without a swap."""
    load = link_load(schedule, len(healthy.links))
    caps = healthy.capacities_gbps
    loaded = np.flatnonzero(load > 0)
    x_min = float(np.min(caps[loaded] / load[loaded]))
    cut = {item.link for item in schedule.meta.bottleneck_cut}
    for margin, most in ((2.0, 0.7), (1.25, 0.8), (1.1, 0.95)):
        factor = {int(a): margin * load[a] * x_min / caps[a] for a in loaded if int(a) not in cut}
        link = min(factor, key=lambda a: (factor[a], a))
        if factor[link] <= most:
            return degrade(healthy, link, factor=factor[link])
    unloaded = [link.id for link in healthy.links if load[link.id] == 0 and link.id not in cut]
    if not unloaded:
        raise ValueError(f"every link off the cut of {schedule.meta.synthesizer} is nearly saturated")
    return degrade(healthy, unloaded[0], factor=0.5)


def _uniform(healthy: Topology, schedule: Schedule, factor: float = 0.5) -> Topology:
    """Every link of the cut's kinds (e.g. all NVSwitch→GPU and ToR→GPU links) slowed by ``factor``.

    Why the kinds and not only K_s: on a symmetric fabric K_s is one of many equal cuts (a tree
    packing's is one GPU's ingress); slowing only it is a local fault, not a uniform slowdown."""
    kinds = {(healthy.node(healthy.links[item.link].src).kind, healthy.node(healthy.links[item.link].dst).kind)
             for item in schedule.meta.bottleneck_cut}
    slowed = healthy
    for link in healthy.links:
        if (healthy.node(link.src).kind, healthy.node(link.dst).kind) in kinds:
            slowed = degrade(slowed, link.id, factor=factor)
    return slowed


def _faulted(name: str, healthy: Topology, schedule: Schedule) -> Topology:
    if name in ("fail1", "fail2", "fail3"):
        return FAULTS[name.capitalize()](healthy)
    if name == "microburst":
        return FAULTS["Fail2"](healthy)
    if name == "offcut":
        return _offcut(healthy, schedule)
    if name == "uniform":
        return _uniform(healthy, schedule)
    raise ValueError(f"unknown loop scenario {name!r}; known: {', '.join(LOOP_SCENARIOS)}")


@dataclass(frozen=True)
class Phase:
    """The controller's answer to one change (start or clear) at ``at_s``; NaN where it did not act."""

    at_s: float
    detection_s: float
    detection_collectives: int
    synthesis_s: float
    first_new_s: float


@dataclass(frozen=True)
class LoopOutcome:
    scenario: str
    collective: Collective
    n_gpus: int
    loop: LoopResult
    start_s: float
    end_s: float
    phases: tuple[Phase, ...]
    faulted: Topology | None = None  # the true fabric during the change
    schedule: Schedule | None = None  # the version the loop started with
    size_bytes: float = 0.0
    evaluator: str = "flow"

    def first_swap_on_truth(self) -> tuple[float, float] | None:
        """(active, issued) seconds of one collective on the true fabric during the change, by the loop's own
        evaluator, for the first swap issued during it: the version it replaced and the version it put in force
        (issue 11, "never worse than what it replaces"); None without such a swap."""
        swap = next((s for s in self.loop.swaps if self.start_s <= s.issued_s < self.end_s), None)
        if swap is None or swap.schedule is None or self.faulted is None or self.schedule is None:
            return None
        before = [s for s in self.loop.swaps if s.time_s < swap.time_s and s.schedule is not None]
        active = before[-1].schedule if before else self.schedule
        if self.evaluator == "flow":
            options = SimOptions(keep_chain=False)
            times = [simulate_schedule(s, self.faulted, self.size_bytes, options=options).time_s
                     for s in (active, swap.schedule)]
        else:
            times = [evaluate(s, self.faulted, self.size_bytes).time_s for s in (active, swap.schedule)]
        return times[0], times[1]

    @property
    def swaps(self) -> int:
        return len(self.loop.swaps)

    @property
    def guard(self) -> tuple[GuardDecision, ...]:
        """The manager's never-worse comparisons (which schedule won, predicted times)."""
        return self.loop.guard

    def windows(self) -> tuple[tuple[str, float, float], ...]:
        """("before" / "during" / "after" the change, start s, stop s): the timeline's three windows."""
        return (("before", 0.0, self.start_s), ("during", self.start_s, self.end_s), ("after", self.end_s, math.inf))

    def algbw_windows(self) -> tuple[float, float, float]:
        """Median algbw before / during / after the change (:meth:`windows`)."""
        before, during, after = (self.algbw(start, stop) for _, start, stop in self.windows())
        return before, during, after

    def timeline(self, label: str = "") -> tuple[tuple[tuple[float, float, str], ...], tuple[tuple[float, str], ...]]:
        """(algbw per collective: end s, GB/s, schedule; events: swaps, the change's start and clear, flags),
        what the timeline PNG draws; ``label`` prefixes each entry (several streams in one plot)."""
        prefix = f"{label}: " if label else ""
        points = tuple((run.end_s, run.algbw_gbs, f"{prefix}{run.schedule}") for run in self.loop.runs)
        events = [(swap.time_s, f"{prefix}swap to v{swap.version}") for swap in self.loop.swaps]
        events += [(self.start_s, f"{self.scenario} starts"), (self.end_s, f"{self.scenario} clears")]
        events += [(e.time_s, f"{prefix}flagged v{e.event.version}") for e in self.loop.events_of("flagged")]
        return points, tuple(events)

    def algbw(self, start: float, stop: float, version: int | None = None) -> float:
        """Median algbw of the collectives that ran during [start, stop) (on ``version`` if given)."""
        values = [run.algbw_gbs for run in self.loop.runs if run.start_s < stop and run.end_s > start
                  and (version is None or run_version(run) == version)]
        return statistics.median(values) if values else math.nan


def _phase(loop: LoopResult, at_s: float, until_s: float) -> Phase:
    flagged = next((e for e in loop.events_of("flagged") if at_s <= e.time_s < until_s), None)
    if flagged is None:
        return Phase(at_s, math.nan, 0, math.nan, math.nan)
    synthesized = next((e for e in loop.events_of("synthesized") if e.time_s >= flagged.time_s), None)
    swap = next((s for s in loop.swaps if s.issued_s >= flagged.time_s), None)
    first = loop.first_on(swap.version) if swap is not None else None
    between = sum(1 for run in loop.runs if at_s <= run.end_s <= flagged.time_s)
    return Phase(at_s, flagged.time_s - at_s, between, synthesized.event.value if synthesized else math.nan,
                 first.start_s - at_s if first is not None else math.nan)


def run_scenario(name: str, collective: Collective | str = Collective.ALLTOALL, *, hosts: int = 2,
                 healthy: int = 12, persist: int = 20, after: int = 20, size_per_rank: float = 16 * MiB,
                 config: ControlConfig = DEFAULT_CONFIG, model: TelemetryModel | None = None,
                 synthesis_delay_s: float | None = None, min_gap_s: float | None = None,
                 evaluator: str = "flow", predict: Predictor | None = None) -> LoopOutcome:
    """Run scenario ``name`` (module docstring) for one collective stream on ``rail_optimized(1, hosts, 8)``.

    ``synthesis_delay_s``: see :func:`run_loop` (None: measured). ``min_gap_s``: least compute
    between collectives (None: the cold synthesis time; 0 with no synthesis delay, for fast tests).
    ``evaluator``: "flow" (the flow-level simulator, :func:`run_loop`) or "fluid" (the per-path rate
    model of :mod:`~mccl.experiments.closedloop_fluid`, for 128 GPUs and more). ``predict``: the
    manager's guard predictor (None: the evaluator's own model — :func:`simulated_predictor` for "flow",
    the guard's α-β default for "fluid", whose collective time is that α-β time). Why the evaluator's
    own: the guard trusts a measured fabric only if its predictor reproduces the active collective's
    observed time on it (:mod:`mccl.control.guard`); α-β cannot see why a tree packing runs at half its
    bound in the flow simulator, so there a local fault and a uniform slowdown look alike to it."""
    if evaluator not in ("flow", "fluid"):
        raise ValueError(f"unknown evaluator {evaluator!r}; known: flow, fluid")
    kind = Collective(collective)
    fabric = rail_optimized(1, hosts, 8)
    n = len(fabric.gpus)
    size = size_per_rank * n
    began = time.perf_counter()
    schedule = optimize(fabric, kind).schedule
    cold_s = time.perf_counter() - began
    options = SimOptions(keep_chain=False)
    faulted = _faulted(name, fabric, schedule)
    if evaluator == "flow":
        healthy_s = simulate_schedule(schedule, fabric, size, options=options).time_s
        degraded_s = simulate_schedule(schedule, faulted, size, options=options).time_s
    else:
        healthy_s = evaluate(schedule, fabric, size).time_s
        degraded_s = evaluate(schedule, faulted, size).time_s
    # compute between collectives: 3x the collective, and at least one cold synthesis, so that a
    # re-synthesis (1-3x the cold one on a measured fabric) lands a few collectives after detection,
    # as in training, where a step's compute is long against a synthesis
    gap_s = max(3 * healthy_s, cold_s if min_gap_s is None else min_gap_s)
    start_s = healthy * (healthy_s + gap_s)
    burst = name == "microburst"  # one healthy period: shorter than the detection delay
    end_s = start_s + (healthy_s + gap_s if burst else persist * (degraded_s + gap_s))
    until_s = end_s + after * (healthy_s + gap_s)
    changes = fault_changes(fabric, faulted, start_s, end_s)
    if predict is None and evaluator == "flow":
        predict = simulated_predictor(options)
    if evaluator == "flow":
        loop = run_loop(fabric, schedule, size, changes=changes, until_s=until_s, gap_s=gap_s, config=config,
                        model=model, synthesis_delay_s=synthesis_delay_s, options=options, predict=predict,
                        job=f"{name}-{kind.value}")
    else:
        loop = run_fluid_loop(fabric, schedule, size, changes=changes, until_s=until_s, gap_s=gap_s, config=config,
                              model=model, synthesis_delay_s=synthesis_delay_s, predict=predict,
                              job=f"{name}-{kind.value}")
    phases = (_phase(loop, start_s, end_s), _phase(loop, end_s, until_s))
    return LoopOutcome(name, kind, n, loop, start_s, end_s, phases, faulted, schedule, size, evaluator)


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1e3:.1f} ms"


def loop_report(name: str = "fail2", *, hosts: int = 2, collectives: tuple[str, ...] = ("allgather", "alltoall"),
                **options: object) -> ScenarioReport:
    """Scenario ``name`` for each collective stream: rows per phase, the algbw timeline, the events."""
    rows: list[ScenarioRow] = []
    skipped: list[ScenarioRow] = []  # listed last: the table's title takes its size from the first row
    timeline: list[tuple[float, float, str]] = []
    events: list[tuple[float, str]] = []
    title = ""
    for collective in collectives:
        try:
            outcome = run_scenario(name, collective, hosts=hosts, **options)  # type: ignore[arg-type]
        except ValueError as error:  # e.g. off-cut on a tree packing that loads every link near its need
            skipped.append(ScenarioRow("not applicable", Collective(collective), "-", f"{hosts * 8} GPUs", 0.0,
                                       None, None, str(error)))
            continue
        outcome.loop.check()
        loop, kind = outcome.loop, outcome.collective
        title = f"closed loop, {name}, rail_optimized(1,{hosts},8) ({outcome.n_gpus} GPUs)"
        size = loop.runs[0].size_bytes
        for (label, _, _), value in zip(outcome.windows(), outcome.algbw_windows(), strict=True):
            rows.append(ScenarioRow(f"{label} the change", kind, loop.runs[0].schedule.split(" v")[0], title, size,
                                    value, value * (outcome.n_gpus - 1) / outcome.n_gpus, "median algbw"))
        for phase, what in zip(outcome.phases, ("change starts", "change clears"), strict=True):
            rows.append(ScenarioRow(what, kind, "controller", title, size, None, None,
                                    f"detect {_ms(phase.detection_s)} ({phase.detection_collectives} coll.), "
                                    f"synth {_ms(phase.synthesis_s)}, first new {_ms(phase.first_new_s)}"))
        rows.append(ScenarioRow("whole run", kind, "controller", title, size, None, None,
                                f"{outcome.swaps} swaps (expected {EXPECTED_SWAPS[name]}), {len(loop.runs)} "
                                f"collectives, none lost or run twice"))
        points, marks = outcome.timeline(kind.value)
        timeline += points
        events += marks
    return ScenarioReport(f"loop-{name}-{hosts * 8}", title, tuple(rows + skipped), tuple(timeline),
                          tuple(sorted(set(events))))


def _entry(name: str) -> Callable[..., ScenarioReport]:
    def scenario(**options: object) -> ScenarioReport:
        return loop_report(name, **options)  # type: ignore[arg-type]

    scenario.__doc__ = f"Closed loop on 16 GPUs, scenario {name} (mccl.experiments.loop_scenarios)."
    return scenario


SCENARIO_ENTRIES: dict[str, Callable[..., ScenarioReport]] = {f"loop-{name}": _entry(name) for name in LOOP_SCENARIOS}
