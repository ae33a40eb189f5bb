"""mccl-paper Fig. 14 (§6.3): training time of Llama-3.1-405B and DeepSeek-V3 on 128–2048 GPUs, healthy
and under Fail1/Fail2/Fail3, NCCL-style static schedules against mccl's re-optimized ones.

The model (what a step costs):

* **Collectives.** The workloads of :mod:`mccl.experiments.fig14_workloads` (one pipeline stage on
  HPN segments of 16 hosts × 8 GPUs). Each collective runs on every group of its kind at once;
  synchronous training waits for the slowest group, so a call costs ``max`` over its groups.
  All three faults sit on GPU 0, so only the group holding ``gpu0`` can differ from a healthy
  one; every other group has the healthy time of the same shape (HPN is symmetric across hosts,
  rails and segments). Per call we therefore evaluate two groups: the one holding ``gpu0`` on the
  faulted fabric (or, where groups share the faulted host, all of those together) and the same group
  on the healthy fabric, and take the max.
* **Concurrency.** Groups of one kind run at once. Where they use disjoint links they are evaluated
  alone on their own links (a TP group stays in its host; an EP group holds whole hosts; a DP rail ring
  uses its own rail's NICs, ToRs and ToR↔aggregation cables; checked: the two EP groups of a segment
  under Fail2 share 0 links). Where they do not — Llama's 8 DP groups all hold a GPU of the faulted
  host, and the faulted group's relays use the other 7 groups' NICs — every group touching the
  faulted host is evaluated **together**, α-β on the union of their link loads, and mccl
  re-synthesizes the faulted group on the capacity the others leave
  (:mod:`mccl.experiments.fig14_joint`). What this still loses: overlap of communication with compute
  and of different kinds with each other (a step here is compute + Σ collectives, none hidden),
  stragglers, and pipeline bubbles.
* **Group fabric (the overlay)** (:mod:`mccl.experiments.fig14_fabric`). A group's synthesizer sees the
  group's GPUs, their NVSwitches and — when the group spans more than one host — the ToRs its GPUs
  attach to and the aggregation layer, plus, on the hosts a fault touches, the host's other GPUs
  (as relay-only switch nodes: the synthesizers drop non-rank GPUs of a topology) and their ToRs: the
  PXN detour of a member whose NIC is degraded. A one-host group (Llama TP) sees its NVSwitch only (a
  loop out of one NIC and back through another would beat the ring on a healthy host by 12 %, against
  the paper's "no gain without failures").
* **Schedules.** NCCL: ``optimize(fabric, coll, ranks, method="ring.nccl")`` for AllGather /
  ReduceScatter, ``"alltoall.direct"`` (PXN, 4 chunks per block) for AllToAll. These do not look at
  capacities, so planning them on the healthy or the faulted fabric gives the same schedule for
  Fail1/Fail2; Fail3 moves GPU 0 to another host, which a static library meets by re-planning at
  communicator set-up, so the baseline is planned on the fabric it runs on. mccl:
  ``optimize(faulted fabric, coll, ranks)`` (tree packing, column generation), and the controller
  never runs something slower than the baseline: mccl's time is ``min(baseline, re-optimized)``
  (issue 11, deliverable 3). When the baseline already reaches the group's AllGather cut bound
  (max-flow; it also bounds the ReduceScatter, its reverse, on these duplex fabrics) within
  0.5 %, no schedule can be faster and the synthesizer is not run (``skipped at bound``): this
  is what keeps 256-rank DP groups affordable (tree packing on a 256-rank DP group: 58.5 s CPU
  healthy, 24.8 s under Fail2, and it comes out 0.2 % slower than the ring).
* **Times.** α-β (:func:`mccl.sim.analytic.evaluate`) by default: bandwidth term of the most loaded
  link plus per-step route latencies. Exact for rings (the flow simulator agrees within 0.2 %); for
  trees and relayed AllToAll paths it is the fluid optimum, optimistic against the flow-level
  simulator (64-GPU tree packing: flow 1.25–1.44× its α-β). With ``slices`` the groups of up to
  64 GPUs run on the flow-level simulator instead, and the controller's min() compares simulated
  times; the DP rings of 128–256 GPUs and every jointly timed call stay α-β (rings: exact).
* **The step.** Headline: the paper's forward and backward pass on a batch of 16K tokens per DP rank
  (§6.3, Table 1): 2 micro-batches (Llama), 4 (DeepSeek), plus the per-step FSDP / ZeRO-1
  collectives once. Variant (a column): workloads.md's global-batch step (256 / 240 micro-batches).
* **Compute.** From the paper's communication shares: on the healthy fabric with NCCL,
  collectives are ``share`` of the step (Llama 34 %, DeepSeek 65 %), so compute =
  comm × (1 − share) / share, per model, step definition and cluster size; it is the same under
  every fault and for both libraries.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from mccl.errors import MCCLError
from mccl.experiments.fig14_fabric import fault_hosts, group_fabric
from mccl.experiments.fig14_joint import joint_times
from mccl.experiments.fig14_results import CallTime, StepResult
from mccl.experiments.fig14_workloads import STEPS, WORKLOADS, CollectiveCall, Workload, check_size, groups
from mccl.experiments.report import ScenarioReport
from mccl.schedule import Collective, Schedule
from mccl.sim.analytic import Evaluation, evaluate
from mccl.sim.engine import simulate_schedule
from mccl.sim.inputs import SimOptions
from mccl.synth import allgather_cut_bound, optimize
from mccl.topology import Topology, apply_fault, rail_optimized

__all__ = ["FAULT_STATES", "SIZES", "STEPS", "BOUND_TOLERANCE", "FLOW_MAX_RANKS", "group_fabric", "CallTime", "StepResult", "Fig14Report",
           "Fig14Model", "fig14_training"]

FAULT_STATES = ("healthy", "Fail1", "Fail2", "Fail3")
SIZES = (128, 256, 512, 1024, 2048)
BOUND_TOLERANCE = 0.005  # a baseline within 0.5 % of the cut bound is left alone
FLOW_MAX_RANKS = 64  # with ``slices``: groups up to this size run on the flow simulator (EP, TP), larger ones α-β
_BASELINE = {Collective.ALLGATHER: "ring.nccl", Collective.REDUCESCATTER: "ring.nccl",
             Collective.ALLTOALL: "alltoall.direct"}


@dataclass(frozen=True)
class Fig14Report(ScenarioReport):
    """A :class:`ScenarioReport` whose table is training time, not algbw: ``columns`` and ``cells`` are
    what ``mccl sim fig14`` prints; ``steps`` the results behind them."""

    steps: tuple[StepResult, ...] = ()
    columns: tuple[str, ...] = ()
    cells: tuple[tuple[str, ...], ...] = field(default=())

    def plot(self, out_dir: str | Path) -> Path:
        from mccl.experiments.fig14_plot import plot_fig14

        headline = self.steps[0].step if self.steps else "16k"
        return plot_fig14([step for step in self.steps if step.step == headline], self.title, out_dir, self.name)


class Fig14Model:
    """Schedules and α-β times per group shape, cached: the same group fabric (same links, same
    capacities) and ranks give the same schedule, at every cluster size where it recurs."""

    def __init__(self, *, bound_tolerance: float = BOUND_TOLERANCE, slices: int | None = None,
                 flow_max_ranks: int = FLOW_MAX_RANKS) -> None:
        if slices is not None and slices < 1:
            raise MCCLError(f"slices must be >= 1 (or None for alpha-beta), got {slices}")
        self.bound_tolerance = bound_tolerance
        self.slices = slices  # None: α-β everywhere; k: the flow simulator (k slices) on groups ≤ flow_max_ranks
        self.flow_max_ranks = flow_max_ranks
        self._times: dict[tuple[int, float], float] = {}
        self._evaluations: dict[tuple[int, float], Evaluation] = {}
        self._schedules: dict[tuple[object, ...], tuple[Schedule | None, float]] = {}
        self._bounds: dict[tuple[object, ...], float] = {}
        self._fabrics: dict[tuple[int, str], Topology] = {}
        self._calls: dict[tuple[str, int, str], tuple[CallTime, ...]] = {}
        self.synth_cpu_s = 0.0

    def fabric(self, n_gpus: int, fault: str) -> Topology:
        key = (n_gpus, fault)
        if key not in self._fabrics:
            healthy = rail_optimized(n_gpus // 128, 16, 8)
            self._fabrics[key] = healthy if fault == "healthy" else apply_fault(healthy, fault)
        return self._fabrics[key]

    @staticmethod
    def _shape(fabric: Topology, ranks: tuple[str, ...]) -> tuple[object, ...]:
        return (ranks, tuple((link.src, link.dst, link.gbps, link.latency_us) for link in fabric.links),
                tuple((node.id, node.host) for node in fabric.nodes if node.is_gpu))

    def schedule(self, fabric: Topology, ranks: tuple[str, ...], collective: Collective,
                 method: str | None) -> Schedule | None:
        """``optimize``'s schedule (cached per shape); None when ``method`` is mccl's and the baseline is
        already at the cut bound (the synthesizer is then not run)."""
        key = (self._shape(fabric, ranks), collective, method)
        if key not in self._schedules:
            started = time.process_time()
            options = {"chunks": 4} if method == "alltoall.direct" else {}
            result = optimize(fabric, collective, ranks, method=method, **options)
            self._schedules[key] = (result.schedule, time.process_time() - started)
            if method is None:
                self.synth_cpu_s += time.process_time() - started
        return self._schedules[key][0]

    def bound_time(self, fabric: Topology, ranks: tuple[str, ...], size: float) -> float:
        """The AllGather cut bound's time for nccl-tests S = ``size``: no schedule moves it faster."""
        key = self._shape(fabric, ranks)
        if key not in self._bounds:
            self._bounds[key] = allgather_cut_bound(fabric, ranks).algbw_gbs
        return size / (self._bounds[key] * 1e9)

    def evaluation(self, schedule: Schedule, fabric: Topology, size: float) -> Evaluation:
        """α-β of ``schedule`` on ``fabric`` (the fabric it was built on), cached per schedule and size."""
        key = (id(schedule), size)
        if key not in self._evaluations:
            self._evaluations[key] = evaluate(schedule, fabric, size)
        return self._evaluations[key]

    def time_s(self, schedule: Schedule, fabric: Topology, size: float) -> float:
        """The schedule's completion time: flow-level simulation when enabled and the group is small enough,
        α-β otherwise (cached per schedule and size; schedules are kept by the cache, so ids are stable)."""
        key = (id(schedule), size)
        if key not in self._times:
            if self.slices is not None and schedule.n_ranks <= self.flow_max_ranks:
                self._times[key] = simulate_schedule(schedule, fabric, size,
                                                     options=SimOptions(slices=self.slices)).time_s
            else:
                self._times[key] = evaluate(schedule, fabric, size).time_s
        return self._times[key]

    def group_times(self, fabric: Topology, ranks: tuple[str, ...], call: CollectiveCall
                    ) -> tuple[float, float | None, str]:
        """(baseline s, re-optimized s or None, mccl's choice) for one group on ``fabric``."""
        sub = group_fabric(fabric, ranks)
        base = self.schedule(sub, ranks, call.collective, _BASELINE[call.collective])
        assert base is not None
        base_s = self.time_s(base, sub, call.size_bytes)
        if call.collective is not Collective.ALLTOALL:
            bound = self.bound_time(sub, ranks, call.size_bytes)
            if evaluate(base, sub, call.size_bytes).bandwidth_time_s <= bound * (1 + self.bound_tolerance):
                return base_s, None, "skipped at bound"
        reopt = self.schedule(sub, ranks, call.collective, None)
        assert reopt is not None
        reopt_s = self.time_s(reopt, sub, call.size_bytes)
        return base_s, reopt_s, "re-optimized" if reopt_s < base_s else "baseline kept (faster)"

    def _relays_apply(self, faulted: Topology, ranks: tuple[str, ...], relay_hosts: frozenset[str]) -> bool:
        """Whether the group spans hosts and a faulted host has GPUs outside it (that could relay)."""
        members = set(ranks)
        return (len({faulted.node(gpu).host for gpu in ranks}) > 1
                and any(node.is_gpu and node.host in relay_hosts and node.id not in members for node in faulted.nodes))

    def call_times(self, workload: Workload, n_gpus: int, fault: str) -> tuple[CallTime, ...]:
        """Every call of ``workload`` once (count 1): per call, the slowest group for each library. Groups
        sharing a faulted host with relays available are timed together (:mod:`mccl.experiments.fig14_joint`)."""
        key = (workload.name, n_gpus, fault)
        if key in self._calls:
            return self._calls[key]
        check_size(workload, n_gpus)
        healthy, faulted = self.fabric(n_gpus, "healthy"), self.fabric(n_gpus, fault)
        relay_hosts = fault_hosts(healthy, faulted)
        result = []
        for call in workload.calls:
            every = groups(workload, call.group, n_gpus)
            ranks = every[0]  # the group holding gpu0
            h_base, h_reopt, _ = self.group_times(healthy, ranks, call)
            h_mccl = h_base if h_reopt is None else min(h_base, h_reopt)
            if self._relays_apply(faulted, ranks, relay_hosts):
                touching = [g for g in every if any(faulted.node(gpu).host in relay_hosts for gpu in g)]
                joint = joint_times(self, faulted, touching, call, relay_hosts, _BASELINE[call.collective])
                result.append(CallTime(call, 1, max(h_base, joint.nccl_s), max(h_mccl, joint.mccl_s), joint.choice,
                                       joint.nccl_s, joint.reopt_s, joint.n_groups))
                continue
            f_base, f_reopt, choice = self.group_times(faulted, ranks, call)
            f_mccl = f_base if f_reopt is None else min(f_base, f_reopt)
            result.append(CallTime(call, 1, max(h_base, f_base), max(h_mccl, f_mccl), choice, f_base, f_reopt))
        self._calls[key] = tuple(result)
        return self._calls[key]

    def comm(self, workload: Workload, n_gpus: int, fault: str, step: str = "16k") -> tuple[CallTime, ...]:
        """Every call of one step of kind ``step`` (:data:`STEPS`), with its count per step."""
        microbatches = workload.step_microbatches(step)
        return tuple(dataclasses.replace(c, count=c.call.count(microbatches))
                     for c in self.call_times(workload, n_gpus, fault))

    def step(self, workload: Workload, n_gpus: int, fault: str, step: str = "16k") -> StepResult:
        """One training step: compute (from the paper's share of the healthy NCCL step) + its collectives."""
        started = self.synth_cpu_s
        healthy = self.comm(workload, n_gpus, "healthy", step)
        calls = healthy if fault == "healthy" else self.comm(workload, n_gpus, fault, step)
        healthy_comm = sum(c.count * c.nccl_s for c in healthy)
        compute = healthy_comm * (1 - workload.comm_share) / workload.comm_share
        return StepResult(workload.name, n_gpus, fault, compute, sum(c.count * c.nccl_s for c in calls),
                          sum(c.count * c.mccl_s for c in calls), calls, self.synth_cpu_s - started, step)


