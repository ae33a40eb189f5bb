"""main's transfer-by-transfer constructions, kept verbatim as the reference the fast paths must equal.

``tests/test_fast_paths.py`` compares :mod:`mccl.topology.routing`'s resumable search and counted
ECMP choice, :mod:`mccl.schedule.pattern`'s lazy ring transfers and closed forms, and the
vectorized direct AllToAll against these on builder and random fabrics. Not a test module.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Sequence

from mccl.errors import Infeasible, SynthesisError, TopologyError
from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta, TransferList, TransferOp
from mccl.synth.common import describe_on
from mccl.topology import Topology

MAX_ECMP_ROUTES = 256


class ReferenceRouter:
    """main's Router: a full BFS per source, every equal-cost route enumerated."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._predecessors: dict[str, dict[str, list[int]]] = {}

    def _search(self, src: str) -> dict[str, list[int]]:
        cached = self._predecessors.get(src)
        if cached is not None:
            return cached
        topology = self.topology
        distance = {src: 0}
        predecessors: dict[str, list[int]] = {src: []}
        queue = deque([src])
        while queue:
            node = queue.popleft()
            if node != src and topology.node(node).is_gpu:
                continue
            for link_id in topology.out_links[node]:
                nxt = topology.links[link_id].dst
                if nxt not in distance:
                    distance[nxt] = distance[node] + 1
                    predecessors[nxt] = [link_id]
                    queue.append(nxt)
                elif distance[nxt] == distance[node] + 1:
                    predecessors[nxt].append(link_id)
        self._predecessors[src] = predecessors
        return predecessors

    def routes(self, src: str, dst: str) -> list[tuple[int, ...]]:
        if src == dst:
            raise TopologyError(f"no route from {src} to itself")
        predecessors = self._search(src)
        if dst not in predecessors:
            raise TopologyError(f"{src} cannot reach {dst} through switches in {self.topology.name!r}")
        found: list[tuple[int, ...]] = []
        stack: list[tuple[str, tuple[int, ...]]] = [(dst, ())]
        while stack and len(found) < MAX_ECMP_ROUTES:
            node, suffix = stack.pop()
            if node == src:
                found.append(suffix)
                continue
            for link_id in reversed(predecessors[node]):
                stack.append((self.topology.links[link_id].src, (link_id, *suffix)))
        return found

    def route(self, src: str, dst: str, flow_key: str | None = None) -> tuple[int, ...]:
        options = self.routes(src, dst)
        if len(options) == 1:
            return options[0]
        key = f"{src}>{dst}" if flow_key is None else flow_key
        return options[zlib.crc32(key.encode()) % len(options)]


def _route(router: ReferenceRouter, src: str, dst: str, flow_key: str, why: str) -> tuple[int, ...]:
    try:
        return router.route(src, dst, flow_key=flow_key)
    except TopologyError:
        raise Infeasible(f"{why} needs a route from {src} to {dst} through switches only") from None


def reference_ring_schedule(topology: Topology, collective: Collective | str, ranks: Sequence[str],
                            rings: Sequence[Sequence[int]], *, chunks: int = 1, synthesizer: str = "ring",
                            inputs: Sequence[tuple[str, str]] = ()) -> Schedule:
    """main's ``ring_schedule``: every transfer added one by one."""
    collective = Collective(collective)
    n = len(ranks)
    per_block = len(rings) * chunks
    fraction = 1.0 / per_block
    if collective is Collective.ALLGATHER:
        sources = [block for block in range(n) for _ in range(per_block)]
        destinations = [-1] * (n * per_block)
    else:
        sources = [-1] * (n * per_block)
        destinations = [block for block in range(n) for _ in range(per_block)]
    chunk_table = Chunks(sources, destinations, [fraction] * (n * per_block))
    router = ReferenceRouter(topology)
    transfers = TransferList()
    for ring_index, ring in enumerate(rings):
        position = {rank: i for i, rank in enumerate(ring)}
        hop_route = {}
        for i, rank in enumerate(ring):
            nxt = ring[(i + 1) % n]
            hop_route[rank] = _route(router, ranks[rank], ranks[nxt], f"ring{ring_index}:{rank}>{nxt}",
                                     f"ring {ring_index} (hop rank {rank} -> rank {nxt})")
        for block in range(n):
            for piece in range(chunks):
                chunk = block * per_block + ring_index * chunks + piece
                start = position[block]
                if collective in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
                    for step in range(n - 1):
                        sender = ring[(start + 1 + step) % n]
                        transfers.add(chunk, sender, ring[(start + 2 + step) % n], step,
                                      hop_route[sender], TransferOp.REDUCE)
                if collective in (Collective.ALLGATHER, Collective.ALLREDUCE):
                    offset = n - 1 if collective is Collective.ALLREDUCE else 0
                    for step in range(n - 1):
                        sender = ring[(start + step) % n]
                        transfers.add(chunk, sender, ring[(start + step + 1) % n], offset + step,
                                      hop_route[sender], TransferOp.COPY)
    schedule = Schedule(collective, tuple(ranks), chunk_table, transfers.freeze(),
                        ScheduleMeta(synthesizer, topology=topology.name, inputs=tuple(inputs)))
    return describe_on(schedule, topology)


def reference_direct_alltoall(topology: Topology, ranks: Sequence[str], *, chunks: int = 1,
                              pxn: bool = True) -> Schedule:
    """main's ``direct_alltoall``: one route lookup per hop of every block."""
    chosen = tuple(ranks)
    by_host_rail = {(topology.node(gpu).host, topology.node(gpu).rail): rank for rank, gpu in enumerate(chosen)}
    if chunks < 1:
        raise SynthesisError(f"chunks must be >= 1, got {chunks}")
    n = len(chosen)
    router = ReferenceRouter(topology)
    sources: list[int] = []
    destinations: list[int] = []
    transfers = TransferList()
    for source in range(n):
        for destination in range(n):
            if source == destination:
                continue
            relay = None
            if pxn:
                src, dst = topology.node(chosen[source]), topology.node(chosen[destination])
                if not (src.host is None or src.host == dst.host or dst.rail is None or src.rail == dst.rail):
                    relay = by_host_rail.get((src.host, dst.rail))
            hops = [source, destination] if relay is None else [source, relay, destination]
            routes = [_route(router, chosen[a], chosen[b], f"a2a:{source}>{destination}:{a}>{b}",
                             f"direct AllToAll (block rank {source} -> rank {destination})")
                      for a, b in zip(hops, hops[1:], strict=False)]
            for _ in range(chunks):
                for step, route in enumerate(routes):
                    transfers.add(len(sources), hops[step], hops[step + 1], step, route)
                sources.append(source)
                destinations.append(destination)
    chunk_table = Chunks(sources, destinations, [1.0 / chunks] * len(sources))
    schedule = Schedule(Collective.ALLTOALL, chosen, chunk_table, transfers.freeze(),
                        ScheduleMeta("alltoall.direct", topology=topology.name,
                                     inputs=(("chunks", str(chunks)), ("pxn", str(pxn).lower()))))
    return describe_on(schedule, topology)
