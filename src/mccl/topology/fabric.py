"""One graph view of a fabric for the solvers and the validator: ranks first, then switches.

Every solver of mccl (the AllGather cut bound and tree packing, the AllToAll LP) and the
schedule validator need the same thing from a :class:`~mccl.topology.Topology` and a rank
list: integer nodes, arcs as numpy arrays, the link id each arc stands for. They used to
build it three ways, in three node orders, with three connectivity checks; this module is
the one way.

Node order (fixed, relied upon): node ``i < n_ranks`` is rank ``i`` (the GPU ``ranks[i]``),
nodes ``n_ranks … n_nodes - 1`` are the switches in topology node order. So a rank's node
index *is* its rank, and ``i < n_ranks`` tells a GPU from a switch.

GPUs that hold no rank ("foreign" GPUs) are not graph nodes: only a rank can relay (a relay
is a transfer between ranks, and a route passes through switches only, see
:mod:`mccl.schedule.validate`), so arcs that touch them are dropped. They still get
positions ``n_nodes + j`` in the per-link endpoint arrays ``link_src`` / ``link_dst``, which
cover every topology link, so that a route straying through one can be named.

Arcs are the links between graph nodes in link-id order; arc ``a`` is link ``link[a]``.
Structure and capacities are kept apart: ``gbps`` (per arc, Gbit/s) is the only field that
depends on link capacities, and :meth:`FabricView.with_capacities` swaps it while sharing
every structure array (a gray failure changes capacities, never the graph).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mccl.errors import Infeasible, TopologyError
from mccl.topology.model import Topology

__all__ = ["FabricView", "fabric_view"]


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class FabricView:
    """Ranks and switches of a topology as integer nodes, its links as arcs (see the module docstring)."""

    topology_name: str
    ranks: tuple[str, ...]  # GPU of each rank; node i < n_ranks is ranks[i]
    names: tuple[str, ...]  # node ids of the graph nodes: the ranks' GPUs, then switches
    foreign: tuple[str, ...]  # GPUs that hold no rank: position n_nodes + j in link_src / link_dst, no arcs
    tail: np.ndarray  # int64 per arc: node it leaves
    head: np.ndarray  # int64 per arc: node it enters
    link: np.ndarray  # int64 per arc: the topology link id
    gbps: np.ndarray  # float per arc: capacity in Gbit/s (the only capacity-dependent field)
    link_src: np.ndarray  # int64 per topology link: position of its source (ranks, switches, foreign GPUs)
    link_dst: np.ndarray  # int64 per topology link: position of its destination
    arc_of_link: np.ndarray  # int64 per topology link: its arc, -1 when it touches a foreign GPU
    groups: np.ndarray  # int64 per graph node: index of its host in ``hosts``, -1 for nodes of no host
    hosts: tuple[str, ...]  # host labels, numbered in order of first appearance in node order

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    @property
    def n_nodes(self) -> int:
        """Graph nodes: ranks and switches (foreign GPUs excluded)."""
        return len(self.names)

    @property
    def n_arcs(self) -> int:
        return len(self.tail)

    @property
    def n_links(self) -> int:
        """Links of the topology (arcs plus the links that touch a foreign GPU)."""
        return len(self.link_src)

    @property
    def rank_hosts(self) -> np.ndarray:
        """Host index of each rank (-1 for a GPU with no host label)."""
        return self.groups[: self.n_ranks]

    def name(self, position: int) -> str:
        """The node id at ``position`` (a graph node or, past ``n_nodes``, a foreign GPU)."""
        return self.names[position] if position < self.n_nodes else self.foreign[position - self.n_nodes]

    def is_gpu_position(self, positions: np.ndarray) -> np.ndarray:
        """Whether each position (in ``link_src`` / ``link_dst`` terms) is a GPU: a rank or a foreign GPU."""
        return (positions < self.n_ranks) | (positions >= self.n_nodes)

    def with_capacities(self, capacities: Topology | Sequence[float] | np.ndarray) -> FabricView:
        """The same view (structure arrays shared, not copied) with arc capacities taken from
        ``capacities``: a topology of the same structure, or one value per topology link (Gbit/s)."""
        values = capacities.capacities_gbps if isinstance(capacities, Topology) else np.asarray(capacities, float)
        if values.shape != (self.n_links,):
            raise TopologyError(f"expected {self.n_links} capacities, one per link of topology "
                                f"{self.topology_name!r}, got shape {values.shape}")
        return replace(self, gbps=_frozen(values[self.link].astype(float)))

    def fits(self, topology: Topology) -> bool:
        """Whether ``topology`` has this view's structure (same nodes, same links between them)."""
        if len(topology.links) != self.n_links or len(topology.nodes) != self.n_nodes + len(self.foreign):
            return False
        src, dst = topology.link_endpoints
        order = [topology.node_index.get(name, -1) for name in self.names + self.foreign]
        if min(order) < 0:
            return False
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        return bool(np.array_equal(position[src], self.link_src) and np.array_equal(position[dst], self.link_dst))

    def disconnected_pair(self) -> tuple[str, str] | None:
        """Ranks ``(a, b)`` such that ``a`` cannot reach ``b`` through switches and other ranks, or None.

        All ranks reach each other iff they lie in one strongly connected component (one C call;
        this runs on every synthesis). Only when they do not, a breadth-first search from rank 0
        tells which direction fails.
        """
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import breadth_first_order, connected_components

        n = self.n_nodes
        # CSR straight from the arcs sorted by tail, float64 data and int32 indices as csgraph wants them:
        # no conversion inside scipy (this check runs on every synthesis; 0.5 ms -> 0.1 ms at 32 GPUs).
        order = np.argsort(self.tail, kind="stable")
        indptr = np.concatenate([[0], np.cumsum(np.bincount(self.tail, minlength=n))]).astype(np.int32)
        graph = csr_matrix((np.ones(self.n_arcs), self.head[order].astype(np.int32), indptr), shape=(n, n))
        graph.sum_duplicates()  # parallel links: csgraph's strong components never return on duplicate entries
        _, labels = connected_components(graph, directed=True, connection="strong")
        apart = np.flatnonzero(labels[: self.n_ranks] != labels[0])
        if not apart.size:
            return None
        other = int(apart[0])
        reached = breadth_first_order(graph, 0, directed=True, return_predecessors=False)
        if np.isin(other, reached):
            return self.names[other], self.names[0]
        return self.names[0], self.names[other]

    def require_connected(self, what: str) -> FabricView:
        """``self``, or :class:`~mccl.errors.Infeasible` naming a rank GPU that cannot reach another.

        ``what``: the collective in the user's terms ("AllGather", "AllToAll") for the message.
        """
        pair = self.disconnected_pair()
        if pair is not None:
            raise Infeasible(f"{what} is infeasible on topology {self.topology_name!r}: rank GPU {pair[0]!r} "
                             f"cannot reach rank GPU {pair[1]!r} through switches and the other ranks "
                             "(disconnected ranks; a GPU that holds no rank cannot relay)")
        return self


