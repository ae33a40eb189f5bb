"""MCCS §5 multi-tenant setups: three jobs' 128 MB AllReduces share the 2:1 spine-leaf (``mccs-tenants``).

The summary gives the outcome (shares near the expected 2:1:1 under FFA, 1.7:1 for A:B
under ECMP; FFA 75 % faster than NCCL on average) but not the four setups. Assumed here:
job A holds both GPUs of two hosts in different racks (a 4-GPU ring of 2 channels: 2
connections cross racks each way), jobs B and C one GPU on each of the other two hosts
(2-GPU rings: 1 connection each way). The four setups are the four ways to pick A's two
hosts (one per rack); B takes GPU 0 and C GPU 1 of the rest. Each way, 4 connections share
the 2 × 50 Gbit/s of the leaf's uplinks, so a fair split per connection gives A:B:C =
2:1:1 of the cross-rack throughput — the expected share.

A job's **share** is its cross-rack throughput: the bytes its collectives move between
racks (from its schedule: transfers whose ends sit in different racks) per second of its
run, every job running back to back for ``horizon_s``. Policies: MCCS = the tenancy
controller's rings and FFA paths; ECMP = the same rings, paths hashed (mean over draws);
NCCL = rank-order rings over ranks that alternate hosts, ECMP.
"""

from __future__ import annotations

import statistics

import numpy as np

from mccl.control.tenancy import JobProfile, Policy, TenancyController, TenantJob
from mccl.experiments.mccs_common import MB, Comparison, ComparisonReport, fmt_row, testbed
from mccl.schedule import Collective, Schedule
from mccl.sim import CollectiveOp, Job, SimOptions, simulate
from mccl.sim.ecmp import AS_SCHEDULED, EcmpPaths, PathPolicy
from mccl.synth.ring import nccl_ring
from mccl.topology import Topology

__all__ = ["tenant_setups", "SETUPS", "cross_rack_bytes"]

# (A's two hosts, B's GPUs, C's GPUs); host h holds gpu2h, gpu2h+1; hosts 0, 1 in rack 0
SETUPS: tuple[tuple[tuple[int, int], tuple[str, str], tuple[str, str]], ...] = tuple(
    (hosts, tuple(f"gpu{2 * h}" for h in rest), tuple(f"gpu{2 * h + 1}" for h in rest))  # type: ignore[misc]
    for hosts, rest in (((0, 2), (1, 3)), ((1, 3), (0, 2)), ((0, 3), (1, 2)), ((1, 2), (0, 3)))
)


def cross_rack_bytes(fabric: Topology, schedule: Schedule, size_bytes: float) -> float:
    """Bytes one run of ``schedule`` moves between racks."""
    transfers = schedule.transfers
    racks = np.array([fabric.node(gpu).rack for gpu in schedule.ranks])
    crossing = racks[transfers.sender] != racks[transfers.receiver]
    fraction = schedule.chunks.fraction[transfers.chunk]
    return float(fraction[crossing].sum()) * size_bytes / schedule.n_ranks


def _shares(fabric: Topology, schedules: dict[str, Schedule], paths: dict[str, PathPolicy], size: float,
            horizon_s: float) -> dict[str, float]:
    jobs = [Job(name, (CollectiveOp(schedule, size),), iterations=10**6, until_s=horizon_s, paths=paths[name])
            for name, schedule in schedules.items()]
    result = simulate(fabric, jobs, options=SimOptions(keep_chain=False))
    shares = {}
    for name, schedule in schedules.items():
        runs = result.runs_of(name)
        shares[name] = len(runs) * cross_rack_bytes(fabric, schedule, size) * 8 / 1e9 / runs[-1].end_s
    return shares


def tenant_setups(size_bytes: float = 128 * MB, draws: int = 16, horizon_s: float = 1.0) -> ComparisonReport:
    """``mccs-tenants`` (module docstring)."""
    fabric = testbed()
    detail = []
    ffa_a_b, ffa_b_c, ecmp_a_b, speedups = [], [], [], []
    for index, (hosts, b_gpus, c_gpus) in enumerate(SETUPS, start=1):
        a_gpus = tuple(f"gpu{2 * h + g}" for h in hosts for g in range(2))
        placement = {"A": a_gpus, "B": b_gpus, "C": c_gpus}
        controller = TenancyController(fabric, Policy.FFA)
        for name, gpus in placement.items():
            controller.register(TenantJob(name, gpus, JobProfile(Collective.ALLREDUCE, size_bytes)))
        plans = controller.plans
        ffa = _shares(fabric, {n: p.schedule for n, p in plans.items()}, dict.fromkeys(plans, AS_SCHEDULED),
                      size_bytes, horizon_s)
        rings = {n: controller.rings[n] for n in plans}
        ecmp = [_shares(fabric, rings, dict.fromkeys(plans, EcmpPaths(f"draw{d}")), size_bytes, horizon_s)
                for d in range(draws)]
        interleave = {"A": (a_gpus[0], a_gpus[2], a_gpus[1], a_gpus[3]), "B": b_gpus, "C": c_gpus}
        nccl_rings = {n: nccl_ring(fabric, Collective.ALLREDUCE, list(g)) for n, g in interleave.items()}
        same = all(np.array_equal(nccl_rings[n].transfers.pattern.orders, rings[n].transfers.pattern.orders)
                   for n in plans)  # NCCL groups a host's ranks too: with 2 hosts its ring is the ordered one
        nccl = ecmp if same else [_shares(fabric, nccl_rings, dict.fromkeys(plans, EcmpPaths(f"draw{d}")), size_bytes,
                                          horizon_s) for d in range(draws)]
        ecmp_mean = {n: statistics.fmean(s[n] for s in ecmp) for n in plans}
        nccl_mean = {n: statistics.fmean(s[n] for s in nccl) for n in plans}
        ffa_a_b.append(ffa["A"] / ffa["B"])
        ffa_b_c.append(ffa["B"] / ffa["C"])
        ecmp_a_b.append(statistics.fmean(s["A"] / s["B"] for s in ecmp))
        speedups.append(statistics.fmean(ffa[n] / nccl_mean[n] for n in plans))
        for label, table in (("FFA (MCCS)", ffa), ("ECMP (MCCS(-FA))", ecmp_mean), ("NCCL", nccl_mean)):
            detail.append(fmt_row(f"setup {index}: A on hosts {hosts}", label, table["A"], table["B"], table["C"]))
    comparisons = (
        Comparison("FFA share A:B (expected 2)", statistics.fmean(ffa_a_b), 2.0),
        Comparison("FFA share B:C (expected 1)", statistics.fmean(ffa_b_c), 1.0),
        Comparison("ECMP share A:B", statistics.fmean(ecmp_a_b), 1.7),
        Comparison("FFA vs NCCL, mean over jobs and setups", 100 * (statistics.fmean(speedups) - 1), 75, "%"),
    )
    assumed = ("four setups: A = both GPUs of one host per rack (4 ways), B = GPU 0, C = GPU 1 of the other two",
               f"shares: cross-rack Gbit/s of back-to-back {size_bytes / MB:g} MB AllReduces over {horizon_s:g} s",
               f"ECMP and NCCL: mean over {draws} source-port draws; NCCL ranks alternate A's hosts")
    return ComparisonReport("mccs-tenants", f"MCCS §5 multi-tenant setups, {size_bytes / MB:g} MB AllReduce on the "
                            "2:1 spine-leaf", comparisons, tuple(detail),
                            ("setup", "policy", "A Gbit/s", "B Gbit/s", "C Gbit/s"), assumed)
