"""Throughput bounds that hold for every schedule, independent of any synthesizer.

AllGather cut bound (ForestColl, Zhao et al. 2025; mccl-paper §4.1). If every rank
broadcasts its block at rate x, every node set S that holds some but not all ranks
must take in the blocks of the ranks outside it: ``cap_in(S) >= x · |ranks \\ S|``.
The largest such x is the optimum, and it is attained (by spanning-tree packing,
with switches that only forward). It is found by the Dinkelbach loop of
:mod:`mccl.synth.cutbound` on the ranks' :class:`~mccl.topology.FabricView`, the same
loop the tree packing's Phase 1 runs; each x is the exact ratio of a real cut
(computed in floating point from the cut's links), so the result is a true cut value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mccl.synth.common import check_ranks
from mccl.synth.cutbound import max_rate
from mccl.synth.maxflow import MaxFlow, ortools_max_flow
from mccl.topology import Topology, fabric_view

__all__ = ["CutBound", "allgather_cut_bound"]


@dataclass(frozen=True)
class CutBound:
    """The AllGather optimum: per-source rate, algbw, and the cut that attains it."""

    rate_gbps: float  # per-source broadcast rate x, Gbit/s
    algbw_gbs: float  # n · x in GB/s, the nccl-tests algbw bound
    cut_nodes: tuple[str, ...]  # the node set S of the saturated cut
    cut_links: tuple[int, ...]  # links entering S (the bottleneck cut)


def allgather_cut_bound(topology: Topology, ranks: Sequence[str] | None = None, *,
                        max_flow: MaxFlow = ortools_max_flow) -> CutBound:
    """The AllGather optimum over ``ranks`` (all GPUs by default); ``max_flow``: the engine
    (:mod:`mccl.synth.maxflow`). Ranks that cannot all reach each other give rate 0 (a cut
    with no capacity), not an error: the bound of an impossible collective is zero.
    :class:`~mccl.errors.Infeasible` when a rank has no incoming link at all."""
    chosen = check_ranks(topology, ranks)
    view = fabric_view(topology, chosen)
    optimum = max_rate(view, max_flow=max_flow)
    names = view.names
    cut_nodes = tuple(names[i] for i in optimum.cut_side.nonzero()[0].tolist())
    cut_links = tuple(int(link) for link in view.link[optimum.cut_arcs])
    n = len(chosen)
    return CutBound(optimum.rate_gbps, n * optimum.rate_gbps / 8.0, cut_nodes, cut_links)