def fabric_view(topology: Topology, ranks: Sequence[str] | None = None) -> FabricView:
    """The view of ``topology`` for a collective over ``ranks`` (all GPUs, in node order, by default).

    Ranks must be distinct GPUs (:class:`~mccl.errors.TopologyError` otherwise). Connectivity is
    not checked here (the validator must not raise :class:`~mccl.errors.Infeasible`); solvers call
    :meth:`FabricView.require_connected`.
    """
    chosen = tuple(topology.gpus if ranks is None else ranks)
    rank_pos = np.array([_gpu_position(topology, gpu) for gpu in chosen], dtype=np.int64)
    is_gpu = np.array([node.is_gpu for node in topology.nodes], dtype=bool)
    is_rank = np.zeros(len(topology.nodes), dtype=bool)
    is_rank[rank_pos] = True
    if int(is_rank.sum()) != len(chosen):
        twice = next(gpu for position, gpu in enumerate(chosen) if gpu in chosen[:position])
        raise TopologyError(f"ranks must be distinct GPUs of topology {topology.name!r}: {twice!r} holds two ranks")
    switches = np.flatnonzero(~is_gpu)
    foreign = np.flatnonzero(is_gpu & ~is_rank)
    order = np.concatenate([rank_pos, switches, foreign])
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    n_nodes = len(chosen) + len(switches)
    src, dst = topology.link_endpoints
    link_src, link_dst = position[src], position[dst]
    arcs = np.flatnonzero((link_src < n_nodes) & (link_dst < n_nodes))
    arc_of_link = np.full(len(topology.links), -1, dtype=np.int64)
    arc_of_link[arcs] = np.arange(len(arcs))
    names = tuple(topology.nodes[i].id for i in order[:n_nodes].tolist())
    hosts: dict[str, int] = {}
    groups = np.full(n_nodes, -1, dtype=np.int64)
    for i, node in enumerate(order[:n_nodes].tolist()):
        host = topology.nodes[node].host
        if host is not None:
            groups[i] = hosts.setdefault(host, len(hosts))
    return FabricView(
        topology_name=topology.name,
        ranks=chosen,
        names=names,
        foreign=tuple(topology.nodes[i].id for i in foreign.tolist()),
        tail=_frozen(link_src[arcs]),
        head=_frozen(link_dst[arcs]),
        link=_frozen(arcs.astype(np.int64)),
        gbps=_frozen(topology.capacities_gbps[arcs].astype(float)),
        link_src=_frozen(link_src),
        link_dst=_frozen(link_dst),
        arc_of_link=_frozen(arc_of_link),
        groups=_frozen(groups),
        hosts=tuple(hosts),
    )


def _gpu_position(topology: Topology, gpu: str) -> int:
    node = topology.node(gpu)  # TopologyError naming an unknown node
    if not node.is_gpu:
        raise TopologyError(f"rank GPU {gpu!r} is a {node.kind.value} of topology {topology.name!r}, not a GPU")
    return topology.node_index[gpu]
