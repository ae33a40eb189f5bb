"""Ring baselines: the naive ring, NCCL-style rail rings, the locality-aware ring.

* Naive ring: ranks in rank order, one ring.
* NCCL-style rings (NCCL ``src/graph/search.cc`` on rail-optimized fabrics): C
  channels, each a ring through every host that crosses between hosts only
  rail-to-rail: channel c leaves a host through the NIC of one rail and enters the
  next host through the NIC of that same rail, so inter-host hops stay under one
  ToR. Inside a host the ring visits the other GPUs over the NVSwitch. Channel c
  uses the rail pair (a, b) = (c, c+1): hosts at even positions are entered on a and
  left on b, hosts at odd positions the reverse, so every NIC direction carries
  the same number of channels. With an odd number of hosts one hop (the last host
  back to the first) must change rails.
* Locality-aware ring (MCCS §3.3): hosts grouped by pod, then rack, each group
  entered once; then channelized as above.

Every ring runs AllGather (copies around the ring), ReduceScatter (partial sums
around the ring, ending at the block's owner) and AllReduce (ReduceScatter then
AllGather).

Scale (issue 11, for sweeps such as Fig. 14). A ring schedule has C · n · (n − 1) · k
transfers (33.5 M for 8 channels on 2048 GPUs), but :func:`ring_schedule` builds only
its C rank orders and the C · n routes of their hops: O(C · n) routes, each found by a
search that stops at the hop's far end (:mod:`mccl.topology.routing`; a group inside
one host never searches the fabric), on one router shared per topology object
(:func:`mccl.topology.routing.router_for`). The schedule's ``transfers`` is a
:class:`~mccl.schedule.pattern.RingTransfers`: ``len``, link loads, chunks per link,
the bottleneck cut and :func:`mccl.sim.analytic.evaluate` are answered in closed form;
reading a column (the flow simulator, ``validate``, the JSON writer) materializes all
columns once, equal to the transfer-by-transfer construction (``tests/test_fast_paths.py``).
Measured (``benchmarks/scale.py``, BENCHMARKS.md): an 8-channel AllGather on 2048 GPUs
is built and α-β-evaluated in well under a second of CPU; materializing its columns
costs seconds and ~1 GB, so a sweep should evaluate α-β and simulate only where affordable.
Nothing changes in the calling convention: ``optimize(topology, collective, ranks,
method="ring.nccl")`` and :func:`nccl_ring` return these schedules; keep one topology
object per fabric (faults make new ones) so that its routes are searched once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mccl.errors import SynthesisError
from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta
from mccl.schedule.pattern import RingPattern, RingTransfers
from mccl.synth.common import check_ranks, describe_on, route_or_infeasible
from mccl.topology import Topology
from mccl.topology.routing import router_for

__all__ = [
    "naive_ring",
    "nccl_ring",
    "locality_ring",
    "ring_schedule",
    "nccl_ring_orders",
    "locality_order",
    "cross_rack_flows",
    "cross_rack_ratio",
]


def _hosts_in_order(topology: Topology, ranks: Sequence[str], order: Sequence[int]) -> list[list[int]]:
    """Ranks grouped by host, hosts in first-appearance order along ``order``, ranks by rail."""
    groups: dict[str, list[int]] = {}
    for rank in order:
        node = topology.node(ranks[rank])
        groups.setdefault(node.host or node.id, []).append(rank)
    return [sorted(members, key=lambda r: (topology.node(ranks[r]).rail or 0, r)) for members in groups.values()]


def locality_order(topology: Topology, ranks: Sequence[str]) -> list[int]:
    """Rank order that visits pods, then racks, then hosts contiguously (first-appearance order)."""
    first_seen: dict[tuple[str, ...], int] = {}

    def seen(key: tuple[str, ...]) -> int:
        return first_seen.setdefault(key, len(first_seen))

    keys = []
    for rank, gpu in enumerate(ranks):
        node = topology.node(gpu)
        pod, rack, host = node.pod or "", node.rack or "", node.host or node.id
        keys.append((seen((pod,)), seen((pod, rack)), seen((pod, rack, host)), node.rail or 0, rank))
    return [key[-1] for key in sorted(keys)]


def nccl_ring_orders(
    topology: Topology,
    ranks: Sequence[str],
    channels: int | None = None,
    host_order: Sequence[int] | None = None,
) -> list[list[int]]:
    """One rank order per channel, NCCL-style (see module docstring)."""
    order = list(range(len(ranks))) if host_order is None else list(host_order)
    hosts = _hosts_in_order(topology, ranks, order)
    widest = max(len(members) for members in hosts)
    count = widest if channels is None else channels
    if count < 1:
        raise SynthesisError(f"channels must be >= 1, got {count}")
    rings: list[list[int]] = []
    for channel in range(count):
        ring: list[int] = []
        previous_exit: int | None = None
        for position, members in enumerate(hosts):
            rails = [topology.node(ranks[r]).rail or 0 for r in members]
            if len(members) == 1:
                ring.extend(members)
                continue
            a = channel % len(members)
            b = (channel + 1) % len(members)
            entry, leave = (a, b) if position % 2 == 0 else (b, a)
            if previous_exit is not None and previous_exit in rails and rails[entry] != previous_exit:
                entry = rails.index(previous_exit)  # keep the hop rail-to-rail on uneven hosts
                if entry == leave:
                    leave = (entry + 1) % len(members)
            inner = [members[(entry + step) % len(members)] for step in range(1, len(members))]
            inner.remove(members[leave])
            ring.extend([members[entry], *inner, members[leave]])
            previous_exit = rails[leave]
        rings.append(ring)
    return rings


def ring_schedule(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str],
    rings: Sequence[Sequence[int]],
    *,
    chunks: int = 1,
    synthesizer: str = "ring",
    inputs: Sequence[tuple[str, str]] = (),
) -> Schedule:
    """A schedule that splits every block evenly over ``rings`` × ``chunks`` and runs each ring."""
    collective = Collective(collective)
    if collective is Collective.ALLTOALL:
        raise SynthesisError("a ring carries AllGather, ReduceScatter and AllReduce; use direct_alltoall for AllToAll")
    if chunks < 1:
        raise SynthesisError(f"chunks must be >= 1, got {chunks}")
    n = len(ranks)
    for ring in rings:
        if sorted(ring) != list(range(n)):
            raise SynthesisError(f"a ring must visit every rank 0..{n - 1} exactly once, got {list(ring)}")
    per_block = len(rings) * chunks
    blocks = np.repeat(np.arange(n, dtype=np.int32), per_block)
    unset = np.full(n * per_block, -1, dtype=np.int32)
    if collective is Collective.ALLGATHER:
        chunk_table = Chunks(blocks, unset, np.full(n * per_block, 1.0 / per_block))
    else:
        chunk_table = Chunks(unset, blocks, np.full(n * per_block, 1.0 / per_block))
    router = router_for(topology)
    routes: list[tuple[int, ...]] = []
    for ring_index, ring in enumerate(rings):
        for i, rank in enumerate(ring):
            nxt = ring[(i + 1) % n]
            routes.append(route_or_infeasible(router, ranks[rank], ranks[nxt], f"ring{ring_index}:{rank}>{nxt}",
                                              f"ring {ring_index} (hop rank {rank} -> rank {nxt})"))
    hop_offsets = np.zeros(len(routes) + 1, dtype=np.int64)
    np.cumsum([len(route) for route in routes], out=hop_offsets[1:])
    hop_links = np.fromiter((link for route in routes for link in route), dtype=np.int32, count=int(hop_offsets[-1]))
    pattern = RingPattern(collective, np.array(rings, dtype=np.int64), chunks, hop_offsets, hop_links)
    schedule = Schedule(collective, tuple(ranks), chunk_table, RingTransfers(pattern),
                        ScheduleMeta(synthesizer, topology=topology.name, inputs=tuple(inputs)))
    return describe_on(schedule, topology)


def naive_ring(topology: Topology, collective: Collective | str, ranks: Sequence[str] | None = None,
               *, chunks: int = 1) -> Schedule:
    """One ring in rank order."""
    chosen = check_ranks(topology, ranks)
    return ring_schedule(topology, collective, chosen, [list(range(len(chosen)))], chunks=chunks,
                         synthesizer="ring.naive", inputs=(("chunks", str(chunks)),))


def nccl_ring(topology: Topology, collective: Collective | str, ranks: Sequence[str] | None = None,
              *, channels: int | None = None, chunks: int = 1) -> Schedule:
    """NCCL-style rail rings, hosts in rank order (NCCL takes the inter-host order from ranks)."""
    chosen = check_ranks(topology, ranks)
    rings = nccl_ring_orders(topology, chosen, channels)
    return ring_schedule(topology, collective, chosen, rings, chunks=chunks, synthesizer="ring.nccl",
                         inputs=(("channels", str(len(rings))), ("chunks", str(chunks))))


def locality_ring(topology: Topology, collective: Collective | str, ranks: Sequence[str] | None = None,
                  *, channels: int | None = None, chunks: int = 1) -> Schedule:
    """MCCS's locality-aware ring: hosts grouped by pod then rack, channelized rail-to-rail."""
    chosen = check_ranks(topology, ranks)
    rings = nccl_ring_orders(topology, chosen, channels, host_order=locality_order(topology, chosen))
    return ring_schedule(topology, collective, chosen, rings, chunks=chunks, synthesizer="ring.locality",
                         inputs=(("channels", str(len(rings))), ("chunks", str(chunks))))


def cross_rack_flows(topology: Topology, ranks: Sequence[str], order: Sequence[int]) -> int:
    """Ring hops (including the closing one) whose ends sit in different racks."""
    racks = [topology.node(ranks[rank]).rack for rank in order]
    return sum(1 for i in range(len(racks)) if racks[i] != racks[(i + 1) % len(racks)])


def cross_rack_ratio(topology: Topology, ranks: Sequence[str], order: Sequence[int] | None = None) -> float:
    """MCCS §2 metric: cross-rack flows of a ring over those of the locality-aware ring.

    ``order`` defaults to rank order (what NCCL builds). 1.0 when both are zero.
    """
    chosen = list(range(len(ranks))) if order is None else list(order)
    ring_flows = cross_rack_flows(topology, ranks, chosen)
    best = cross_rack_flows(topology, ranks, locality_order(topology, ranks))
    if best == 0:
        return 1.0 if ring_flows == 0 else float("inf")
    return ring_flows / best
