"""MCCS §5 single-application results on the simulated 2:1 spine-leaf: ring order, flow assignment, sizes.

Four libraries, as the paper compares them (inputs assumed: :mod:`.mccs_common`):

* **NCCL** — rings in rank order over interleaved ranks, switches hash the connections (ECMP);
* **NCCL(OR)** — the optimal ring order (MCCS's locality-aware ring), still ECMP;
* **MCCS(-FA)** — MCCS without flow assignment: the same ring and ECMP as NCCL(OR) here
  (the service adds nothing a flow simulator sees; its 50–80 µs are the other engineer's);
* **MCCS** — the tenancy controller's plan (:class:`~mccl.control.tenancy.TenancyController`,
  FFA): the locality ring with every connection's path pinned.

``mccs-order``: 512 MB AllReduce, NCCL(OR) over NCCL at 4 and 8 GPUs (paper +56 %, +78 %);
MCCS over MCCS(-FA) at 8 GPUs (+46 %). ``mccs-sizes``: MCCS over NCCL, averaged over 8–512 MB
and AllReduce and AllGather, at 4 and 8 GPUs (1.6×, 2.4×).
"""

from __future__ import annotations

import statistics

from mccl.control.tenancy import JobProfile, Policy, TenancyController, TenantJob
from mccl.experiments.mccs_common import (
    MB,
    Comparison,
    ComparisonReport,
    ecmp_expectation,
    fmt_row,
    interleaved_ranks,
    run_alone,
    testbed,
)
from mccl.schedule import Collective, Schedule
from mccl.synth.ring import locality_ring, nccl_ring
from mccl.topology import Topology

__all__ = ["ring_order", "size_sweep", "library_algbw"]

ASSUMED = (
    "NCCL ranks interleave racks (hosts 0, 2, 1, 3): cross-rack ratio 2",
    "ECMP figures: expected algbw over equally likely route assignments (exact up to 256, else sampled)",
    "ring channels as NCCL: 1 at 4 GPUs, 2 at 8",
    "links at line rate; no per-collective service latency (flow-level simulator)",
)


def _schedules(fabric: Topology, collective: Collective, gpus_per_host: int, size_bytes: float) -> dict[str, Schedule]:
    ranks = interleaved_ranks(fabric, gpus_per_host)
    controller = TenancyController(fabric, Policy.FFA)
    plan = controller.register(TenantJob("tenant", ranks, JobProfile(collective, size_bytes)))["tenant"]
    return {"nccl": nccl_ring(fabric, collective, ranks), "ordered": locality_ring(fabric, collective, ranks),
            "mccs": plan.schedule}


def library_algbw(fabric: Topology, collective: Collective, gpus_per_host: int, size_bytes: float,
                  draws: int) -> dict[str, float]:
    """algbw (GB/s) of NCCL, NCCL(OR) (= MCCS(-FA)) and MCCS for one collective and size; the ECMP
    baselines' expectation over at most ``draws`` route assignments."""
    schedules = _schedules(fabric, collective, gpus_per_host, size_bytes)
    return {
        "NCCL": ecmp_expectation(fabric, schedules["nccl"], size_bytes, max_assignments=draws),
        "NCCL(OR)": ecmp_expectation(fabric, schedules["ordered"], size_bytes, max_assignments=draws),
        "MCCS": run_alone(fabric, schedules["mccs"], size_bytes),
    }


def ring_order(size_bytes: float = 512 * MB, draws: int = 256) -> ComparisonReport:
    """``mccs-order`` (module docstring)."""
    fabric = testbed()
    found = {gpus: library_algbw(fabric, Collective.ALLREDUCE, gpus // 4, size_bytes, draws) for gpus in (4, 8)}
    comparisons = (
        Comparison("ring order, 4 GPUs: NCCL(OR) vs NCCL", 100 * (found[4]["NCCL(OR)"] / found[4]["NCCL"] - 1), 56, "%"),
        Comparison("ring order, 8 GPUs: NCCL(OR) vs NCCL", 100 * (found[8]["NCCL(OR)"] / found[8]["NCCL"] - 1), 78, "%"),
        Comparison("flow assignment, 8 GPUs: MCCS vs MCCS(-FA)",
                   100 * (found[8]["MCCS"] / found[8]["NCCL(OR)"] - 1), 46, "%"),
    )
    detail = tuple(fmt_row(f"{gpus} GPUs", library, algbw) for gpus, table in found.items()
                   for library, algbw in table.items())
    return ComparisonReport("mccs-order", f"MCCS §5 ring order and flow assignment, {size_bytes / MB:g} MB AllReduce "
                            f"on the 2:1 spine-leaf (ECMP: expectation over <= {draws} route assignments)", comparisons, detail,
                            ("GPUs", "library", "algbw GB/s"), ASSUMED)


def size_sweep(sizes_mb: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512), draws: int = 256) -> ComparisonReport:
    """``mccs-sizes``: MCCS / NCCL algbw averaged over sizes and both collectives (module docstring)."""
    fabric = testbed()
    ratios: dict[int, list[float]] = {4: [], 8: []}
    detail = []
    for gpus in (4, 8):
        for collective in (Collective.ALLREDUCE, Collective.ALLGATHER):
            for size in sizes_mb:
                found = library_algbw(fabric, collective, gpus // 4, size * MB, draws)
                ratios[gpus].append(found["MCCS"] / found["NCCL"])
                detail.append(fmt_row(gpus, collective.value, f"{size} MB", found["NCCL"], found["MCCS"],
                                      found["MCCS"] / found["NCCL"]))
    comparisons = (Comparison("8-512 MB average, 4 GPUs: MCCS / NCCL", statistics.fmean(ratios[4]), 1.6),
                   Comparison("8-512 MB average, 8 GPUs: MCCS / NCCL", statistics.fmean(ratios[8]), 2.4))
    return ComparisonReport("mccs-sizes", f"MCCS §5 algbw over NCCL, 8-512 MB, AllReduce and AllGather (ECMP: expectation "
                            f"over <= {draws} route assignments)", comparisons, tuple(detail),
                            ("GPUs", "collective", "size", "NCCL GB/s", "MCCS GB/s", "MCCS / NCCL"), ASSUMED)
