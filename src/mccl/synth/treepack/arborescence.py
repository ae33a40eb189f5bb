"""Phase 3: k spanning out-trees (arborescences) per rank on the logical graph.

Edmonds' branching theorem with root sets: groups of trees ``j`` (``m_j`` identical
partial trees with vertex set ``R_j``) extend to spanning arborescences within the
residual integer capacities c iff every non-empty rank set X has
``c_in(X) >= Σ_{j : R_j ∩ X = ∅} m_j``. With a super-source s* and one node t_j
per group (``s* → t_j`` of capacity m_j, ``t_j → R_j`` unbounded) that is
``maxflow(s*, v) >= M = Σ m_j`` for every rank v (Phase 2 ends with this check).

Growing group i by μ copies of an arc ``u → v`` (u ∈ R_i, v ∉ R_i) only tightens
the sets X ∋ v, u ∉ X that meet R_i, by μ. So the largest safe μ is
``min(m_i, c_uv, F - M + m_i)`` with F the max-flow from s* (plus an unbounded
arc s* → u) to v in the network *without* group i's node: sets that miss R_i get
m_i of headroom for free there (proof in the design notes of issue 3). When
μ < m_i the group splits: μ copies take the arc, the other ``m_i - μ`` wait on a
stack (integral multiplicities, as ForestColl's packing). The first arc of a group
(R = {root}) needs no max-flow: no X can meet R without containing u.

One network for the whole phase: logical arcs change capacity in place, group
nodes are added as groups split. Candidate arcs come from a heap: the previous
tree's arcs first (warm start), then by capacity (throughput) or by depth of u
(latency-aware, shallow trees). Cost: one max-flow per arc added, n·(n-1)·groups.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Set
from dataclasses import dataclass, field

import numpy as np

from mccl.errors import SynthesisError
from mccl.synth.treepack.flownet import BIG, FlowNet

__all__ = ["Tree", "pack_arborescences"]


@dataclass
class Tree:
    """``multiplicity`` identical trees of ``root``; ``edges`` in the order added; ``depth`` per rank."""

    root: int
    multiplicity: int
    edges: list[tuple[int, int]] = field(default_factory=list)
    depth: dict[int, int] = field(default_factory=dict)
    preferred: int = 0  # edges that came from the previous tree (warm start)


def pack_arborescences(
    n: int,
    units: dict[tuple[int, int], int],
    k: int,
    *,
    latency_aware: bool = False,
    prefer: Callable[[int], Set[tuple[int, int]]] | None = None,
) -> tuple[list[Tree], int]:
    """k spanning out-trees per rank within ``units``; returns the trees and the max-flows used.

    ``prefer(root)``: arcs to try first for that root's trees (warm start).
    """
    keys = list(units)
    out: list[list[int]] = [[] for _ in range(n)]
    for index, (u, _) in enumerate(keys):
        out[u].append(index)
    residual = np.array([units[key] for key in keys], dtype=np.int64)
    source = n
    net = FlowNet(n + 1)
    arc_ids = net.add_arcs(np.array([u for u, _ in keys], dtype=np.int64),
                           np.array([v for _, v in keys], dtype=np.int64), residual)
    source_arcs = net.add_arcs(np.full(n, source), np.arange(n), np.full(n, k))
    untouched = np.full(n, k, dtype=np.int64)
    total = n * k  # M: the demand of all unfinished groups
    trees: list[Tree] = []
    for root in range(n):
        preferred = prefer(root) if prefer is not None else frozenset()
        untouched[root] = 0
        net.set_capacity(source_arcs[root], 0)
        stack: list[tuple[Tree, int | None]] = [(Tree(root, k, depth={root: 0}), None)]
        while stack:
            tree, group_arc = stack.pop()
            if group_arc is not None:
                net.set_capacity(group_arc, 0)  # the group being grown leaves the network
            _grow(tree, n, keys, out, residual, net, arc_ids, source_arcs, untouched, total,
                  latency_aware, preferred, stack)
            total -= tree.multiplicity
            trees.append(tree)
    return trees, net.solves


def _grow(tree: Tree, n: int, keys: list[tuple[int, int]], out: list[list[int]], residual: np.ndarray,
          net: FlowNet, arc_ids: np.ndarray, source_arcs: np.ndarray, untouched: np.ndarray, total: int,
          latency_aware: bool, preferred: Set[tuple[int, int]], stack: list) -> None:
    """Grow one group until it spans all ranks, splitting off remainders onto ``stack``."""
    heap: list[tuple[tuple, int]] = []

    def push_from(u: int) -> None:
        for index in out[u]:
            v = keys[index][1]
            if v in tree.depth or residual[index] == 0:
                continue
            warm = 0 if keys[index] in preferred else 1
            order = (tree.depth[u], -int(residual[index])) if latency_aware else (-int(residual[index]), tree.depth[u])
            heapq.heappush(heap, ((warm, *order, index), index))

    for u in tree.depth:
        push_from(u)
    failed: list[tuple[tuple, int]] = []
    while len(tree.depth) < n:
        if not heap:
            raise SynthesisError(f"tree packing stalled for root rank {tree.root} with {len(tree.depth)} of {n} "
                                 "ranks reached; the logical graph lost the cut condition (a bug)")
        item = heapq.heappop(heap)
        index = item[1]
        u, v = keys[index]
        if v in tree.depth or residual[index] == 0:
            continue
        m = tree.multiplicity
        mu = min(m, int(residual[index]))
        if len(tree.depth) > 1:
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
            node = net.n_nodes
            group_arc = net.add_arc(n, node, m - mu)
            members = np.fromiter(rest.depth, dtype=np.int64)
            net.add_arcs(np.full(len(members), node), members, np.full(len(members), BIG))
            stack.append((rest, group_arc))
            tree.multiplicity = mu
        residual[index] -= mu
        net.set_capacity(arc_ids[index], int(residual[index]))
        tree.depth[v] = tree.depth[u] + 1
        tree.edges.append((u, v))
        tree.preferred += (u, v) in preferred
        push_from(v)
        for again in failed:
            heapq.heappush(heap, again)
        failed.clear()
