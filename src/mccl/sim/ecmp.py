"""Path choice for flows between switches: the schedule's routes, ECMP hashing, or pinned.

A schedule carries a physical route for every transfer. Where a fabric offers
several equal-cost routes (two spines, several aggregation switches), real
switches do not read the schedule: they hash each flow's 5-tuple and send it up
one spine (ECMP), so two heavy flows can collide on one uplink while another
idles (MCCS §1 "configuration-agnostic tricks", §3.3). A provider that controls
the UDP source port can pin a flow to a route instead (MCCS §3.3, "route ID").

A job chooses one :data:`PathPolicy`:

* :class:`AsScheduled` — the routes in the schedule (the synthesizer's choice);
* :class:`EcmpPaths` — per (sender GPU, receiver GPU) connection, the route that a
  CRC32 hash of its 5-tuple picks among the shortest ones. The UDP source port of the
  5-tuple is drawn per (job, salt, sender, receiver) by a keyed BLAKE2 digest, as each
  connection's queue pair gets an arbitrary port: CRC32 is linear, so hashing the job
  name and salt into the key directly made all of a job's connections flip spines
  together when the salt changed (one collision pattern for every salt). Two GPUs of
  one host talk through the host (shared memory, PCIe, NVLink), never through a
  switch, so their routes are the ones that stay inside the host where there are any
  (:func:`fabric_routes`): on ``spine_leaf`` a host-local pair also has an equal-hop
  route through its leaf, which no NCCL or MCCS transport takes;
* :class:`PinnedPaths` — given routes for some GPU pairs, the schedule's for the rest.

Policies produce new route arrays; the schedule itself is never changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mccl.errors import MCCLError
from mccl.schedule import Schedule
from mccl.topology import Router, Topology
from mccl.topology.routing import ecmp_index

__all__ = [
    "AsScheduled",
    "EcmpPaths",
    "PinnedPaths",
    "PathPolicy",
    "AS_SCHEDULED",
    "flow_key",
    "source_port",
    "fabric_routes",
    "ecmp_route",
    "check_route",
    "routes_for",
]


@dataclass(frozen=True)
class AsScheduled:
    """Use the routes the schedule carries."""


@dataclass(frozen=True)
class EcmpPaths:
    """Hash every connection onto one of its equal-cost routes; ``salt`` stands for the
    source-port choice (change it to re-roll the hash)."""

    salt: str = ""


@dataclass(frozen=True)
class PinnedPaths:
    """Routes (link ids) for ``(sender GPU, receiver GPU)`` pairs; other pairs keep the schedule's."""

    routes: tuple[tuple[tuple[str, str], tuple[int, ...]], ...]

    @staticmethod
    def of(mapping: Mapping[tuple[str, str], Sequence[int]]) -> PinnedPaths:
        return PinnedPaths(tuple((pair, tuple(int(link) for link in route)) for pair, route in mapping.items()))


PathPolicy = AsScheduled | EcmpPaths | PinnedPaths
AS_SCHEDULED = AsScheduled()


def source_port(job: str, src: str, dst: str, salt: str = "") -> int:
    """The UDP source port of a connection: 49152–65535, a digest of job, salt and endpoints."""
    digest = hashlib.blake2b(f"{job}|{salt}|{src}|{dst}".encode(), digest_size=4).digest()
    return 49152 + int.from_bytes(digest, "big") % 16384


def flow_key(job: str, src: str, dst: str, salt: str = "") -> str:
    """The 5-tuple a switch hashes: source, destination, the connection's source port
    (:func:`source_port`), the RoCEv2 port 4791, the protocol."""
    return f"{src}|{dst}|{source_port(job, src, dst, salt)}|4791|udp"


def fabric_routes(topology: Topology, src: str, dst: str, router: Router | None = None) -> list[tuple[int, ...]]:
    """The equal-cost routes a flow ``src → dst`` may take: the host-internal ones for two GPUs
    of one host where there are any (module docstring), else every shortest route."""
    chooser = Router(topology) if router is None else router
    options = chooser.routes(src, dst)
    host = topology.node(src).host
    if host is not None and host == topology.node(dst).host:
        inside = [route for route in options
                  if all(topology.node(topology.links[link].dst).host == host for link in route)]
        if inside:
            return inside
    return options


def ecmp_route(topology: Topology, src: str, dst: str, key: str, router: Router | None = None) -> tuple[int, ...]:
    """The shortest switch-only route ``src → dst`` that ECMP picks for ``key``.

    ``src`` and ``dst`` may be GPUs or switches (a background flow between two switches).
    """
    options = fabric_routes(topology, src, dst, router)
    return options[ecmp_index(key, len(options))]


def check_route(topology: Topology, route: Sequence[int], src: str, dst: str) -> tuple[int, ...]:
    """``route`` as a tuple, after checking it is a chain of links from ``src`` to ``dst``."""
    links = tuple(int(link) for link in route)
    if not links:
        raise MCCLError(f"empty route for {src} -> {dst}")
    at = src
    for link_id in links:
        link = topology.link(link_id)
        if link.src != at:
            raise MCCLError(f"route for {src} -> {dst}: link {link_id} ({link.src} -> {link.dst}) does not start at {at}")
        at = link.dst
    if at != dst:
        raise MCCLError(f"route for {src} -> {dst} ends at {at}")
    return links


def routes_for(
    schedule: Schedule,
    topology: Topology,
    policy: PathPolicy,
    job: str,
) -> tuple[np.ndarray, np.ndarray]:
    """The route CSR arrays ``(offsets, links)`` a job's policy gives the schedule's transfers."""
    transfers = schedule.transfers
    if isinstance(policy, AsScheduled):
        return transfers.route_offsets, transfers.route_links
    n = schedule.n_ranks
    pair = transfers.sender.astype(np.int64) * n + transfers.receiver
    pairs, inverse = np.unique(pair, return_inverse=True)
    router = Router(topology)
    pinned = dict(policy.routes) if isinstance(policy, PinnedPaths) else {}
    first = np.zeros(len(pairs), dtype=np.int64)
    first[inverse[::-1]] = np.arange(len(pair))[::-1]  # a transfer of each pair
    chosen: list[tuple[int, ...]] = []
    for index, value in enumerate(pairs):
        src, dst = schedule.ranks[int(value) // n], schedule.ranks[int(value) % n]
        if isinstance(policy, EcmpPaths):
            chosen.append(ecmp_route(topology, src, dst, flow_key(job, src, dst, policy.salt), router))
        elif (src, dst) in pinned:
            chosen.append(check_route(topology, pinned[(src, dst)], src, dst))
        else:
            chosen.append(transfers.route(int(first[index])))
    if isinstance(policy, PinnedPaths):
        unknown = set(pinned) - {(schedule.ranks[int(v) // n], schedule.ranks[int(v) % n]) for v in pairs}
        if unknown:
            raise MCCLError(f"pinned routes for GPU pairs the schedule never uses: {sorted(unknown)[:3]}")
    lengths = np.array([len(route) for route in chosen], dtype=np.int64)[inverse]
    offsets = np.zeros(len(pair) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([np.asarray(route, dtype=np.int64) for route in chosen])
    pair_offsets = np.zeros(len(pairs) + 1, dtype=np.int64)
    np.cumsum([len(route) for route in chosen], out=pair_offsets[1:])
    starts = pair_offsets[inverse]
    positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
    return offsets, flat[positions]
