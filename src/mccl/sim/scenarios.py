"""Named evaluation scenarios of the reference papers, as data.

Each scenario returns rows (what ran, on which fabric, how fast) that the CLI
prints and benchmarks record. A row whose schedule kind does not exist yet (a
synthesizer still to come) has ``algbw_gbs=None`` and a note saying so, so that
the tables keep their shape as the project grows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mccl.schedule import Collective, Schedule, validate
from mccl.sim.analytic import evaluate
from mccl.synth import allgather_cut_bound, direct_alltoall, nccl_ring
from mccl.topology import Topology, degrade, rail_optimized

__all__ = ["ScenarioRow", "SCENARIOS", "fig2_degradation"]

MiB = 2**20


@dataclass(frozen=True)
class ScenarioRow:
    scenario: str
    collective: Collective
    schedule: str
    fabric: str
    size_bytes: float  # nccl-tests S
    algbw_gbs: float | None
    busbw_gbs: float | None
    note: str = ""


def _row(scenario: str, schedule: Schedule, planned_on: Topology, runs_on: Topology, size: float, label: str) -> ScenarioRow:
    validate(schedule, runs_on)
    result = evaluate(schedule, runs_on, size)
    note = "" if planned_on is runs_on else "planned for the healthy fabric"
    return ScenarioRow(scenario, schedule.collective, label, runs_on.name, size, result.algbw_gbs, result.busbw_gbs, note)


def fig2_degradation(per_source_bytes: float = 128 * MiB) -> list[ScenarioRow]:
    """mccl-paper Fig. 2: 2×8 HPN, GPU 0's NIC cable degraded by 0/50/75/88 %.

    AllGather with NCCL-style rings and AllToAll with NCCL-style direct sends
    (PXN), 128 MB per source; each planned on the healthy fabric and run on the
    degraded one (what a static library does). The AllGather cut bound on the
    degraded fabric is what re-optimization can reach at best.
    """
    healthy = rail_optimized(1, 2, 8)
    n = len(healthy.gpus)
    size = per_source_bytes * n  # S: AllGather output / AllToAll send buffer per rank
    rows: list[ScenarioRow] = []
    plans = {
        Collective.ALLGATHER: nccl_ring(healthy, Collective.ALLGATHER),
        Collective.ALLTOALL: direct_alltoall(healthy),
    }
    for percent in (0, 50, 75, 88):
        fabric = healthy if percent == 0 else degrade(healthy, ("gpu0", "tor0.0"), factor=1 - percent / 100, duplex=True)
        scenario = "healthy" if percent == 0 else f"gpu0 NIC -{percent}%"
        for collective, plan in plans.items():
            label = "NCCL ring (static)" if collective is Collective.ALLGATHER else "NCCL direct, PXN (static)"
            rows.append(_row(scenario, plan, healthy, fabric, size, label))
        bound = allgather_cut_bound(fabric)
        rows.append(ScenarioRow(scenario, Collective.ALLGATHER, "cut bound (no schedule beats it)", fabric.name,
                                size, bound.algbw_gbs, bound.algbw_gbs * (n - 1) / n))
        for collective, synthesizer in ((Collective.ALLGATHER, "tree packing"), (Collective.ALLTOALL, "column generation")):
            rows.append(ScenarioRow(scenario, collective, f"mccl {synthesizer} (re-opt.)", fabric.name, size,
                                    None, None, "not yet available"))
    return rows


SCENARIOS: dict[str, Callable[[], list[ScenarioRow]]] = {"fig2": fig2_degradation}
