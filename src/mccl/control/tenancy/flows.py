"""A job's flows as the provider sees them: one per (sender GPU, receiver GPU) connection.

MCCS §3.1 pins paths per connection: each connection is one RoCEv2 queue pair with
one UDP source port, and a switch forwards all of its packets on one path. A
:class:`Flow` is such a connection of a job's schedule, with

* its **volume** — the share of the collective's buffer it carries (sum over its
  transfers of the chunk fractions of a block), which sets its demand relative to the
  job's other flows on the same NIC;
* its **candidates** — the equal-cost routes it may take (the host-internal ones for
  two GPUs of one host: that traffic never meets a switch, as in
  :func:`mccl.sim.ecmp.fabric_routes`);
* its **demand** in Gbit/s — Hedera's "natural demand" simplified to one pass: the
  rate it would get if only the host links (the NICs at both ends) limited it, the
  job's flows sharing a NIC splitting it by volume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mccl.schedule import Schedule
from mccl.topology import Topology
from mccl.topology.model import NodeKind
from mccl.topology.routing import router_for

__all__ = ["Flow", "job_flows", "candidate_routes", "route_plane"]


@dataclass(frozen=True)
class Flow:
    job: str
    src: str  # sender GPU
    dst: str  # receiver GPU
    volume: float  # fraction of a block carried, summed over the flow's transfers
    demand_gbps: float
    candidates: tuple[tuple[int, ...], ...]

    @property
    def pair(self) -> tuple[str, str]:
        return (self.src, self.dst)

    @property
    def choices(self) -> int:
        return len(self.candidates)


def candidate_routes(topology: Topology, src: str, dst: str) -> tuple[tuple[int, ...], ...]:
    """Equal-cost routes ``src → dst``; host-internal ones only for two GPUs of one host."""
    options = router_for(topology).routes(src, dst)
    host = topology.node(src).host
    if host is not None and host == topology.node(dst).host:
        inside = [route for route in options
                  if all(topology.node(topology.links[link].dst).host == host for link in route)]
        if inside:
            return tuple(inside)
    return tuple(options)


def route_plane(topology: Topology, route: Sequence[int]) -> tuple[str, ...]:
    """The core switches a route crosses (spines, aggregation switches): what PFA reserves."""
    nodes = [topology.links[link].dst for link in route[:-1]]
    return tuple(node for node in nodes if topology.node(node).kind in (NodeKind.AGGREGATION, NodeKind.SWITCH))


def job_flows(job: str, schedule: Schedule, topology: Topology,
              capacities_gbps: np.ndarray | None = None) -> list[Flow]:
    """The connections of ``schedule`` (one per GPU pair it sends between), with volumes,
    candidate routes and demands (module docstring); ``capacities_gbps`` defaults to the topology's."""
    caps = topology.capacities_gbps if capacities_gbps is None else np.asarray(capacities_gbps, dtype=float)
    transfers = schedule.transfers
    n = schedule.n_ranks
    fraction = schedule.chunks.fraction[transfers.chunk]
    pair_ids = transfers.sender.astype(np.int64) * n + transfers.receiver
    pairs, inverse = np.unique(pair_ids, return_inverse=True)
    volumes = np.bincount(inverse, weights=fraction, minlength=len(pairs))
    endpoints = [(schedule.ranks[int(p) // n], schedule.ranks[int(p) % n]) for p in pairs]
    candidates = [candidate_routes(topology, src, dst) for src, dst in endpoints]
    per_link: dict[int, float] = {}  # the job's volume on each host-side link
    for volume, routes in zip(volumes, candidates, strict=True):
        for link in {routes[0][0], routes[0][-1]}:
            per_link[link] = per_link.get(link, 0.0) + float(volume)
    flows = []
    for (src, dst), volume, routes in zip(endpoints, volumes, candidates, strict=True):
        demand = min(float(caps[link]) * float(volume) / per_link[link] for link in {routes[0][0], routes[0][-1]})
        flows.append(Flow(job, src, dst, float(volume), demand, routes))
    return flows
