"""MCCS §5 training mix: VGG (job A, 4 GPUs, priority) and two GPT jobs (B, C, 2 GPUs each) (``mccs-training``).

Each job is a training loop on the simulator: compute (``gap_s``), then its gradient
AllReduce, repeated. Paths by policy, all from the tenancy controller
(:class:`~mccl.control.tenancy.TenancyController`) except ECMP's hash:

* **ECMP** — the controller's rings, switches hash the connections (mean over draws);
* **FFA** — best-fit fair flow assignment over the three jobs' connections;
* **PFA** — a spine reserved for A (its share of the cross-rack demand, at least one);
* **PFA+TS** — PFA, and B borrows A's spine inside A's idle windows. The windows come from
  A's *telemetry while it runs*: every ``interval_s`` the closed-loop hook hands the
  controller A's finished AllReduces (start, end); once it has four, the controller computes
  the idle windows with a guard band (:mod:`mccl.control.tenancy.timeshare`) and a new plan
  for B (its connections pinned on A's spine, a send gate); the hook swaps B's schedule and
  sets its gate, both from B's next AllReduce on (MCCS §3.2). Until then B runs as in PFA.

A job's speed is its mean iteration time after ``warmup_s`` (iterations that end later).

Inputs the summary does not give (assumed): placement — A on GPU 0 of each host (its
locality ring crosses racks once each way), B on GPU 1 of hosts 0 and 2, C on GPU 1 of hosts
1 and 3, so at every leaf three connections meet two spines; VGG-19: 143.7 M parameters,
a 575 MB fp32 gradient AllReduce and ``vgg_compute_s`` of compute per iteration; GPT-2.7B
on 2 GPUs (data parallel): a 5.4 GB fp16 gradient AllReduce and ``gpt_compute_s``; chunks
move in 32 slices (the send gate holds slices, as the executor posts them; a slice of B is 84 MB,
13 ms at 50 Gbit/s, which the 15 ms guard covers).
"""

from __future__ import annotations

import statistics

from mccl.control.tenancy import JobProfile, Policy, TenancyController, TenantJob
from mccl.experiments.mccs_common import MB, Comparison, ComparisonReport, fmt_row, testbed
from mccl.schedule import Collective
from mccl.sim import CollectiveOp, ControlHook, ControlView, Job, SimOptions, SimResult, simulate
from mccl.sim.ecmp import AS_SCHEDULED, EcmpPaths, PathPolicy
from mccl.topology import Topology

__all__ = ["training_mix", "PLACEMENT"]

PLACEMENT = {"A": ("gpu0", "gpu2", "gpu4", "gpu6"), "B": ("gpu1", "gpu5"), "C": ("gpu3", "gpu7")}
VGG_BYTES = 143.7e6 * 4
GPT_BYTES = 2.7e9 * 2
OPTIONS = SimOptions(slices=32, keep_chain=False)


def _controller(fabric: Topology, policy: Policy, guard_s: float) -> TenancyController:
    controller = TenancyController(fabric, policy, time_shared=("B",) if policy is Policy.PFA_TS else (),
                                   guard_s=guard_s)
    sizes = {"A": VGG_BYTES, "B": GPT_BYTES, "C": GPT_BYTES}
    for name, gpus in PLACEMENT.items():
        controller.register(TenantJob(name, gpus, JobProfile(Collective.ALLREDUCE, sizes[name]),
                                      priority=1 if name == "A" else 0))
    return controller


def _run(fabric: Topology, controller: TenancyController, paths: PathPolicy, horizon_s: float, compute: dict[str, float],
         interval_s: float, events: list[tuple[float, str]] | None = None) -> SimResult:
    sizes = {"A": VGG_BYTES, "B": GPT_BYTES, "C": GPT_BYTES}
    plans = controller.plans
    jobs = [Job(name, (CollectiveOp(plans[name].schedule if paths is AS_SCHEDULED else controller.rings[name],
                                    sizes[name]),), iterations=10**6, gap_s=compute[name], until_s=horizon_s,
                paths=paths, gate=plans[name].gate) for name in PLACEMENT]
    hook = None
    if controller.time_shared:
        def learn(view: ControlView) -> None:
            for run in view.completed:
                if run.job == "A":
                    controller.observe_busy("A", run.start_s, run.end_s)
            for name, plan in controller.replan().items():
                view.swap(name, "allreduce", plan.schedule)
                view.gate(name, plan.gate)
                if events is not None:
                    gate = plan.gate
                    what = "no gate" if gate is None else (f"idle windows {gate.windows[0][0] * 1e3:.0f}-"
                                                           f"{gate.windows[0][1] * 1e3:.0f} ms of every "
                                                           f"{gate.period_s * 1e3:.0f} ms")
                    events.append((view.time_s, f"plan v{plan.version} for {name}: {what}"))
        hook = ControlHook(interval_s, learn)
    return simulate(fabric, jobs, hook=hook, options=OPTIONS)


