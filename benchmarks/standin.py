"""A stand-in for a synthesized AllGather while the tree-packing synthesizer is not available.

Hierarchical broadcast trees, one per source, on a rail-optimized fabric: the source
sends its block to its rail peers on every other host (through the rail ToR) and to
its host-mates (NVSwitch); each rail peer relays to its own host-mates. Depth 2,
n - 1 transfers per chunk, ``chunks`` pipelined chunks per source. It only gives the
benchmark a tree-shaped schedule of the right size; it is not mccl's synthesizer.
"""

from __future__ import annotations

from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta, TransferList
from mccl.topology import Router, Topology


def hierarchical_allgather(topology: Topology, chunks: int = 4) -> Schedule:
    ranks = topology.gpus
    router = Router(topology)
    hosts: dict[str, list[int]] = {}
    for rank, gpu in enumerate(ranks):
        hosts.setdefault(topology.node(gpu).host or gpu, []).append(rank)
    host_of = {rank: host for host, members in hosts.items() for rank in members}
    rail = [topology.node(gpu).rail for gpu in ranks]
    route_cache: dict[tuple[int, int], tuple[int, ...]] = {}

    def route(a: int, b: int) -> tuple[int, ...]:
        if (a, b) not in route_cache:
            route_cache[(a, b)] = router.route(ranks[a], ranks[b])
        return route_cache[(a, b)]

    transfers = TransferList()
    sources: list[int] = []
    for source in range(len(ranks)):
        peers = [next(r for r in members if rail[r] == rail[source])
                 for host, members in hosts.items() if host != host_of[source]]
        for _ in range(chunks):
            chunk = len(sources)
            sources.append(source)
            for mate in hosts[host_of[source]]:
                if mate != source:
                    transfers.add(chunk, source, mate, 0, route(source, mate))
            for peer in peers:
                transfers.add(chunk, source, peer, 0, route(source, peer))
                for mate in hosts[host_of[peer]]:
                    if mate != peer:
                        transfers.add(chunk, peer, mate, 1, route(peer, mate))
    return Schedule(Collective.ALLGATHER, ranks, Chunks(sources, [-1] * len(sources), [1 / chunks] * len(sources)),
                    transfers.freeze(), ScheduleMeta("standin.hierarchical", topology=topology.name))
