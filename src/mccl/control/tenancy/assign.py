"""A path per flow among equal-cost routes: the ECMP baseline, FFA and PFA (MCCS §3.3).

All three take the flows of every job (:mod:`.flows`) and return one route per
(job, sender GPU, receiver GPU). A flow with a single candidate keeps it.

**ECMP** (the baseline a provider does not control): the route a CRC32 hash of the
flow's 5-tuple picks, the source port drawn per connection (as
:func:`mccl.sim.ecmp.flow_key` does; re-rolled by ``salt``).

**FFA** — best-fit fair flow assignment, after Hedera's Global First Fit (Al-Fares
et al., NSDI 2010, §4.1) as MCCS applies it:

1. Every flow with one candidate is placed first; its demand is added to its links' loads.
2. The other flows are taken *in turn across jobs* (round robin: job 1's largest flow,
   job 2's largest, …, then every job's second), so no job's flows all go first and
   take the best paths: the fairness MCCS adds to Hedera's arrival order.
3. Each flow takes the candidate route with the least *excess demand* after adding it:
   ``max over the route's links of max(0, load + demand − capacity) / capacity``; ties
   go to the least maximal utilization ``(load + demand) / capacity`` (best fit: the
   emptiest path), then to the lowest route index (deterministic). Hedera's first fit
   stops at the first path with room; taking the least excess also decides the
   oversubscribed case, where no path has room (2:1 spine-leaf, every tenant busy).

Cost: O(F · R · L) for F flows, R candidates, L links per route — thousands of flows
in milliseconds. Capacities may be measured ones (a degraded link is then avoided:
:mod:`.controller`).

**PFA** — priority flow assignment: the jobs of the highest priority get a reserved
share of the core switches (the *planes*: spines, aggregation switches), in proportion
to their share of the demand that crosses the core, at least one plane and at most all
but one; their flows are assigned by FFA among routes through reserved planes only,
the other jobs' flows by FFA among the rest. A job listed in ``borrowers`` (TS) may also
use the reserved planes: it sends only in the priority job's idle windows
(:mod:`.timeshare`), so it never meets the priority job there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from mccl.control.tenancy.flows import Flow, route_plane
from mccl.errors import ControllerError
from mccl.topology import Topology
from mccl.topology.routing import ecmp_index

__all__ = ["Assignment", "ecmp_assign", "ffa_assign", "pfa_assign", "reserved_planes"]

Assignment = dict[tuple[str, str, str], tuple[int, ...]]  # (job, src, dst) -> route


def _key(flow: Flow) -> tuple[str, str, str]:
    return (flow.job, flow.src, flow.dst)


def ecmp_assign(flows: Sequence[Flow], *, salt: str = "") -> Assignment:
    """What switches hashing 5-tuples would do (module docstring)."""
    import hashlib

    chosen: Assignment = {}
    for flow in flows:
        digest = hashlib.blake2b(f"{flow.job}|{salt}|{flow.src}|{flow.dst}".encode(), digest_size=4).digest()
        port = 49152 + int.from_bytes(digest, "big") % 16384
        key = f"{flow.src}|{flow.dst}|{port}|4791|udp"
        chosen[_key(flow)] = flow.candidates[ecmp_index(key, flow.choices)]
    return chosen


def _in_turn(flows: Sequence[Flow]) -> list[Flow]:
    """Round robin over jobs (in first-appearance order), each job's flows largest demand first."""
    by_job: dict[str, list[Flow]] = {}
    for flow in flows:
        by_job.setdefault(flow.job, []).append(flow)
    queues = [sorted(queue, key=lambda f: (-f.demand_gbps, f.src, f.dst)) for queue in by_job.values()]
    order: list[Flow] = []
    for depth in range(max((len(q) for q in queues), default=0)):
        order.extend(queue[depth] for queue in queues if depth < len(queue))
    return order


