"""Named evaluation scenarios of the reference papers, run on the flow-level simulator.

Each scenario returns a :class:`ScenarioReport`: rows (what ran, on which fabric
state, how fast) that the CLI prints and the plots draw. Every schedule comes from
:func:`mccl.synth.optimize`: the NCCL-style baselines by their registered method
(``ring.nccl``, ``alltoall.direct``), mccl's by the collective's default one; a row
whose collective no registered method makes (``SynthesisUnavailable``) has
``algbw_gbs=None`` and the note "not yet available". The simulator never learns how
a schedule was made (DESIGN.md).

Sizes: "128 MB per source" (mccl-paper §2.3, §6.1) is nccl-tests S = n × 128 MiB
for AllGather (the output buffer) and AllToAll (the send buffer).

Pipelining: by default fig2 and fig9 simulate what the executor does
(``SimOptions.executor()``: every chunk cut into slices of about 64 KiB, at most 128,
that follow each other down its path; streams share links equally). ``slices=N``
instead moves every chunk as N slices in the literal model (a hop's older step first);
``slices=1`` forwards whole chunks only (store and forward), which penalizes deep trees
and relayed paths. Before 2026-11-30 the default was ``slices=4`` in the literal model.
"""

from __future__ import annotations

from collections.abc import Callable

from mccl.errors import SynthesisUnavailable
from mccl.experiments.fig14 import fig14_training
from mccl.experiments.loop_scenarios import SCENARIO_ENTRIES
from mccl.experiments.mccs import ring_reversal
from mccl.experiments.report import NOT_YET, MiB, ScenarioReport, ScenarioRow
from mccl.schedule import Collective, Schedule, validate
from mccl.sim.analytic import busbw_factor
from mccl.sim.engine import simulate_schedule
from mccl.sim.inputs import SimOptions
from mccl.sim.results import RunResult
from mccl.synth import DirectOptions, SynthesisResult, allgather_cut_bound, optimize
from mccl.topology import Topology, apply_fault, degrade, rail_optimized

__all__ = ["ScenarioRow", "ScenarioReport", "SCENARIOS", "PIPELINED_SCENARIOS", "fig2_degradation", "fig9_failures", "chain_summary", "MiB"]

def _simulated(scenario: str, schedule: Schedule, runs_on: Topology, size: float, label: str,
               note: str = "", baseline: float | None = None, *, options: SimOptions) -> ScenarioRow:
    validate(schedule, runs_on)
    run = simulate_schedule(schedule, runs_on, size, options=options)
    speedup = run.algbw_gbs / baseline if baseline else None
    return ScenarioRow(scenario, schedule.collective, label, runs_on.name, size, run.algbw_gbs, run.busbw_gbs,
                       note, speedup, chain_summary(run, runs_on))


def chain_summary(run: RunResult, topology: Topology) -> str:
    """``"15 hops, 93% on gpu0->tor0.0"``: the critical chain's length and where it spent its time."""
    seconds = run.chain_links()
    if not seconds or run.time_s <= 0:
        return ""
    link, spent = max(seconds.items(), key=lambda item: item[1])
    where = f"{topology.links[link].src}->{topology.links[link].dst}" if link >= 0 else "no link"
    return f"{len(run.critical_chain)} hops, {spent / run.time_s:.0%} on {where}"


def _nccl_baseline(topology: Topology, collective: Collective) -> Schedule:
    """What a static library runs: NCCL-style rail rings (AllGather), direct sends with PXN relays and
    4 chunks per block (AllToAll); both from the synthesizer registry."""
    if collective is Collective.ALLTOALL:
        return optimize(topology, collective, method="alltoall.direct", options=DirectOptions(chunks=4)).schedule
    return optimize(topology, collective, method="ring.nccl").schedule


def _synthesized(topology: Topology, collective: Collective,
                 previous: SynthesisResult | None = None) -> SynthesisResult | None:
    """``optimize``'s result (warm from ``previous``'s solver state), or None when no synthesizer
    makes ``collective``."""
    try:
        return optimize(topology, collective, previous=previous)
    except SynthesisUnavailable:
        return None


def _missing(scenario: str, collective: Collective, label: str, fabric: Topology, size: float) -> ScenarioRow:
    return ScenarioRow(scenario, collective, label, fabric.name, size, None, None, NOT_YET)


def _options(slices: int | None) -> tuple[SimOptions, str]:
    """The executor's model (``slices=None``) or N slices per chunk in the literal one, and how to say so."""
    if slices is None:
        return SimOptions.executor(), "the executor's slicing"
    return SimOptions(slices=slices), f"{slices} slice{'s' if slices > 1 else ''} per chunk"


