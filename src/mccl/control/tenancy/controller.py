"""The provider's controller for several tenants: jobs, policies, and the gray-failure loop together.

:class:`TenancyController` keeps the registered jobs (:mod:`.jobs`) and computes, for
every job, a :class:`~mccl.control.tenancy.jobs.JobPlan`:

1. the ring — MCCS's locality-aware ring (:func:`mccl.synth.ring.locality_ring`):
   hosts grouped by pod, then rack, each group entered once;
2. a route per flow among the equal-cost ones, by the policy (:mod:`.assign`): ECMP,
   FFA, PFA, or PFA with TS, planned over *all* jobs' flows at once;
3. for the time-shared jobs (TS), send windows from the prioritized job's telemetry
   (:mod:`.timeshare`), once enough of it arrived (until then they run as PFA);
4. the routes pinned into the schedule (:mod:`.pinning`).

The gray-failure loop (beyond MCCS and the mccl paper, which each do half): the same
controller ingests per-path throughput (the telemetry the closed loop uses:
(job, sender GPU, receiver GPU, route, Gbit/s)). Each path learns a reference rate, the
best it achieved under the current plan (re-learned after every re-plan, since a plan
changes which flows share a link). A path running under ``degraded_fraction`` of its
reference is degraded. A *core* link (switch to switch — the only links a path choice
can avoid: a GPU's own NIC is on every route it has) crossed by a degraded path and by
no healthy one is measured at the sum of the rates of the paths crossing it — what the
saturated link delivers. Path telemetry cannot tell apart two links that the same paths
(and only they) cross: both are measured slow, a conservative choice (the plan avoids
both). A measured capacity only goes down; a repaired link is not noticed (that would
need a probe on it: future work). Re-planning then runs the same policy on the measured
capacities: FFA's excess demand steers flows off the slow link, PFA reserves the
healthiest planes for the top priority, so priorities are kept. Every job whose plan
changed gets a new version; the others keep theirs.

To executors, a plan goes the way every schedule does (:meth:`TenancyController.publish`):
registered with the :class:`~mccl.control.manager.ScheduleManager` under the job's name as
communicator, at a version above any it holds, so ranks fetch it and switch by the runtime's
(min version, max seq) agreement. A time-shared job's windows go to its ranks'
:class:`mccl.runtime.sendgate.SendGate` over the controller channel: :mod:`.live` runs this
controller inside the controller service (telemetry in, the ``windows`` message out, windows
served under the plan version they came with).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mccl.control.manager import ScheduleManager
from mccl.control.tenancy.assign import Assignment, ecmp_assign, ffa_assign, pfa_assign
from mccl.control.tenancy.flows import Flow, job_flows
from mccl.control.tenancy.jobs import JobPlan, Policy, TenantJob
from mccl.control.tenancy.pinning import pin_routes
from mccl.control.tenancy.timeshare import idle_windows
from mccl.errors import ControllerError
from mccl.schedule import Schedule
from mccl.synth.common import describe_on
from mccl.synth.ring import locality_ring
from mccl.telemetry import Sample, SendWindows
from mccl.topology import Topology
from mccl.topology.model import NodeKind

__all__ = ["PathRate", "TenancyController"]


@dataclass(frozen=True)
class PathRate:
    """One path's throughput over a telemetry interval."""

    job: str
    src: str
    dst: str
    route: tuple[int, ...]
    gbps: float


def _same_rhythm(old: SendWindows | None, new: SendWindows | None, tolerance: float = 0.02) -> bool:
    """True when ``new`` is ``old`` up to ``tolerance`` of a period in period, phase and window edges:
    then the time-shared job keeps its gate and its plan's version (no churn on every busy interval)."""
    if old is None or new is None or len(old.windows) != len(new.windows):
        return False
    slack = tolerance * old.period_s
    if abs(old.period_s - new.period_s) > slack:
        return False
    phase = (new.origin_s - old.origin_s) % old.period_s
    if min(phase, old.period_s - phase) > slack:
        return False
    return all(abs(a - c) <= slack and abs(b - d) <= slack for (a, b), (c, d) in zip(old.windows, new.windows,
                                                                                     strict=True))


