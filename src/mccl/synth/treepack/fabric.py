"""The graph the tree packing works on: ranks first, then switches, then nothing else.

GPUs that hold no rank are dropped with their links: a schedule may only relay
through ranks (a route passes through switches only, see
:mod:`mccl.schedule.validate`). Node ``i < n`` is rank ``i``; nodes ``n …`` are
switches. Arcs keep the physical link id they stand for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mccl.errors import Infeasible
from mccl.topology import Topology

__all__ = ["Fabric", "fabric_of"]


@dataclass(frozen=True, eq=False)
class Fabric:
    """Ranks and switches of a topology as integer nodes, links as arcs (capacities in Gbit/s)."""

    names: tuple[str, ...]  # node ids, ranks first (in rank order)
    n_ranks: int
    tail: np.ndarray  # int64 per arc
    head: np.ndarray
    gbps: np.ndarray  # float per arc
    link: np.ndarray  # physical link id per arc
    groups: np.ndarray  # int per node: its host's index, -1 for nodes of no host (ToRs, spines)

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    @property
    def n_arcs(self) -> int:
        return len(self.tail)


def fabric_of(topology: Topology, ranks: Sequence[str]) -> Fabric:
    """The rank-and-switch graph of ``topology``; :class:`Infeasible` if a rank cannot reach another."""
    rank_set = set(ranks)
    names = list(ranks) + [node.id for node in topology.nodes if not node.is_gpu]
    index = {name: i for i, name in enumerate(names)}
    kept = [link for link in topology.links if link.src in index and link.dst in index and link.gbps > 0]
    fabric = Fabric(
        names=tuple(names),
        n_ranks=len(ranks),
        tail=np.array([index[link.src] for link in kept], dtype=np.int64),
        head=np.array([index[link.dst] for link in kept], dtype=np.int64),
        gbps=np.array([link.gbps for link in kept], dtype=float),
        link=np.array([link.id for link in kept], dtype=np.int64),
        groups=_host_groups(topology, names),
    )
    _check_connected(fabric, topology, rank_set)
    return fabric


def _check_connected(fabric: Fabric, topology: Topology, rank_set: set[str]) -> None:
    """Every rank must reach rank 0 and be reached from it without passing a non-rank GPU."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order

    n = fabric.n_nodes
    graph = csr_matrix((np.ones(fabric.n_arcs), (fabric.tail, fabric.head)), shape=(n, n))
    for direction, matrix in (("reach", graph), ("be reached from", graph.T.tocsr())):
        order = breadth_first_order(matrix, 0, directed=True, return_predecessors=False)
        seen = np.zeros(n, dtype=bool)
        seen[order] = True
        missing = np.flatnonzero(~seen[: fabric.n_ranks])
        if missing.size:
            other = fabric.names[int(missing[0])]
            raise Infeasible(f"rank GPU {fabric.names[0]!r} cannot {direction} rank GPU {other!r} in "
                             f"topology {topology.name!r} through switches and ranks only (disconnected ranks); "
                             "AllGather is impossible")


def _host_groups(topology: Topology, names: list[str]) -> np.ndarray:
    hosts: dict[str, int] = {}
    out = np.full(len(names), -1, dtype=np.int64)
    for i, name in enumerate(names):
        host = topology.node(name).host
        if host is not None:
            out[i] = hosts.setdefault(host, len(hosts))
    return out