def ffa_assign(flows: Sequence[Flow], capacities_gbps: np.ndarray, *,
               allowed: Mapping[tuple[str, str, str], Sequence[tuple[int, ...]]] | None = None,
               load: np.ndarray | None = None) -> tuple[Assignment, np.ndarray]:
    """FFA (module docstring). ``allowed`` narrows a flow's candidates; ``load`` (Gbit/s per link)
    is what is already placed. Returns the routes and the link loads after placing them."""
    caps = np.asarray(capacities_gbps, dtype=float)
    placed = np.zeros(len(caps)) if load is None else np.array(load, dtype=float)
    chosen: Assignment = {}

    def options(flow: Flow) -> Sequence[tuple[int, ...]]:
        narrowed = None if allowed is None else allowed.get(_key(flow))
        return flow.candidates if narrowed is None else narrowed

    fixed = [flow for flow in flows if len(options(flow)) == 1]
    for flow in fixed:
        route = options(flow)[0]
        chosen[_key(flow)] = route
        placed[list(route)] += flow.demand_gbps
    for flow in _in_turn([flow for flow in flows if len(options(flow)) > 1]):
        best: tuple[float, float, int] | None = None
        best_route: tuple[int, ...] = ()
        for index, route in enumerate(options(flow)):
            links = list(route)
            after = placed[links] + flow.demand_gbps
            score = (float(np.max(np.maximum(after - caps[links], 0.0) / caps[links])),
                     float(np.max(after / caps[links])), index)
            if best is None or score < best:
                best, best_route = score, route
        chosen[_key(flow)] = best_route
        placed[list(best_route)] += flow.demand_gbps
    return chosen, placed


def reserved_planes(flows: Sequence[Flow], topology: Topology, priority_jobs: set[str],
                    capacities_gbps: np.ndarray | None = None) -> set[str]:
    """The planes PFA reserves for ``priority_jobs`` (module docstring): the healthiest first (the
    least fraction of nominal capacity left on any of a plane's links), then by name."""
    caps = topology.capacities_gbps if capacities_gbps is None else np.asarray(capacities_gbps, dtype=float)
    health = caps / topology.capacities_gbps

    def worst(plane: str) -> float:
        return min(float(health[link.id]) for link in topology.links if plane in (link.src, link.dst))

    names = {plane for flow in flows for route in flow.candidates for plane in route_plane(topology, route)}
    planes = sorted(names, key=lambda plane: (-worst(plane), plane))
    if len(planes) < 2:
        return set()
    core = [flow for flow in flows if any(route_plane(topology, route) for route in flow.candidates)]
    total = sum(flow.demand_gbps for flow in core)
    mine = sum(flow.demand_gbps for flow in core if flow.job in priority_jobs)
    if total <= 0 or mine <= 0:
        return set()
    count = min(len(planes) - 1, max(1, math.ceil(len(planes) * mine / total - 1e-9)))
    return set(planes[:count])


def pfa_assign(flows: Sequence[Flow], topology: Topology, capacities_gbps: np.ndarray, priorities: Mapping[str, int],
               *, borrowers: Sequence[str] = ()) -> tuple[Assignment, set[str]]:
    """PFA (module docstring): the routes, and the planes reserved for the top-priority jobs."""
    if not priorities:
        raise ControllerError("PFA needs job priorities")
    top = max(priorities.values())
    favoured = {job for job, level in priorities.items() if level == top}
    if len(favoured) == len(set(priorities)):
        chosen, _ = ffa_assign(flows, capacities_gbps)  # nobody is favoured over anybody: plain FFA
        return chosen, set()
    reserved = reserved_planes(flows, topology, favoured, capacities_gbps)
    lenders = set(borrowers)
    allowed: dict[tuple[str, str, str], list[tuple[int, ...]]] = {}
    for flow in flows:
        inside = [r for r in flow.candidates if set(route_plane(topology, r)) <= reserved and route_plane(topology, r)]
        outside = [r for r in flow.candidates if not set(route_plane(topology, r)) & reserved]
        if flow.job in favoured:
            allowed[_key(flow)] = inside or list(flow.candidates)
        elif flow.job in lenders:
            allowed[_key(flow)] = inside or outside or list(flow.candidates)
        else:
            allowed[_key(flow)] = outside or list(flow.candidates)
    first = [flow for flow in flows if flow.job in favoured]
    chosen, load = ffa_assign(first, capacities_gbps, allowed=allowed)
    rest, _ = ffa_assign([flow for flow in flows if flow.job not in favoured], capacities_gbps, allowed=allowed,
                         load=None if lenders else load)
    chosen.update(rest)
    return chosen, reserved