class TenancyController:
    """Jobs, policies, time sharing and degraded links for one fabric (module docstring)."""

    def __init__(self, topology: Topology, policy: Policy | str = Policy.FFA, *, time_shared: Sequence[str] = (),
                 guard_s: float = 1e-3, degraded_fraction: float = 0.6, ecmp_salt: str = "") -> None:
        if not 0 < degraded_fraction < 1:
            raise ControllerError(f"degraded_fraction must be in (0, 1), got {degraded_fraction}")
        self.topology = topology
        self.policy = Policy(policy)
        self.time_shared = tuple(time_shared)
        self.guard_s = guard_s
        self.degraded_fraction = degraded_fraction
        self.ecmp_salt = ecmp_salt
        self.capacities = topology.capacities_gbps.astype(float).copy()  # measured; starts at the nominal
        self.jobs: dict[str, TenantJob] = {}
        self.rings: dict[str, Schedule] = {}
        self.plans: dict[str, JobPlan] = {}
        self.busy: dict[str, list[tuple[float, float]]] = {}
        self.reference: dict[tuple[str, str, str, tuple[int, ...]], float] = {}
        self.events: list[str] = []
        core = [link.id for link in topology.links if topology.node(link.src).kind is not NodeKind.GPU
                and topology.node(link.dst).kind is not NodeKind.GPU
                and NodeKind.NVSWITCH not in (topology.node(link.src).kind, topology.node(link.dst).kind)]
        self.core_links = frozenset(core)

    # -- jobs -----------------------------------------------------------------------
    def register(self, job: TenantJob) -> dict[str, JobPlan]:
        """Add ``job`` and re-plan every job; returns the plans that changed (the new job's included)."""
        if job.name in self.jobs:
            raise ControllerError(f"job {job.name!r} is already registered")
        for gpu in job.ranks:
            self.topology.node(gpu)  # a TopologyError names an unknown GPU
        taken = {gpu: name for name, other in self.jobs.items() for gpu in other.ranks}
        clash = [gpu for gpu in job.ranks if gpu in taken]
        if clash:
            raise ControllerError(f"job {job.name!r} wants GPUs already placed for {taken[clash[0]]!r}: {clash}")
        self.jobs[job.name] = job
        self.rings[job.name] = locality_ring(self.topology, job.profile.collective, list(job.ranks),
                                             channels=job.profile.channels)
        return self.replan()

    def unregister(self, name: str) -> dict[str, JobPlan]:
        if name not in self.jobs:
            raise ControllerError(f"no job {name!r}; registered: {sorted(self.jobs)}")
        del self.jobs[name], self.rings[name]
        self.plans.pop(name, None)
        self.busy.pop(name, None)
        return self.replan()

    def set_policy(self, policy: Policy | str) -> dict[str, JobPlan]:
        self.policy = Policy(policy)
        return self.replan()

    # -- telemetry --------------------------------------------------------------------
    def observe_busy(self, job: str, start_s: float, end_s: float) -> None:
        """The prioritized job communicated from ``start_s`` to ``end_s`` (one iteration's collectives)."""
        if job not in self.jobs:
            raise ControllerError(f"busy interval for unknown job {job!r}")
        history = self.busy.setdefault(job, [])
        history.append((start_s, end_s))
        del history[:-16]  # the recent periods: a job's rhythm may change

    def observe_samples(self, job: str, samples: Iterable[Sample]) -> int:
        """The prioritized job's live telemetry (:class:`mccl.telemetry.Sample`, wall clock): each
        collective's busy interval is the span of its samples' windows (grouped by sequence number),
        from the first window's start to the last window's end. Returns the intervals added."""
        spans: dict[int, list[float]] = {}
        for sample in samples:
            if sample.seconds <= 0:
                continue
            begin, end = sample.end_time - sample.seconds, sample.end_time
            span = spans.setdefault(sample.seq, [begin, end])
            span[0], span[1] = min(span[0], begin), max(span[1], end)
        for seq in sorted(spans):
            self.observe_busy(job, *spans[seq])
        return len(spans)

    def observe_paths(self, rates: Iterable[PathRate]) -> set[int]:
        """Per-path throughput; returns the core links newly measured degraded (module docstring)."""
        degraded_links: dict[int, float] = {}
        healthy_links: set[int] = set()
        for rate in rates:
            if not np.isfinite(rate.gbps):
                continue
            key = (rate.job, rate.src, rate.dst, rate.route)
            best = max(self.reference.get(key, 0.0), rate.gbps)
            self.reference[key] = best
            core = [link for link in rate.route if link in self.core_links]
            if rate.gbps < self.degraded_fraction * best:
                for link in core:
                    degraded_links[link] = degraded_links.get(link, 0.0) + rate.gbps
            else:
                healthy_links.update(core)
        newly = set()
        for link, delivered in degraded_links.items():
            if link in healthy_links or delivered >= self.degraded_fraction * self.capacities[link]:
                continue
            self.capacities[link] = delivered
            newly.add(link)
        if newly:
            names = ", ".join(f"{self.topology.links[i].src}->{self.topology.links[i].dst}" for i in sorted(newly))
            self.events.append(f"degraded: {names}")
        return newly

    def publish(self, manager: ScheduleManager, plans: dict[str, JobPlan] | None = None) -> dict[str, int]:
        """Register ``plans`` (default: all current ones) with ``manager``; returns the version each got
        (the plan's, or one above the manager's active version for that job and collective)."""
        published = {}
        for name, plan in (self.plans if plans is None else plans).items():
            active = manager.latest(name, plan.schedule.collective)
            version = max(plan.version, (active[0] + 1) if active else 0)
            published[name] = manager.register(name, plan.schedule.with_meta(version=version),
                                                size_bytes=self.jobs[name].profile.size_bytes)
        return published

    # -- planning -----------------------------------------------------------------------
    def _gates(self) -> dict[str, SendWindows | None]:
        if self.policy is not Policy.PFA_TS or not self.jobs:
            return {}
        top = max(job.priority for job in self.jobs.values())
        windows = None
        for name, job in self.jobs.items():
            if job.priority == top and self.busy.get(name):
                windows = idle_windows(self.busy[name], guard_s=self.guard_s)
                break
        gates = {}
        for name in self.time_shared:
            if name in self.jobs:
                old = self.plans[name].gate if name in self.plans else None
                gates[name] = old if _same_rhythm(old, windows) else windows
        return gates

    def _assign(self, flows: list[Flow], gates: dict[str, SendWindows | None]) -> tuple[Assignment, frozenset[str]]:
        if self.policy is Policy.ECMP:
            return ecmp_assign(flows, salt=self.ecmp_salt), frozenset()
        if self.policy is Policy.FFA:
            return ffa_assign(flows, self.capacities)[0], frozenset()
        borrowers = [name for name, windows in gates.items() if windows is not None]
        priorities = {name: job.priority for name, job in self.jobs.items()}
        chosen, reserved = pfa_assign(flows, self.topology, self.capacities, priorities, borrowers=borrowers)
        return chosen, frozenset(reserved)

    def replan(self) -> dict[str, JobPlan]:
        """Plan every job under the current policy and capacities; returns the plans that changed."""
        flows = [flow for name, ring in self.rings.items()
                 for flow in job_flows(name, ring, self.topology, self.capacities)]
        gates = self._gates()
        chosen, reserved = self._assign(flows, gates)
        changed: dict[str, JobPlan] = {}
        for name, ring in self.rings.items():
            routes = {(src, dst): route for (job, src, dst), route in chosen.items() if job == name}
            orders = tuple(tuple(int(r) for r in order) for order in ring.transfers.pattern.orders)
            old = self.plans.get(name)
            plan = JobPlan(name, 0, ring, routes, orders, gates.get(name), reserved)
            if old is not None and old.same_strategy(plan):
                continue
            version = 1 if old is None else old.version + 1
            pinned = describe_on(pin_routes(ring, self.topology, routes), self.topology)
            plan = JobPlan(name, version, pinned.with_meta(version=version), routes, orders, gates.get(name), reserved)
            self.plans[name] = changed[name] = plan
        if changed:
            self.reference.clear()  # rates are relative to the flows a plan puts together
        return changed
