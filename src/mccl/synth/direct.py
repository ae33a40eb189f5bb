"""NCCL-style AllToAll: every rank sends every other rank its block directly.

One flow per (source, destination), all started at once, each on the ECMP-chosen
shortest route of its flow. With ``pxn=True`` (the default, as NCCL ≥ 2.12 does on
rail-optimized fabrics: "PCI × NVLink") a block for a GPU on another host and
another rail first moves over the NVSwitch to the local GPU on the destination's
rail, and leaves through that GPU's NIC, so inter-host traffic stays rail-to-rail.
The self block is a local copy and moves no data. O(n² · k) transfers.
"""

from __future__ import annotations

from collections.abc import Sequence

from mccl.errors import SynthesisError
from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta, TransferList
from mccl.synth.common import check_ranks, describe_on, route_or_infeasible
from mccl.topology import Router, Topology

__all__ = ["direct_alltoall"]


def _pxn_relay(topology: Topology, ranks: Sequence[str], source: int, destination: int,
               by_host_rail: dict[tuple[str | None, int | None], int]) -> int | None:
    """The rank on the source's host and the destination's rail, when a relay helps."""
    src, dst = topology.node(ranks[source]), topology.node(ranks[destination])
    if src.host is None or src.host == dst.host or dst.rail is None or src.rail == dst.rail:
        return None
    return by_host_rail.get((src.host, dst.rail))


def direct_alltoall(topology: Topology, ranks: Sequence[str] | None = None, *, chunks: int = 1,
                    pxn: bool = True) -> Schedule:
    chosen = check_ranks(topology, ranks)
    by_host_rail = {(topology.node(gpu).host, topology.node(gpu).rail): rank for rank, gpu in enumerate(chosen)}
    if chunks < 1:
        raise SynthesisError(f"chunks must be >= 1, got {chunks}")
    n = len(chosen)
    router = Router(topology)
    sources: list[int] = []
    destinations: list[int] = []
    transfers = TransferList()
    for source in range(n):
        for destination in range(n):
            if source == destination:
                continue
            relay = _pxn_relay(topology, chosen, source, destination, by_host_rail) if pxn else None
            hops = [source, destination] if relay is None else [source, relay, destination]
            routes = [route_or_infeasible(router, chosen[a], chosen[b], f"a2a:{source}>{destination}:{a}>{b}",
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
