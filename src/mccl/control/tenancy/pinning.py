"""Route pinning (MCCS §3.3): the path a policy chose for a flow becomes its transfers' route.

A Schedule already carries a route per transfer; pinning makes a new Schedule whose
transfers between two GPUs all take the route chosen for that pair, so the
simulator honours it with its default ``AsScheduled`` policy (equivalently
:class:`mccl.sim.ecmp.PinnedPaths`) and an executor on a fabric that routes by UDP
source port (MCCS: the route id written into the RoCEv2 source port, the switch mapping
ports to paths) would send each connection from the port of its route. Nothing is
mutated; a ring keeps its compact form (one route per ring hop).

Kernel-emulated fabric: :mod:`mccl.experiments.netemu.routes` builds a routed two-tier
spine-leaf whose leaves route by source port — ``ip rule ipproto tcp sport <range> lookup
<spine's table>`` — and a flow sent from :func:`route_port` of its route takes that route
(measured on the uplinks' byte counters). gloo's own connections choose no port, so they
are not pinned (see that module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mccl.errors import InvalidSchedule
from mccl.schedule import Schedule, Transfers
from mccl.schedule.pattern import RingPattern, RingTransfers
from mccl.topology import Topology

__all__ = ["pin_routes", "route_port", "schedule_routes", "ROUTE_PORT_BASE", "PORTS_PER_ROUTE"]

ROUTE_PORT_BASE = 49152  # the first dynamic port: route r owns ports BASE + r·PORTS_PER_ROUTE + [0, PORTS_PER_ROUTE)
PORTS_PER_ROUTE = 64  # connections that may take one route at once from one host (a switch rule matches the range)


def route_port(route_index: int, flow: int = 0) -> int:
    """The source port that names route ``route_index`` of a flow's equal-cost group: the ``flow``-th of the
    route's range (several connections of a host may take one route; a range is one switch rule)."""
    if not 0 <= flow < PORTS_PER_ROUTE:
        raise InvalidSchedule(f"flow {flow} of a route: a route has {PORTS_PER_ROUTE} ports")
    if not 0 <= route_index < 16384 // PORTS_PER_ROUTE:
        raise InvalidSchedule(f"route index {route_index} does not fit a dynamic UDP port")
    return ROUTE_PORT_BASE + route_index * PORTS_PER_ROUTE + flow


def _checked(topology: Topology, pair: tuple[str, str], route: Sequence[int]) -> np.ndarray:
    at = pair[0]
    for link_id in route:
        link = topology.link(int(link_id))
        if link.src != at:
            raise InvalidSchedule(f"pinned route for {pair[0]} -> {pair[1]}: link {link_id} leaves {link.src}, not {at}")
        at = link.dst
    if at != pair[1] or not len(route):
        raise InvalidSchedule(f"pinned route for {pair[0]} -> {pair[1]} ends at {at}")
    return np.asarray(route, dtype=np.int64)


def pin_routes(schedule: Schedule, topology: Topology, routes: Mapping[tuple[str, str], Sequence[int]]) -> Schedule:
    """``schedule`` with every transfer between a pinned GPU pair on that pair's route."""
    ranks = schedule.ranks
    index = {gpu: i for i, gpu in enumerate(ranks)}
    unknown = [pair for pair in routes if pair[0] not in index or pair[1] not in index]
    if unknown:
        raise InvalidSchedule(f"pinned routes name GPUs outside the schedule: {unknown[:3]}")
    chosen = {(index[a], index[b]): _checked(topology, (a, b), route) for (a, b), route in routes.items()}
    transfers = schedule.transfers
    if isinstance(transfers, RingTransfers):
        pattern: RingPattern = transfers.pattern
        n = pattern.n
        hops: list[np.ndarray] = []
        for r, order in enumerate(pattern.orders):
            for j in range(n):
                key = (int(order[j]), int(order[(j + 1) % n]))
                start, stop = pattern.hop_offsets[r * n + j], pattern.hop_offsets[r * n + j + 1]
                hops.append(chosen.get(key, pattern.hop_links[start:stop]))
        offsets = np.zeros(len(hops) + 1, dtype=np.int64)
        np.cumsum([len(h) for h in hops], out=offsets[1:])
        pinned = RingPattern(pattern.collective, pattern.orders, pattern.pieces, offsets,
                             np.concatenate(hops).astype(np.int32))
        return Schedule(schedule.collective, ranks, schedule.chunks, RingTransfers(pinned), schedule.meta)
    segments: list[np.ndarray] = []
    for i in range(len(transfers)):
        key = (int(transfers.sender[i]), int(transfers.receiver[i]))
        segments.append(chosen.get(key, transfers.route_links[transfers.route_offsets[i]:transfers.route_offsets[i + 1]]))
    offsets = np.zeros(len(segments) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in segments], out=offsets[1:])
    links = np.concatenate(segments) if segments else np.zeros(0, dtype=np.int64)
    new = Transfers(transfers.chunk, transfers.sender, transfers.receiver, transfers.step, transfers.op, offsets, links)
    return Schedule(schedule.collective, ranks, schedule.chunks, new, schedule.meta)


def schedule_routes(schedule: Schedule) -> dict[tuple[str, str], tuple[int, ...]]:
    """The route each GPU pair's first transfer takes (what a policy is checked against)."""
    transfers = schedule.transfers
    seen: dict[tuple[str, str], tuple[int, ...]] = {}
    for i in range(len(transfers)):
        pair = (schedule.ranks[int(transfers.sender[i])], schedule.ranks[int(transfers.receiver[i])])
        if pair not in seen:
            seen[pair] = transfers.route(i)
    return seen
