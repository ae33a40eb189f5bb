"""Analytic (α-β) evaluation of a schedule on a topology.

Completion time = latency term + bandwidth term:

* bandwidth term: every link a carries ``load_a`` blocks of ``S/n`` bytes; with
  perfect pipelining the collective is paced by the most loaded link relative to
  its capacity, ``max_a load_a · (S/n) / C_a``;
* latency term: the steps run one after another; a step costs the largest route
  latency (sum of its links' latencies) among its transfers, plus an optional
  fixed per-step overhead (a software α).

This is exact for a single ring or a single tree when bandwidth dominates, and a
bound otherwise (the flow-level simulator of :mod:`mccl.sim` models contention
and dependencies). algbw and busbw follow nccl-tests (DESIGN.md, "Units").

Cost. The model reads a schedule only through the transfers' aggregates
(:meth:`~mccl.schedule.Transfers.link_sums`, ``step_max_route_cost``, ``max_link``):
O(transfers · route length) for stored transfers, and closed form for compact ones
(:mod:`mccl.schedule.pattern`: the NCCL-style rings of :mod:`mccl.synth.ring`), so a
2048-GPU ring is evaluated in milliseconds without expanding its 33.5 M transfers.
The same schedule can be evaluated on faulted copies of its topology (same links,
other capacities), as a static NCCL schedule is under Fail1/2/3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.errors import MCCLError
from mccl.schedule import Collective, Schedule, gbps_to_gbs, link_load
from mccl.topology import Topology

__all__ = ["Evaluation", "evaluate", "busbw_factor"]


def busbw_factor(collective: Collective | str, n_ranks: int) -> float:
    """nccl-tests' busbw / algbw: (n-1)/n, or 2(n-1)/n for AllReduce."""
    factor = (n_ranks - 1) / n_ranks
    return 2 * factor if Collective(collective) is Collective.ALLREDUCE else factor


@dataclass(frozen=True)
class Evaluation:
    """The α-β estimate of one collective of ``size_bytes`` (nccl-tests size S)."""

    collective: Collective
    n_ranks: int
    size_bytes: float
    time_s: float
    bandwidth_time_s: float
    latency_time_s: float
    algbw_gbs: float
    busbw_gbs: float
    steady_state_algbw_gbs: float  # the algbw as S → ∞
    bottleneck_links: tuple[int, ...]
    link_bytes: np.ndarray  # bytes each link carries


def evaluate(
    schedule: Schedule,
    topology: Topology,
    size_bytes: float,
    *,
    step_overhead_us: float = 0.0,
) -> Evaluation:
    """Estimate completion time, algbw and busbw of ``schedule`` for an S of ``size_bytes``."""
    if not size_bytes > 0:
        raise MCCLError(f"size must be positive, got {size_bytes} bytes")
    if len(topology.links) <= schedule.transfers.max_link():
        raise MCCLError(f"schedule uses link ids beyond topology {topology.name!r}; validate it first")
    n = schedule.n_ranks
    block_bytes = size_bytes / n
    load = link_load(schedule, len(topology.links))
    capacity_bytes_per_s = gbps_to_gbs(topology.capacities_gbps) * 1e9
    seconds_per_link = load * block_bytes / capacity_bytes_per_s
    bandwidth_time = float(seconds_per_link.max(initial=0.0))
    tolerance = 1e-9 * max(bandwidth_time, 1e-30)
    bottleneck = tuple(int(a) for a in np.flatnonzero((load > 0) & (seconds_per_link >= bandwidth_time - tolerance)))

    transfers = schedule.transfers
    per_step = transfers.step_max_route_cost(topology.latencies_us)
    latency_time = float((per_step.sum() + step_overhead_us * transfers.n_steps) * 1e-6)

    time = bandwidth_time + latency_time
    algbw = size_bytes / time / 1e9
    used = load > 0
    steady = float(n * np.min(capacity_bytes_per_s[used] / load[used]) / 1e9) if np.any(used) else float("inf")
    return Evaluation(
        collective=schedule.collective,
        n_ranks=n,
        size_bytes=float(size_bytes),
        time_s=time,
        bandwidth_time_s=bandwidth_time,
        latency_time_s=latency_time,
        algbw_gbs=algbw,
        busbw_gbs=algbw * busbw_factor(schedule.collective, n),
        steady_state_algbw_gbs=steady,
        bottleneck_links=bottleneck,
        link_bytes=load * block_bytes,
    )
