"""Phase 3's exact rule: one root's trees grown arc by arc, each arc's multiplicity proven by a max-flow.

The rule and its proof are in :mod:`.arborescence` (module docstring); this is its fallback
when the greedy's trees do not pass the check. Each root gets its own network: logical arcs
at their residual capacity (spent arcs left out: residuals only shrink here), one node per
group as groups split. Candidate arcs come from a heap: the previous tree's arcs first (warm
start), then by capacity (throughput) or by the depth of u within a capacity class
(latency-aware); an arc refused is retried only when nothing else is left. With few trees
left (≤ ``_CAPPED_TOTAL``) the flows are capped augmenting paths (:mod:`.smallflow`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence, Set

import numpy as np

from mccl.errors import SynthesisError
from mccl.synth.maxflow import BIG, FlowNet
from mccl.synth.treepack.smallflow import CappedFlowNet
from mccl.synth.treepack.tree import Tree

__all__ = ["checked_root"]

_CAPPED_TOTAL = 1024  # exact rule with at most this many trees still to pack: capped augmenting paths (searched
# from the sink, few and short late in the packing: 0.1–0.5 ms a flow at 1024 GPUs against OR-Tools' 1–3 ms)


def checked_root(root: int, n: int, k: int, keys: list[tuple[int, int]], out: Sequence[Sequence[int]],
                  tails: np.ndarray, heads: np.ndarray, residual: np.ndarray, untouched: np.ndarray,
                  latency_aware: bool, prefer: Callable[[int], Set[tuple[int, int]]] | None) -> list[Tree]:
    """One root's k trees, every arc checked by the max-flow of the rule (:mod:`.arborescence`)."""
    if k == 0:
        untouched[root] = 0
        checked_root.solves = 0  # type: ignore[attr-defined]
        return []
    preferred = prefer(root) if prefer is not None else frozenset()
    out = [np.asarray(arcs, dtype=np.int64) for arcs in out]  # each rank's out-arc ids (ascending), as arrays
    untouched[root] = 0
    total = int(untouched.sum()) + k
    # Only whether a flow reaches ``total`` matters: few trees left, a few augmenting paths decide it.
    net = CappedFlowNet(n + 1, total) if total <= _CAPPED_TOTAL else FlowNet(n + 1)
    # Residuals only shrink here: spent arcs stay out of the network (-1: no arc).
    positive = residual > 0
    arc_ids = np.full(len(residual), -1, dtype=np.int64)
    arc_ids[positive] = net.add_arcs(tails[positive], heads[positive], residual[positive])
    source_arcs = net.add_arcs(np.full(n, n), np.arange(n), untouched)
    stack: list[tuple[Tree, int | None]] = [(Tree(root, k, depth={root: 0}), None)]
    trees = []
    while stack:
        tree, group_arc = stack.pop()
        if group_arc is not None:
            net.set_capacity(group_arc, 0)  # the group being grown leaves the network
        if not _grow(tree, n, keys, out, heads, residual, net, arc_ids, source_arcs, untouched, total,
                     latency_aware, preferred, stack):
            raise SynthesisError(f"tree packing stalled for root rank {tree.root} with {len(tree.depth)} of {n} "
                                 "ranks reached; the logical graph lost the cut condition (a bug)")
        total -= tree.multiplicity
        trees.append(tree)
    checked_root.solves = net.solves  # type: ignore[attr-defined]
    return trees


def _grow(tree: Tree, n: int, keys: list[tuple[int, int]], out: list[np.ndarray], heads: np.ndarray,
          residual: np.ndarray,
          net: FlowNet | None, arc_ids: np.ndarray | None, source_arcs: np.ndarray | None,
          untouched: np.ndarray, total: int, latency_aware: bool, preferred: Set[tuple[int, int]],
          stack: list) -> bool:
    """Grow one group until it spans all ranks, splitting off remainders onto ``stack``.

    With ``net`` None, greedily (μ = min(m, c_uv)); False when no arc is left to grow by.
    """
    heap: list[tuple[tuple, int]] = []
    inside = np.zeros(n, dtype=bool)  # tree.depth's ranks, for the vectorized filter below
    inside[list(tree.depth)] = True

    def push_from(u: int) -> None:
        # The out-arcs of u with units left into ranks outside the tree (numpy: late in the packing most
        # are spent, and a Python pass over all of them per rank added was a third of the exact rule).
        candidates = out[u]
        candidates = candidates[(residual[candidates] > 0) & ~inside[heads[candidates]]]
        depth_u = tree.depth[u]
        for index, cap in zip(candidates.tolist(), residual[candidates].tolist(), strict=True):
            warm = 0 if preferred and keys[index] in preferred else 1
            # Latency-aware: among arcs of the same capacity class (a power of two), the shallowest first.
            order = (-cap.bit_length(), depth_u, -cap) if latency_aware else (-cap, depth_u)
            heapq.heappush(heap, ((warm, *order, index), index))

    for u in tree.depth:
        push_from(u)
    failed: list[tuple[tuple, int]] = []
    grown = False  # whether the tree grew since the failed arcs were last retried
    while len(tree.depth) < n:
        if not heap:
            # An arc refused now may fit once the tree holds more ranks: retry the refused ones lazily,
            # only when nothing else is left (each retry costs a max-flow).
            if not failed or not grown:
                return False
            for again in failed:
                heapq.heappush(heap, again)
            failed.clear()
            grown = False
            continue
        item = heapq.heappop(heap)
        index = item[1]
        u, v = keys[index]
        if v in tree.depth or residual[index] == 0:
            continue
        m = tree.multiplicity
        mu = min(m, int(residual[index]))
        if net is not None and len(tree.depth) > 1:
            saved = int(untouched[u])
            net.set_capacity(source_arcs[u], BIG)
            flow = net.max_flow(n, v)
            net.set_capacity(source_arcs[u], saved)
            mu = min(mu, flow - total + m)
        if mu <= 0:
            failed.append(item)
            continue
        if mu < m:
            rest = Tree(tree.root, m - mu, list(tree.edges), dict(tree.depth), tree.preferred)
            group_arc = None
            if net is not None:
                node = net.n_nodes
                group_arc = net.add_arc(n, node, m - mu)
                members = np.fromiter(rest.depth, dtype=np.int64)
                net.add_arcs(np.full(len(members), node), members, np.full(len(members), BIG))
            stack.append((rest, group_arc))
            tree.multiplicity = mu
        residual[index] -= mu
        if net is not None:
            net.set_capacity(arc_ids[index], int(residual[index]))
        tree.depth[v] = tree.depth[u] + 1
        inside[v] = True
        tree.edges.append((u, v))
        tree.preferred += (u, v) in preferred
        push_from(v)
        grown = True
    return True
