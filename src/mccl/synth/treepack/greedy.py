"""The reference greedy arborescence growth (Prim-like, numpy): what the compiled grower must equal.

Not on the synthesis path any more: Phase 3 grows trees with :mod:`.growkernel` (numba), whose
unguarded rule (``guard=False``) is this one score for score and tie for tie; the tests grow the
same roots with both and compare tree for tree, split for split (``test_compiled_greedy_matches_numpy_grower``).

The rule: a group of m identical trees of one root grows one rank at a time along the arc
of the highest score from the tree to a rank outside it: arcs of the previous tree first
(warm start), then the widest residual arc, shallower tails on ties (throughput), or the
shallowest tail among arcs of the same capacity class, a power of two (latency-aware). An
arc with fewer than m units left splits the group: its units go with the arc, the rest of
the group regrows from the same partial tree. No max-flow here, and no guard: whether what
is left still packs is :mod:`.arborescence`'s business.
"""

from __future__ import annotations

import numpy as np

from mccl.synth.treepack.tree import Tree

__all__ = ["GreedyGrower"]


class GreedyGrower:
    """Arc arrays of the logical graph, indexed by tail for fast frontier updates."""

    def __init__(self, n: int, tails: np.ndarray, heads: np.ndarray, latency_aware: bool) -> None:
        self.jitter: np.random.Generator | None = None  # set for a retry: random tie-breaking noise
        self.n = n
        self.tails = tails
        self.heads = heads
        self.latency_aware = latency_aware
        self.by_tail = np.argsort(tails, kind="stable")
        self.start = np.searchsorted(tails[self.by_tail], np.arange(n + 1))

    def _score(self, arcs: np.ndarray, residual: np.ndarray, depth: np.ndarray, preferred: np.ndarray,
               top: float) -> np.ndarray:
        res = residual[arcs].astype(float)
        tail_depth = depth[self.tails[arcs]]
        n = self.n
        if self.latency_aware:
            base = (np.floor(np.log2(np.maximum(res, 1.0))) + 1.0) * (n + 2) - tail_depth + res / (top + 1.0)
            bonus = 128.0 * (n + 2)
        else:
            base = res - tail_depth / (n + 1)
            bonus = 2.0 * (top + 1.0)
        score = base + bonus * preferred[arcs]
        if self.jitter is not None:
            score = score * self.jitter.uniform(0.5, 1.5, len(arcs))
        return score

    def grow_root(self, root: int, k: int, residual: np.ndarray, preferred: np.ndarray) -> list[Tree] | None:
        """k trees of ``root`` within ``residual`` (updated in place), or None when greedy gets stuck."""
        top = float(residual.max()) if len(residual) else 1.0
        stack = [Tree(root, k, depth={root: 0})]
        done: list[Tree] = []
        while stack:
            tree = stack.pop()
            if not self._grow(tree, residual, preferred, top, stack):
                return None
            done.append(tree)
        return done

    def _grow(self, tree: Tree, residual: np.ndarray, preferred: np.ndarray, top: float, stack: list[Tree]) -> bool:
        n, tails, heads = self.n, self.tails, self.heads
        in_tree = np.zeros(n, dtype=bool)
        depth = np.zeros(n, dtype=np.int64)
        for v, d in tree.depth.items():
            in_tree[v] = True
            depth[v] = d
        best = np.full(n, -np.inf)
        best_arc = np.full(n, -1, dtype=np.int64)
        frontier = np.flatnonzero(in_tree[tails] & ~in_tree[heads] & (residual > 0))
        if len(frontier):
            score = self._score(frontier, residual, depth, preferred, top)
            order = np.argsort(score, kind="stable")  # later (higher) scores overwrite earlier ones
            best[heads[frontier[order]]] = score[order]
            best_arc[heads[frontier[order]]] = frontier[order]
        for _ in range(n - len(tree.depth)):
            v = int(np.argmax(best))
            if best[v] == -np.inf:
                return False
            arc = int(best_arc[v])
            u = int(tails[arc])
            mu = min(tree.multiplicity, int(residual[arc]))
            if mu < tree.multiplicity:
                stack.append(Tree(tree.root, tree.multiplicity - mu, list(tree.edges), dict(tree.depth), tree.preferred))
                tree.multiplicity = mu
            residual[arc] -= mu
            in_tree[v] = True
            depth[v] = depth[u] + 1
            best[v] = -np.inf
            tree.depth[v] = int(depth[v])
            tree.edges.append((u, v))
            tree.preferred += bool(preferred[arc])
            arcs = self.by_tail[self.start[v]:self.start[v + 1]]
            arcs = arcs[~in_tree[heads[arcs]] & (residual[arcs] > 0)]
            if len(arcs):
                score = self._score(arcs, residual, depth, preferred, top)
                targets = heads[arcs]
                better = score > best[targets]
                best[targets[better]] = score[better]
                best_arc[targets[better]] = arcs[better]
        return True
