"""Groups that share a faulted host, evaluated together (Fig. 14's Llama DP groups under a fault).

Llama's 8 DP groups of a stage (one per rail) each hold one GPU of every host and use that GPU's
NIC. With relays (:mod:`mccl.experiments.fig14_fabric`) the group of ``gpu0`` may leave its host
through the NICs of GPUs 1–7 — which the other 7 groups are using at the same time. So every group
of the kind with a GPU on a faulted host is evaluated **together**, α-β on the union of their link
loads on the whole fabric: time = the most loaded cable's bytes / capacity + the largest latency term.

* NCCL: every group runs its ring (NCCL's default for inter-node rings; PXN only reroutes
  AllToAll / send-recv peers on another rail, a same-rail ring never uses it), each on its group's
  overlay without relays.
* mccl: the other groups keep their rings (their own links are healthy and their ring is at their cut
  bound). The faulted group is re-synthesized with relays on the **capacity the others leave**:
  for a joint phase of length T, link a offers ``C_a − others_bytes_a / T``. T is the smallest
  value at which the faulted group's AllGather cut bound on that residual fabric fits in T
  (bisection on the cheap max-flow bound; the synthesizer runs once, at that T). mccl's time is the
  joint time of that schedule with the others' rings, never more than NCCL's (the controller keeps
  the faster).
* What the disjoint assumption would have claimed: the faulted group synthesized with relays at full
  capacity and timed alone — :func:`disjoint_claim` (benchmark only: one more synthesis).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mccl.experiments.fig14_fabric import group_fabric, link_map
from mccl.experiments.fig14_workloads import CollectiveCall
from mccl.schedule import Collective, Schedule
from mccl.sim.analytic import Evaluation
from mccl.synth import allgather_cut_bound
from mccl.topology import Topology

__all__ = ["GroupModel", "JointTimes", "joint_times", "disjoint_claim", "RESIDUAL_FLOOR", "BISECTION_STEPS"]

RESIDUAL_FLOOR = 1e-3  # a link the others fill keeps this share of its capacity, at least 1 Gbit/s (a topology needs > 0)
BISECTION_STEPS = 14  # on T between the others' time and NCCL's joint time: ≤ 0.01 % of the range


class GroupModel(Protocol):
    """What joint timing needs of :class:`mccl.experiments.fig14.Fig14Model` (its caches), without importing it."""

    bound_tolerance: float

    def schedule(self, fabric: Topology, ranks: tuple[str, ...], collective: Collective,
                 method: str | None) -> Schedule | None: ...

    def evaluation(self, schedule: Schedule, fabric: Topology, size: float) -> Evaluation: ...

    def bound_time(self, fabric: Topology, ranks: tuple[str, ...], size: float) -> float: ...


@dataclass(frozen=True)
class JointTimes:
    """One call's groups on a faulted host, together: NCCL, mccl, and the terms behind them."""

    nccl_s: float  # every touching group's baseline, union of link loads
    nccl_disjoint_s: float  # the same groups timed alone, max (what the disjoint assumption gives)
    mccl_s: float  # min(nccl_s, faulted group re-optimized with relays on the residual + others' baselines)
    reopt_s: float | None  # the joint time with the re-optimized schedule (None: skipped at bound)
    target_s: float | None  # T the residual was sized for
    choice: str
    n_groups: int


def _bytes_on(full: Topology, sub: Topology, link_bytes: np.ndarray) -> np.ndarray:
    out = np.zeros(len(full.links))
    np.add.at(out, link_map(full, sub), link_bytes)
    return out


def _reverse_links(topology: Topology) -> np.ndarray:
    """For each link, the id of the link in the opposite direction of the same cable."""
    index = {(link.src, link.dst): link.id for link in topology.links}
    return np.array([index[link.dst, link.src] for link in topology.links], dtype=np.int64)


