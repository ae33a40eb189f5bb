"""AllGather trees of depth 2 or 3 from the fabric's host and rail structure (issue 17, deliverable 2).

The optimal packing (:mod:`.pipeline`) reaches the throughput bound with trees up to
25 deep at 128 GPUs and 75 at 512; every level is a store-and-forward hop that a
chunk's slices must fill (time × about ``1 + (D − 1) / slices``). These trees are
as shallow as the HPN structure allows, at the cost of adapting nothing to the
capacities:

* ``"rail"`` (depth 2 in one segment, 3 across segments): the source sends its whole
  buffer to the rank on its own rail in every other host of its segment (over the
  rail's ToR) and to the ranks of its own host (NVSwitch); each rail peer passes it
  on to the ranks of its host. Another segment gets it once, at one rail peer (over
  the aggregation layer), which forwards it to the segment's other rail peers. A NIC sends and receives ``(H − 1)`` buffers, the
  least any AllGather can on H hosts (the host cut), so on a healthy fabric it
  runs at the NIC bound unless the NVSwitch is slower.
* ``"host-rail"`` (one level more, "within host / across rails / within host"): the
  source cuts its buffer into one chunk per rank of its host, hands chunk j to
  host peer j over the NVSwitch, and peer j runs the ``"rail"`` tree for it. Every
  NIC of the host carries a share of every source, so a slow NIC slows a 1/N share.

A host without a rank on the source's rail receives from the source over the shortest
route to one of its ranks (chosen round-robin); ranks without host labels are hosts of
their own. Routes are the fabric's shortest switch-only routes, spread over equal-cost ones
(the aggregation switches) by host index (:meth:`mccl.topology.Router.route_many`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mccl.errors import Infeasible, SynthesisError
from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta, TransferOp, Transfers
from mccl.topology import Topology
from mccl.topology.routing import router_for

__all__ = ["HIERARCHIES", "hierarchical_allgather"]

HIERARCHIES = ("rail", "host-rail")


class _Layout:
    """Ranks grouped by host, and per host the rank on each rail."""

    def __init__(self, topology: Topology, ranks: Sequence[str]) -> None:
        host_index: dict[str, int] = {}
        self.host = np.empty(len(ranks), dtype=np.int64)
        self.rail = np.empty(len(ranks), dtype=np.int64)
        for rank, gpu in enumerate(ranks):
            node = topology.node(gpu)
            label = node.host if node.host else f"gpu:{gpu}"
            self.host[rank] = host_index.setdefault(label, len(host_index))
            self.rail[rank] = -1 if node.rail is None else int(node.rail)
        self.members: list[np.ndarray] = [np.flatnonzero(self.host == h) for h in range(len(host_index))]
        segment_index: dict[str, int] = {}
        self.segment = np.array([segment_index.setdefault(topology.node(ranks[int(members[0])]).segment or "", len(segment_index))
                                 for members in self.members], dtype=np.int64)  # per host
        self.segment_hosts: list[list[int]] = [[int(h) for h in np.flatnonzero(self.segment == g)]
                                               for g in range(len(segment_index))]
        self.on_rail: list[dict[int, int]] = [{} for _ in host_index]
        for rank in range(len(ranks)):
            if self.rail[rank] >= 0:
                self.on_rail[self.host[rank]].setdefault(int(self.rail[rank]), rank)

    @property
    def n_hosts(self) -> int:
        return len(self.members)

    def entry(self, root: int, host: int) -> int:
        """The rank of ``host`` that receives ``root``'s data from outside: its rail peer, else round-robin."""
        peer = self.on_rail[host].get(int(self.rail[root]))
        if peer is not None:
            return peer
        members = self.members[host]
        return int(members[root % len(members)])


