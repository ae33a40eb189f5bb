"""The rail hierarchy adapted to a fault: depth ≤ 4, one tree per source, rerouted around hot links (issue 17).

:mod:`.hierarchical`'s ``"rail"`` trees are as shallow as the HPN structure allows (depth 3 across
segments) and reach the host cut on a healthy fabric, but adapt nothing to the capacities: one slow
link sets the pace of every tree through it. At 512 GPUs (``rail_optimized(4, 16, 8)``) the rail trees
run at 114 of 150 GB/s under Fail1 (gpu0's NVSwitch port: it both spreads 63 buffers to its host and
takes 448 from it), 51 of 362 under Fail2 (gpu0's NIC at 50 Gbit/s carries 63 buffers each way) and 13
of 19 under Fail3 (the spare's NIC takes 480 buffers, its NVSwitch path 31); the optimal packings
reach the bound but with trees 35–59 deep, whose pipeline fill the executor's slicing (32 slices of a
2 MiB buffer) cannot hide and whose flow-level simulation takes tens of minutes.

Here each source keeps one tree of the rail hierarchy's shape — its host over the NVSwitch, every
other host through one entry rank that spreads over its NVSwitch, another segment through a hub —
but every decision may change where the rail hierarchy's choice would overload a link: the entry rank
of a host (another rail, over the aggregation layer), the sender (any rank that already holds the
buffer at level ≤ 2: a host peer when the source's NIC is slow, a host's neighbour for a spare GPU
on a host of its own), the hub, and for each rank whether it takes the buffer from its entry over
the NVSwitch or straight through its NIC. The rule (rip-up and reroute, :mod:`.railadaptkernel`):
each decision takes the option whose links end least loaded (buffers ÷ capacity, against every other
tree), the rail hierarchy's own option on ties. Passes repeat until none changes (at most
``passes``). On a healthy HPN fabric the rail option is always least loaded, so the trees are the
rail hierarchy's (tested).

Exact where it claims: the trees deliver every buffer to every rank once, in step order, over the
fabric's shortest switch-only routes (:func:`mccl.schedule.validate` in the tests); the throughput it
reaches is the steady state of those loads (``meta.achieved_gbs``), not a bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mccl.errors import Infeasible, SynthesisError
from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta, TransferOp, Transfers
from mccl.synth.treepack.hierarchical import _compact, _Layout
from mccl.synth.treepack.railadaptkernel import reroute
from mccl.topology import Topology
from mccl.topology.routing import router_for

__all__ = ["rail_adapted_allgather"]

MAX_SENDER_LEVEL = 2  # senders of an entry hold the buffer at level ≤ 2: trees at most 4 deep
PASSES = 8


def rail_adapted_allgather(topology: Topology, ranks: Sequence[str], passes: int = PASSES) -> Schedule:
    """One rail-shaped tree per source, rerouted around the fabric's hot links (module docstring)."""
    n = len(ranks)
    if n < 2:
        raise SynthesisError("an AllGather needs at least 2 ranks")
    layout = _Layout(topology, ranks)
    router = router_for(topology)
    positions = router.positions(ranks)
    sources = np.repeat(np.arange(n), n)
    targets = np.tile(np.arange(n), n)
    host = layout.host
    lengths, links = router.route_many(positions[sources], positions[targets],
                                       host[sources] + layout.segment[host[targets]] + sources)
    lengths[sources == targets] = 0
    missing = np.flatnonzero(lengths < 0)
    if missing.size:
        i = int(missing[0])
        raise Infeasible(f"the rail-adapted hierarchy needs a route from {ranks[sources[i]]} to {ranks[targets[i]]} "
                         f"through switches only, and topology {topology.name!r} has none")
    r_off = np.zeros(n * n + 1, dtype=np.int64)
    np.cumsum(lengths, out=r_off[1:])
    members = np.concatenate(layout.members).astype(np.int64)
    mem_off = np.zeros(layout.n_hosts + 1, dtype=np.int64)
    np.cumsum([len(m) for m in layout.members], out=mem_off[1:])
    # per segment its hosts, larger hosts first (stable)
    ordered = [sorted(hosts, key=lambda h: -len(layout.members[h])) for hosts in layout.segment_hosts]
    seg_hosts = np.asarray([h for hosts in ordered for h in hosts], dtype=np.int64)
    seg_off = np.zeros(len(ordered) + 1, dtype=np.int64)
    np.cumsum([len(hosts) for hosts in ordered], out=seg_off[1:])
    entry_struct = np.array([[layout.entry(root, h) for h in range(layout.n_hosts)] for root in range(n)],
                            dtype=np.int64).reshape(n, layout.n_hosts)
    hub_struct = np.array([[hosts[(int(host[root]) + g) % len(hosts)] for g, hosts in enumerate(layout.segment_hosts)]
                           for root in range(n)], dtype=np.int64).reshape(n, len(layout.segment_hosts))
    nic_out = np.full(n, -1, dtype=np.int64)
    for rank in range(n):
        away = np.flatnonzero(host != host[rank])
        if away.size and lengths[rank * n + away[0]] > 0:
            nic_out[rank] = links[r_off[rank * n + away[0]]]
    cap = np.asarray(topology.capacities_gbps, dtype=np.float64)
    snd, rcv, lvl, _, _ = reroute(n, host.astype(np.int64), mem_off, members, seg_off, seg_hosts,
                                  layout.segment.astype(np.int64), entry_struct, hub_struct, nic_out, r_off,
                                  links.astype(np.int64), cap, MAX_SENDER_LEVEL, passes)
    chunk = np.repeat(np.arange(n, dtype=np.int64), n - 1)
    sender, receiver = snd.reshape(-1), rcv.reshape(-1)
    step = _compact(lvl.reshape(-1))
    pair = sender * n + receiver
    route_lengths = lengths[pair]
    offsets = np.zeros(len(pair) + 1, dtype=np.int64)
    np.cumsum(route_lengths, out=offsets[1:])
    starts = np.repeat(r_off[pair], route_lengths)
    within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], route_lengths)
    route_links = links[starts + within].astype(np.int64)
    transfers = Transfers(chunk, sender, receiver, step, np.full(len(chunk), int(TransferOp.COPY)), offsets, route_links)
    table = Chunks(np.arange(n, dtype=np.int64), np.full(n, -1), np.ones(n))
    meta = ScheduleMeta("allgather.treepack.rail-adapted", topology=topology.name,
                        inputs=(("hierarchy", "rail-adapted"), ("passes", str(passes))))
    return Schedule(Collective.ALLGATHER, tuple(ranks), table, transfers, meta)