def joint_times(model: GroupModel, faulted: Topology, touching: list[tuple[str, ...]], call: CollectiveCall,
                relay_hosts: frozenset[str], baseline: str) -> JointTimes:
    """NCCL and mccl for the groups in ``touching`` (the group holding the fault first) run together."""
    size = call.size_bytes
    caps = faulted.capacities_gbps / 8 * 1e9  # bytes/s per cable
    loads, latencies, alone = [], [], []
    for ranks in touching:
        sub = group_fabric(faulted, ranks)
        schedule = model.schedule(sub, ranks, call.collective, baseline)
        assert schedule is not None
        evaluation = model.evaluation(schedule, sub, size)
        loads.append(_bytes_on(faulted, sub, evaluation.link_bytes))
        latencies.append(evaluation.latency_time_s)
        alone.append(evaluation.time_s)
    nccl = float(np.max(sum(loads) / caps)) + max(latencies)
    others = sum(loads[1:], np.zeros(len(caps)))
    others_latency = max(latencies[1:], default=0.0)

    ranks = touching[0]
    relay = group_fabric(faulted, ranks, relay_hosts)
    base_bandwidth = float(np.max(loads[0] / caps))
    if base_bandwidth <= model.bound_time(relay, ranks, size) * (1 + model.bound_tolerance):
        return JointTimes(nccl, max(alone), nccl, None, None, "skipped at bound", len(touching))
    sub_gbps = relay.capacities_gbps
    others_gbps = others[link_map(faulted, relay)] * 8 / 1e9  # Gbit per cable direction
    reverse = _reverse_links(relay)

    def residual(target_s: float) -> Topology:
        # the same capacity both ways of a cable (the busier direction decides), whole Gbit/s: tree packing's
        # switch removal stays on its fast path (in = out at every switch), the bound moves by < 1 Gbit/s per cable
        used = np.maximum(others_gbps, others_gbps[reverse]) / target_s
        left = np.floor(np.maximum(sub_gbps - used, RESIDUAL_FLOOR * sub_gbps))
        return relay.with_capacities(np.maximum(left, 1.0))

    low, high = float(np.max(others / caps)), nccl
    for _ in range(BISECTION_STEPS):  # smallest T whose residual lets the faulted group finish within T
        middle = (low + high) / 2
        if size / (allgather_cut_bound(residual(middle), ranks).algbw_gbs * 1e9) <= middle:
            high = middle
        else:
            low = middle
    schedule = model.schedule(residual(high), ranks, call.collective, None)
    assert schedule is not None
    evaluation = model.evaluation(schedule, relay, size)
    together = others + _bytes_on(faulted, relay, evaluation.link_bytes)
    reopt = float(np.max(together / caps)) + max(others_latency, evaluation.latency_time_s)
    choice = "re-optimized, joint" if reopt < nccl else "baseline kept (faster)"
    return JointTimes(nccl, max(alone), min(nccl, reopt), reopt, high, choice, len(touching))


def disjoint_claim(model: GroupModel, faulted: Topology, touching: list[tuple[str, ...]], call: CollectiveCall,
                   relay_hosts: frozenset[str], baseline: str) -> tuple[float, float]:
    """The faulted group (``touching[0]``) re-optimized with relays at full capacity: (its time alone — what
    the "groups use disjoint links" assumption would have claimed —, its joint time next to the others'
    baselines — what running that schedule would really cost)."""
    size = call.size_bytes
    caps = faulted.capacities_gbps / 8 * 1e9
    others, latency = np.zeros(len(caps)), 0.0
    for ranks in touching[1:]:
        sub = group_fabric(faulted, ranks)
        schedule = model.schedule(sub, ranks, call.collective, baseline)
        assert schedule is not None
        evaluation = model.evaluation(schedule, sub, size)
        others += _bytes_on(faulted, sub, evaluation.link_bytes)
        latency = max(latency, evaluation.latency_time_s)
    relay = group_fabric(faulted, touching[0], relay_hosts)
    schedule = model.schedule(relay, touching[0], call.collective, None)
    assert schedule is not None
    alone = model.evaluation(schedule, relay, size)
    together = others + _bytes_on(faulted, relay, alone.link_bytes)
    return alone.time_s, float(np.max(together / caps)) + max(latency, alone.latency_time_s)