COLUMNS = ("model", "GPUs", "fault", "NCCL step (s)", "mccl step (s)", "speedup", "paper", "comm share (NCCL)",
           "largest call (NCCL)", "speedup, GBS step", "synth CPU (s)")


def _cells(step: StepResult, workload: Workload, variant: StepResult | None) -> tuple[str, ...]:
    paper = {"healthy": "1.00x", "Fail2": f"peak {workload.paper_fail2_peak:.2f}x"}.get(step.fault, "-")
    dominant = max(step.calls, key=lambda c: c.count * c.nccl_s)
    share = dominant.count * dominant.nccl_s / step.nccl_comm_s
    return (workload.short, str(step.n_gpus), step.fault, f"{step.nccl_step_s:.3f}", f"{step.mccl_step_s:.3f}",
            f"{step.speedup:.2f}x", paper, f"{step.nccl_comm_s / step.nccl_step_s:.0%}",
            f"{dominant.call.short} {share:.0%}", "-" if variant is None else f"{variant.speedup:.2f}x",
            f"{step.synth_cpu_s:.1f}")


def fig14_training(sizes: tuple[int, ...] = SIZES, faults: tuple[str, ...] = FAULT_STATES,
                   models: tuple[str, ...] = ("llama", "deepseek"), *, slices: int | None = None,
                   model: Fig14Model | None = None, steps: tuple[str, ...] = STEPS) -> Fig14Report:
    """mccl-paper Fig. 14: training time per model, fault and cluster size (one pipeline stage), NCCL-style
    static schedules against mccl's (see the module docstring for every modelling choice).

    ``slices=None``: α-β everywhere (seconds). ``slices=k``: groups of up to 64 GPUs (TP, EP, ZeRO) run on
    the flow-level simulator with k slices per chunk, the DP rings of more GPUs stay α-β (minutes).
    ``steps``: the step definitions (:data:`STEPS`), the first the headline (table, plot); a second one
    (default: workloads.md's global-batch step) adds its speedup as a column (same schedules, other counts)."""
    unknown = [name for name in models if name not in WORKLOADS]
    if unknown:
        raise MCCLError(f"unknown workload {unknown[0]!r}; known: {', '.join(WORKLOADS)}")
    bad = [fault for fault in faults if fault not in FAULT_STATES]
    if bad:
        raise MCCLError(f"unknown fault state {bad[0]!r}; known: {', '.join(FAULT_STATES)}")
    if not steps or any(kind not in STEPS for kind in steps):
        raise MCCLError(f"steps must be a non-empty subset of {', '.join(STEPS)}, got {steps!r}")
    engine = model or Fig14Model(slices=slices)
    results, cells = [], []
    for name in models:
        workload = WORKLOADS[name]
        for n_gpus in sizes:
            for fault in faults:
                headline = engine.step(workload, n_gpus, fault, steps[0])
                variant = engine.step(workload, n_gpus, fault, steps[1]) if len(steps) > 1 else None
                results.extend(step for step in (headline, variant) if step is not None)
                cells.append(_cells(headline, workload, variant))
    how = ("alpha-beta" if engine.slices is None else
           f"flow simulation, {engine.slices} slices, for groups <= {engine.flow_max_ranks} GPUs; alpha-beta above")
    step_name = {"16k": "16K-token step", "gbs": "global-batch step"}[steps[0]]
    title = (f"mccl-paper Fig. 14: training time of one {step_name}, one PP16 stage on HPN segments of 16x8 GPUs, "
             f"NCCL static vs mccl re-optimized ({how}; compute from the paper's comm shares)")
    return Fig14Report("fig14", title, (), steps=tuple(results), columns=COLUMNS, cells=tuple(cells))
