"""Throughput bounds that hold for every schedule, independent of any synthesizer.

AllGather cut bound (ForestColl, Zhao et al. 2025; mccl-paper §4.1). If every rank
broadcasts its block at rate x, every node set S that holds some but not all ranks
must take in the blocks of the ranks outside it: ``cap_in(S) >= x · |ranks \\ S|``.
The largest such x is the optimum, and it is attained (by spanning-tree packing,
with switches that only forward). With a super-source s* feeding every rank at
rate x, x is feasible iff every rank v has ``maxflow(s*, v) >= n · x`` (a cut S ∋ v
costs ``x · |ranks ∩ S| + cap_in(S)``).

We find the optimum by Dinkelbach's method on that ratio: start from an upper
bound, find a violated cut with max-flows, move x to that cut's ratio, repeat
until no cut is violated. Each x is the exact ratio of a real cut (computed in
floating point from the cut's links), so the result is a true cut value; the
integer max-flow (scipy's Dinic) only chooses which cut, at a resolution of
about 1e-6 of the total capacity. Typically 1–3 rounds of n max-flows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from mccl.errors import Infeasible
from mccl.synth.common import check_ranks
from mccl.topology import Topology

__all__ = ["CutBound", "allgather_cut_bound"]


@dataclass(frozen=True)
class CutBound:
    """The AllGather optimum: per-source rate, algbw, and the cut that attains it."""

    rate_gbps: float  # per-source broadcast rate x, Gbit/s
    algbw_gbs: float  # n · x in GB/s, the nccl-tests algbw bound
    cut_nodes: tuple[str, ...]  # the node set S of the saturated cut
    cut_links: tuple[int, ...]  # links entering S (the bottleneck cut)


def allgather_cut_bound(topology: Topology, ranks: Sequence[str] | None = None) -> CutBound:
    chosen = check_ranks(topology, ranks)
    n = len(chosen)
    rank_set = set(chosen)
    names = [node.id for node in topology.nodes if not node.is_gpu or node.id in rank_set]
    index = {name: i for i, name in enumerate(names)}
    source = len(names)  # the super-source s*
    kept = [link for link in topology.links if link.src in index and link.dst in index]
    tail = np.array([index[link.src] for link in kept], dtype=np.int64)
    head = np.array([index[link.dst] for link in kept], dtype=np.int64)
    gbps = np.array([link.gbps for link in kept], dtype=float)
    rank_nodes = np.array([index[gpu] for gpu in chosen], dtype=np.int64)

    # Upper bound from single-rank cuts: everything a rank receives enters through its in-links.
    inflow = np.bincount(head, weights=gbps, minlength=len(names))
    rate = float(np.min(inflow[rank_nodes]) / (n - 1))
    if rate <= 0:
        raise Infeasible("some rank has no incoming capacity; AllGather is impossible")
    worst = int(rank_nodes[np.argmin(inflow[rank_nodes])])
    cut = ((names[worst],), tuple(int(kept[i].id) for i in np.flatnonzero(head == worst)))
    scale = 2**30 / (gbps.sum() + n * rate)  # integer units for Dinic, far below int32 overflow
    for _ in range(64):
        violated = _find_violated_cut(len(names) + 1, source, tail, head, gbps, rank_nodes, rate, scale)
        if violated is None:
            break
        inside = violated
        outside_ranks = int(np.sum(~inside[rank_nodes]))
        entering = inside[head] & ~inside[tail]
        new_rate = float(gbps[entering].sum() / outside_ranks)
        if new_rate >= rate * (1 - 1e-12):
            break  # rounding of the integer flow found no strictly tighter cut
        rate = new_rate
        cut = (tuple(names[i] for i in np.flatnonzero(inside)), tuple(int(kept[i].id) for i in np.flatnonzero(entering)))
    return CutBound(rate, n * rate / 8.0, cut[0], cut[1])


def _find_violated_cut(
    n_nodes: int,
    source: int,
    tail: np.ndarray,
    head: np.ndarray,
    gbps: np.ndarray,
    rank_nodes: np.ndarray,
    rate: float,
    scale: float,
) -> np.ndarray | None:
    """The sink side S of a cut with ``maxflow(s*, v) < n·x`` for some rank v, or None."""
    n = len(rank_nodes)
    rows = np.concatenate([tail, np.full(n, source)])
    cols = np.concatenate([head, rank_nodes])
    capacity = np.concatenate([np.floor(gbps * scale), np.full(n, np.floor(rate * scale))]).astype(np.int64)
    graph = csr_matrix((capacity, (rows, cols)), shape=(n_nodes, n_nodes))
    graph.sum_duplicates()
    # Both directions present so that the residual graph can be read off cap - flow.
    both = (graph + csr_matrix((np.zeros(len(rows), dtype=np.int64), (cols, rows)), shape=graph.shape)).tocsr()
    need = int(np.floor(rate * scale)) * n
    slack = max(n, 1)  # integer flooring loses at most one unit per source edge
    for sink in rank_nodes:
        result = maximum_flow(graph, source, int(sink))
        if result.flow_value >= need - slack:
            continue
        residual = (both - result.flow).tocsr()
        residual.data = (residual.data > 0).astype(np.int8)
        residual.eliminate_zeros()
        reached = breadth_first_order(residual, source, directed=True, return_predecessors=False)
        inside = np.ones(n_nodes, dtype=bool)
        inside[reached] = False
        return inside[:-1]
    return None