def _iteration_s(result: SimResult, job: str, warmup_s: float) -> float:
    ends = [run.end_s for run in result.runs_of(job)]
    steady = [b - a for a, b in zip(ends, ends[1:], strict=False) if b > warmup_s]
    if not steady:
        return float("nan")
    return statistics.fmean(steady)


def training_mix(*, horizon_s: float = 30.0, warmup_s: float = 5.0, draws: int = 4, vgg_compute_s: float = 0.3,
                 gpt_compute_s: float = 1.0, guard_s: float = 0.015, interval_s: float = 0.1) -> ComparisonReport:
    """``mccs-training`` (module docstring)."""
    fabric = testbed()
    compute = {"A": vgg_compute_s, "B": gpt_compute_s, "C": gpt_compute_s}
    times: dict[str, dict[str, float]] = {}
    events: list[tuple[float, str]] = []
    ecmp_runs = [_run(fabric, _controller(fabric, Policy.FFA, guard_s), EcmpPaths(f"draw{d}"), horizon_s, compute,
                      interval_s) for d in range(draws)]
    times["ECMP"] = {job: statistics.fmean(_iteration_s(r, job, warmup_s) for r in ecmp_runs) for job in PLACEMENT}
    for policy in (Policy.FFA, Policy.PFA, Policy.PFA_TS):
        controller = _controller(fabric, policy, guard_s)
        result = _run(fabric, controller, AS_SCHEDULED, horizon_s, compute, interval_s,
                      events if policy is Policy.PFA_TS else None)
        times[policy.value.upper()] = {job: _iteration_s(result, job, warmup_s) for job in PLACEMENT}

    def slower(job: str, than: str, base: str) -> float:  # % more time per iteration
        return 100 * (times[than][job] / times[base][job] - 1)

    def faster(job: str, policy: str, base: str) -> float:  # % more iterations per second
        return 100 * (times[base][job] / times[policy][job] - 1)

    comparisons = (
        Comparison("ECMP vs FFA: A slower", slower("A", "ECMP", "FFA"), 18, "%"),
        Comparison("ECMP vs FFA: B slower", slower("B", "ECMP", "FFA"), 22, "%"),
        Comparison("ECMP vs FFA: C slower", slower("C", "ECMP", "FFA"), 14, "%"),
        Comparison("PFA vs FFA: A faster", faster("A", "PFA", "FFA"), 13, "%"),
        Comparison("PFA vs ECMP: A faster", faster("A", "PFA", "ECMP"), 34, "%"),
        Comparison("PFA+TS vs PFA: B faster", faster("B", "PFA+TS", "PFA"), 16, "%"),
    )
    detail = tuple(fmt_row(policy, *(1e3 * table[job] for job in PLACEMENT)) for policy, table in times.items())
    assumed = (f"A = VGG-19: {VGG_BYTES / MB:.0f} MB fp32 gradient AllReduce + {vgg_compute_s:g} s compute per "
               f"iteration on {', '.join(PLACEMENT['A'])}",
               f"B, C = GPT-2.7B data parallel: {GPT_BYTES / MB:.0f} MB fp16 gradient AllReduce + {gpt_compute_s:g} s "
               f"compute; B on {', '.join(PLACEMENT['B'])}, C on {', '.join(PLACEMENT['C'])}",
               f"ECMP: mean over {draws} source-port draws; TS guard {guard_s * 1e3:g} ms + observed jitter; "
               f"telemetry every {interval_s:g} s; {horizon_s:g} s simulated, iterations after {warmup_s:g} s")
    return ComparisonReport("mccs-training", "MCCS §5 training mix (VGG A priority, GPT B and C) on the 2:1 "
                            "spine-leaf", comparisons, detail, ("policy", "A ms/iter", "B ms/iter", "C ms/iter"),
                            assumed, tuple(events[:6]))