def _rail_tree(layout: _Layout, root: int, skip: int, first_step: int) -> tuple[list[int], list[int], list[int]]:
    """Edges ``(senders, receivers, steps)`` of the rail tree of ``root``, leaving out rank ``skip``.

    Own host: root → each rank (NVSwitch). Own segment: root → the host's rail peer → its host.
    Another segment: root → the rail peer in one of its hosts (a hub, round-robin by root), which
    passes it on to the rail peers of the segment's other hosts: the segments' uplinks carry each
    buffer once per segment, not once per host.
    """
    senders: list[int] = []
    receivers: list[int] = []
    steps: list[int] = []

    def send(sender: int, receiver: int, step: int) -> None:
        if receiver != skip:
            senders.append(sender)
            receivers.append(receiver)
            steps.append(step)

    def spread(entry: int, host: int, step: int) -> None:
        for rank in layout.members[host]:
            if rank != entry:
                send(entry, int(rank), step)

    home = int(layout.host[root])
    home_segment = int(layout.segment[home])
    spread(root, home, first_step)
    for segment, hosts in enumerate(layout.segment_hosts):
        if segment == home_segment:
            for host in hosts:
                if host != home:
                    entry = layout.entry(root, host)
                    send(root, entry, first_step)
                    spread(entry, host, first_step + 1)
            continue
        hub_host = hosts[(home + segment) % len(hosts)]  # sources of one rail hub at different hosts
        hub = layout.entry(root, hub_host)
        send(root, hub, first_step)
        spread(hub, hub_host, first_step + 1)
        for host in hosts:
            if host != hub_host:
                entry = layout.entry(root, host)
                send(hub, entry, first_step + 1)
                spread(entry, host, first_step + 2)
    return senders, receivers, steps


def hierarchical_allgather(topology: Topology, ranks: Sequence[str], hierarchy: str = "rail") -> Schedule:
    """An AllGather whose trees follow the host / rail structure (module docstring); steps = depth."""
    if hierarchy not in HIERARCHIES:
        raise SynthesisError(f"unknown hierarchy {hierarchy!r}; choose one of {', '.join(HIERARCHIES)}")
    layout = _Layout(topology, ranks)
    n = len(ranks)
    chunk_source: list[int] = []
    fractions: list[float] = []
    columns: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
    for root in range(n):
        home = layout.members[int(layout.host[root])]
        relays = [root] if hierarchy == "rail" else [root] + [int(r) for r in home if r != root]
        for relay in relays:
            chunk = len(chunk_source)
            chunk_source.append(root)
            fractions.append(1.0 / len(relays))
            senders, receivers, steps = ([root], [relay], [0]) if relay != root else ([], [], [])
            tree = _rail_tree(layout, relay, root, 1 if relay != root else 0)
            senders, receivers, steps = senders + tree[0], receivers + tree[1], steps + tree[2]
            columns[0].extend([chunk] * len(senders))
            columns[1].extend(senders)
            columns[2].extend(receivers)
            columns[3].extend(steps)
    chunk, sender, receiver, step = (np.asarray(column, dtype=np.int64) for column in columns)
    if len(chunk) == 0:
        raise SynthesisError("an AllGather needs at least 2 ranks")
    step = _compact(step)
    router = router_for(topology)
    positions = router.positions(ranks)
    # ECMP (only across segments is there a choice, one route per aggregation switch): consecutive
    # hosts of a rail take consecutive aggregation switches, a chunk of another relay the next one.
    host = layout.host
    hashes = host[sender] + layout.segment[host[receiver]] + chunk
    lengths, links = router.route_many(positions[sender], positions[receiver], hashes)
    missing = np.flatnonzero(lengths < 0)
    if missing.size:
        i = int(missing[0])
        raise Infeasible(f"the {hierarchy} hierarchy needs a route from {ranks[sender[i]]} to {ranks[receiver[i]]} "
                         f"through switches only, and topology {topology.name!r} has none")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    transfers = Transfers(chunk, sender, receiver, step, np.full(len(chunk), int(TransferOp.COPY)), offsets, links)
    table = Chunks(np.asarray(chunk_source), np.full(len(chunk_source), -1), np.asarray(fractions))
    meta = ScheduleMeta(f"allgather.treepack.{hierarchy}", topology=topology.name, inputs=(("hierarchy", hierarchy),))
    return Schedule(Collective.ALLGATHER, tuple(ranks), table, transfers, meta)


def _compact(step: np.ndarray) -> np.ndarray:
    """Steps renumbered 0, 1, … without gaps (a level no tree uses, e.g. one rank per host)."""
    used, compact = np.unique(step, return_inverse=True)
    return compact.astype(np.int64)