def fig2_degradation(per_source_bytes: float = 128 * MiB, *, slices: int | None = None,
                     percents: tuple[int, ...] = (0, 50, 75, 88)) -> ScenarioReport:
    """mccl-paper Fig. 2 (§2.3): 2×8 HPN, GPU 0's NIC cable degraded by 0/50/75/88 %.

    AllGather with NCCL-style rings and AllToAll with NCCL-style direct sends (PXN),
    planned on the healthy fabric and run on the degraded one ("Orig": what a static
    library does), against mccl's schedules planned for the healthy fabric and
    re-optimized for the degraded one. The AllGather cut bound is what any schedule
    can reach at best. Speedups are over the static NCCL row of the same state.
    ``percents``: the degradations evaluated (a subset costs proportionally less).
    """
    healthy = rail_optimized(1, 2, 8)
    n = len(healthy.gpus)
    size = per_source_bytes * n
    options, how = _options(slices)
    baselines = {Collective.ALLGATHER: (_nccl_baseline(healthy, Collective.ALLGATHER), "NCCL ring (Orig)"),
                 Collective.ALLTOALL: (_nccl_baseline(healthy, Collective.ALLTOALL), "NCCL direct, PXN (Orig)")}
    planned = {collective: _synthesized(healthy, collective) for collective in baselines}
    rows: list[ScenarioRow] = []
    for percent in percents:
        fabric = healthy if percent == 0 else degrade(healthy, ("gpu0", "tor0.0"), factor=1 - percent / 100,
                                                      duplex=True)
        state = "healthy" if percent == 0 else f"gpu0 NIC -{percent}%"
        for collective, (plan, label) in baselines.items():
            base = _simulated(state, plan, fabric, size, label, "" if percent == 0 else "planned for healthy",
                              options=options)
            rows.append(base)
            name = "tree packing" if collective is Collective.ALLGATHER else "column generation"
            static = planned[collective]
            if static is None:
                rows.append(_missing(state, collective, f"mccl {name} (Orig)", fabric, size))
            else:
                rows.append(_simulated(state, static.schedule, fabric, size, f"mccl {name} (Orig)", "planned for healthy",
                                       base.algbw_gbs, options=options))
            reopt = _synthesized(fabric, collective, previous=static) if static is not None else None
            if reopt is None:
                rows.append(_missing(state, collective, f"mccl {name} (re-opt.)", fabric, size))
            else:
                rows.append(_simulated(state, reopt.schedule, fabric, size, f"mccl {name} (re-opt.)", "", base.algbw_gbs,
                                       options=options))
            if collective is Collective.ALLGATHER:
                bound = allgather_cut_bound(fabric)
                rows.append(ScenarioRow(state, collective, "cut bound (no schedule beats it)", fabric.name, size,
                                        bound.algbw_gbs, bound.algbw_gbs * busbw_factor(collective, n),
                                        "max-flow bound", bound.algbw_gbs / base.algbw_gbs))
    return ScenarioReport("fig2", f"mccl-paper Fig. 2: {healthy.name}, 128 MB per source, GPU 0's NIC degraded, "
                          f"{how}", tuple(rows))


def fig9_failures(fabrics: tuple[tuple[int, int, int], ...] = ((1, 2, 8), (1, 4, 8)),
                  per_source_bytes: float = 128 * MiB, *, slices: int | None = None) -> ScenarioReport:
    """mccl-paper Fig. 9 (§6.1): Fail1/Fail2/Fail3 on S×H×8 HPN, AllGather and AllToAll,
    algbw speedup of mccl's re-optimized schedule over NCCL's static one ("No reopt").
    Paper: up to 7.33× (AllGather) and 7.12× (AllToAll)."""
    rows: list[ScenarioRow] = []
    options, how = _options(slices)
    for shape in fabrics:
        healthy = rail_optimized(*shape)
        n = len(healthy.gpus)
        size = per_source_bytes * n
        plans = {collective: _nccl_baseline(healthy, collective)
                 for collective in (Collective.ALLGATHER, Collective.ALLTOALL)}
        for fault in ("healthy", "Fail1", "Fail2", "Fail3"):
            fabric = healthy if fault == "healthy" else apply_fault(healthy, fault)
            state = f"{'x'.join(map(str, shape))} {fault}"
            for collective, plan in plans.items():
                label = "NCCL ring (No reopt)" if collective is Collective.ALLGATHER else "NCCL direct (No reopt)"
                base = _simulated(state, plan, fabric, size, label, "", 1.0, options=options)
                base = ScenarioRow(base.scenario, base.collective, base.schedule, base.fabric, base.size_bytes,
                                   base.algbw_gbs, base.busbw_gbs, base.note, 1.0)
                rows.append(base)
                name = "tree packing" if collective is Collective.ALLGATHER else "column generation"
                reopt = _synthesized(fabric, collective)
                if reopt is None:
                    rows.append(_missing(state, collective, f"mccl {name} (re-opt.)", fabric, size))
                else:
                    rows.append(_simulated(state, reopt.schedule, fabric, size, f"mccl {name} (re-opt.)", "",
                                           base.algbw_gbs, options=options))
                if collective is Collective.ALLGATHER:
                    bound = allgather_cut_bound(fabric)
                    rows.append(ScenarioRow(state, collective, "cut bound", fabric.name, size, bound.algbw_gbs,
                                            bound.algbw_gbs * busbw_factor(collective, n), "max-flow bound",
                                            bound.algbw_gbs / base.algbw_gbs))
    return ScenarioReport("fig9", "mccl-paper Fig. 9: speedup over NCCL under Fail1/Fail2/Fail3, 128 MB per source, "
                          f"{how}", tuple(rows))


PIPELINED_SCENARIOS = ("fig2", "fig9", "fig14")  # the ones that take ``slices``

SCENARIOS: dict[str, Callable[..., ScenarioReport]] = {
    "fig2": fig2_degradation,
    "fig9": fig9_failures,
    "mccs-reversal": ring_reversal,
    "fig14": fig14_training,  # training time at 128-2048 GPUs, alpha-beta (issue 11, deliverable 4)
    **SCENARIO_ENTRIES,  # loop-fail2, loop-microburst, ...: the controller on the simulator (issue 11)
}
