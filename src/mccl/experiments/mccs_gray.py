"""Beyond both papers: one controller runs the tenancy policies and the gray-failure loop (``mccs-gray``).

MCCS re-plans tenants' paths but learns nothing from the fabric; mccl's loop re-plans
schedules around a slow link but for one job. Here one
:class:`~mccl.control.tenancy.TenancyController` does both. Three tenants share the 2:1
spine-leaf under PFA (A, priority, on GPU 0 of every host; B and C on GPU 1 of two hosts
each, placement of :mod:`.mccs_training`), every job running 128 MB AllReduces back to back.
PFA reserves spine 0 for A. At ``fault_s`` the link leaf0 → spine0 — on A's reserved plane —
slows to ``factor`` of its 50 Gbit/s (a gray failure: slower, not dead).

Every ``interval_s`` the closed-loop hook hands the controller the per-path throughput of
every tenant (the simulator's path samples, what mccl's passive telemetry measures). The
controller finds a path under 60 % of its reference, localizes the slow core link (crossed
by degraded paths, by no healthy one), measures it, and re-plans *every* tenant that
crosses it: PFA now reserves the healthy spine for A, B and C take the other. Each changed
plan is swapped in from the job's next AllReduce. Without the loop (static PFA) A keeps the
slow spine. The same with FFA instead of PFA: the loop moves every tenant's flows off the slow
link, sharing the healthy spine fairly, no one favoured. The table gives each job's algbw
before the fault, and after it with and without the loop for both policies; ``events`` the
detections and re-plans.
"""

from __future__ import annotations

import statistics

from mccl.control.tenancy import JobProfile, PathRate, Policy, TenancyController, TenantJob
from mccl.experiments.mccs_common import MB, ComparisonReport, fmt_row, testbed
from mccl.experiments.mccs_training import PLACEMENT
from mccl.schedule import Collective
from mccl.sim import CollectiveOp, ControlHook, ControlView, Job, SimOptions, SimResult, gray_failure, simulate
from mccl.topology import Topology

__all__ = ["gray_tenants"]


def _controller(fabric: Topology, size_bytes: float, policy: Policy) -> TenancyController:
    controller = TenancyController(fabric, policy)
    for name, gpus in PLACEMENT.items():
        controller.register(TenantJob(name, gpus, JobProfile(Collective.ALLREDUCE, size_bytes),
                                      priority=1 if name == "A" else 0))
    return controller


def _simulate(fabric: Topology, size_bytes: float, horizon_s: float, fault_s: float, factor: float,
              interval_s: float, policy: Policy, loop: bool, events: list[tuple[float, str]]) -> SimResult:
    controller = _controller(fabric, size_bytes, policy)
    jobs = [Job(name, (CollectiveOp(plan.schedule, size_bytes),), iterations=10**6, until_s=horizon_s)
            for name, plan in controller.plans.items()]
    reserved = sorted(next(iter(controller.plans.values())).reserved)
    if reserved:
        events.append((0.0, f"PFA reserves {', '.join(reserved)} for A"))

    def loop_once(view: ControlView) -> None:
        rates = [PathRate(s.job, s.src, s.dst, s.route, s.gbps) for s in view.samples]
        slow = controller.observe_paths(rates)
        if not slow:
            return
        events.append((view.time_s, controller.events[-1]))
        for name, plan in controller.replan().items():
            view.swap(name, "allreduce", plan.schedule)
            reserved_now = f"; reserved for A: {', '.join(sorted(plan.reserved))}" if plan.reserved else ""
            events.append((view.time_s, f"{policy.value.upper()}: plan v{plan.version} for {name}{reserved_now}"))

    changes = gray_failure(fabric, ("leaf0", "spine0"), start_s=fault_s, factor=factor)
    return simulate(fabric, jobs, changes=changes, hook=ControlHook(interval_s, loop_once) if loop else None,
                    options=SimOptions(keep_chain=False))


def _algbw(result: SimResult, job: str, start: float, stop: float) -> float:
    runs = [run for run in result.runs_of(job) if run.start_s >= start and run.end_s <= stop]
    if not runs:
        return float("nan")
    return statistics.fmean(run.algbw_gbs for run in runs)


def gray_tenants(size_bytes: float = 128 * MB, *, horizon_s: float = 3.0, fault_s: float = 1.0, factor: float = 0.2,
                 interval_s: float = 0.05, settle_s: float = 0.5) -> ComparisonReport:
    """``mccs-gray`` (module docstring)."""
    fabric = testbed()
    events: list[tuple[float, str]] = []
    runs = {(policy, loop): _simulate(fabric, size_bytes, horizon_s, fault_s, factor, interval_s, policy, loop,
                                      events if loop else [])
            for policy in (Policy.PFA, Policy.FFA) for loop in (False, True)}
    after = fault_s + settle_s
    detail = tuple(fmt_row(job, _algbw(runs[(Policy.PFA, False)], job, 0.0, fault_s),
                           *(_algbw(runs[key], job, after, horizon_s) for key in runs)) for job in PLACEMENT)
    assumed = (f"leaf0->spine0 at {factor:g}x from {fault_s:g} s; telemetry every {interval_s * 1e3:g} ms; "
               f"algbw after the fault averaged from {after:g} s to {horizon_s:g} s",
               "A: priority 1 on gpu0, gpu2, gpu4, gpu6; B: gpu1, gpu5; C: gpu3, gpu7")
    return ComparisonReport("mccs-gray", f"Tenancy policies and the gray-failure loop together: PFA and FFA, "
                            f"{size_bytes / MB:g} MB AllReduces, leaf0->spine0 at {factor:g}x", (), detail,
                            ("job", "healthy (PFA) GB/s", "degraded: PFA static", "PFA + loop", "FFA static",
                             "FFA + loop"), assumed, tuple(sorted(events, key=lambda event: event[0])))
