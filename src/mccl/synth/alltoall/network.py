"""The fabric as the AllToAll LP sees it: rank GPUs and switches, as numpy arrays.

A GPU that is not a rank of the collective cannot relay (a relay is a transfer
between ranks), so it and its links are left out. The remaining links are the
LP's link rows; ``link_ids`` maps them back to topology link ids. Capacities are
in Gbit/s.

Feasibility: every rank must reach every other over the kept links (possibly
relaying through other ranks). That holds exactly when all ranks lie in one
strongly connected component; otherwise :class:`~mccl.errors.Infeasible` names a
pair that cannot communicate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, connected_components

from mccl.errors import Infeasible
from mccl.synth.common import check_ranks
from mccl.topology import Topology

__all__ = ["Network", "build_network"]


@dataclass(frozen=True, eq=False)
class Network:
    """Arrays over the kept nodes (rank GPUs + switches) and kept links."""

    topology: Topology
    ranks: tuple[str, ...]
    node_ids: tuple[str, ...]
    is_gpu: np.ndarray  # per kept node
    rank_node: np.ndarray  # kept-node index of each rank
    node_rank: np.ndarray  # rank of each kept node, -1 for switches
    link_ids: np.ndarray  # topology link id of each kept link
    tail: np.ndarray  # kept-node index where each kept link starts
    head: np.ndarray  # kept-node index where it ends
    capacity: np.ndarray  # Gbit/s

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    @property
    def n_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def n_links(self) -> int:
        return len(self.link_ids)

    def describe_link(self, link: int) -> str:
        return f"{self.node_ids[self.tail[link]]}->{self.node_ids[self.head[link]]}"


def build_network(topology: Topology, ranks: Sequence[str] | None = None) -> Network:
    """The LP's view of ``topology`` for an AllToAll over ``ranks`` (all GPUs by default)."""
    chosen = check_ranks(topology, ranks)
    rank_set = set(chosen)
    node_ids = tuple(node.id for node in topology.nodes if not node.is_gpu or node.id in rank_set)
    index = {name: i for i, name in enumerate(node_ids)}
    kept = [link for link in topology.links if link.src in index and link.dst in index]
    tail = np.array([index[link.src] for link in kept], dtype=np.int64)
    head = np.array([index[link.dst] for link in kept], dtype=np.int64)
    is_gpu = np.array([topology.node(name).is_gpu for name in node_ids], dtype=bool)
    rank_node = np.array([index[gpu] for gpu in chosen], dtype=np.int64)
    node_rank = np.full(len(node_ids), -1, dtype=np.int64)
    node_rank[rank_node] = np.arange(len(chosen))
    network = Network(
        topology=topology,
        ranks=chosen,
        node_ids=node_ids,
        is_gpu=is_gpu,
        rank_node=rank_node,
        node_rank=node_rank,
        link_ids=np.array([link.id for link in kept], dtype=np.int64),
        tail=tail,
        head=head,
        capacity=np.array([link.gbps for link in kept], dtype=float),
    )
    _check_connected(network)
    return network


def _check_connected(network: Network) -> None:
    n = network.n_nodes
    graph = csr_matrix((np.ones(network.n_links), (network.tail, network.head)), shape=(n, n))
    _, labels = connected_components(graph, directed=True, connection="strong")
    first = network.rank_node[0]
    apart = np.flatnonzero(labels[network.rank_node] != labels[first])
    if not apart.size:
        return
    other = int(network.rank_node[apart[0]])
    reach = np.zeros(n, dtype=bool)
    reach[breadth_first_order(graph, int(first), directed=True, return_predecessors=False)] = True
    a, b = (network.node_ids[first], network.node_ids[other])
    if reach[other]:
        a, b = b, a
    outgoing = np.bincount(network.tail, weights=network.capacity, minlength=n)
    if outgoing[network.node_ids.index(a)] <= 0:
        raise Infeasible(f"AllToAll is infeasible on {network.topology.name!r}: GPU {a} has no outgoing capacity")
    raise Infeasible(f"AllToAll is infeasible on {network.topology.name!r}: GPU {a} cannot reach GPU {b} "
                     "through switches and the other ranks")
