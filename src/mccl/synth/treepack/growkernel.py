"""Greedy arborescence growth of Phase 3, compiled (numba): one root's k trees per call.

The same rule as :class:`mccl.synth.treepack.greedy.GreedyGrower` (kept as the reference
implementation the tests compare against), score for score and tie for tie: a group of m
identical trees grows one rank at a time along the best-scored residual arc from the tree
(previous-tree arcs first, then the widest, shallower tails on ties; latency-aware: the
shallowest tail within a capacity class); an arc with fewer than m units splits the group,
the rest regrowing later from the same partial tree (last split first, a stack).

Why compiled: the numpy grower pays ~10 µs of call overhead per numpy operation, several per
rank added, and Phase 3 adds ``groups × (n - 1)`` ranks (about 10⁶ at 512 GPUs, 1.6·10⁷ at
2048): that overhead was most of Phase 3. Here the work per rank added is the out-arcs of
the new rank plus one scan of the n-long "best arc into each rank" table.

Output is arrays, not :class:`~mccl.synth.treepack.tree.Tree` objects (16 million Python
tuples at 2048 GPUs): per group its multiplicity, its arcs in the order added, and the depth
of every rank. Randomized retries (``seed`` ≥ 0) draw their noise from numba's own generator,
so they are reproducible but not the numpy grower's draws.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["FastGrower", "GrownRoot"]

_jit = numba.njit(cache=True, nogil=True)


@_jit
def _score(arc: int, residual: np.ndarray, depth: np.ndarray, tails: np.ndarray, preferred: np.ndarray,
           n: int, top: float, latency_aware: bool, jitter: bool) -> float:
    res = float(residual[arc])
    tail_depth = depth[tails[arc]]
    if latency_aware:
        base = (np.floor(np.log2(max(res, 1.0))) + 1.0) * (n + 2) - tail_depth + res / (top + 1.0)
        bonus = 128.0 * (n + 2)
    else:
        base = res - tail_depth / (n + 1)
        bonus = 2.0 * (top + 1.0)
    score = base + bonus * (1.0 if preferred[arc] else 0.0)
    if jitter:
        score = score * np.random.uniform(0.5, 1.5)
    return score


@_jit
def _grow_root(n: int, root: int, k: int, tails: np.ndarray, heads: np.ndarray, by_tail: np.ndarray,
               start: np.ndarray, residual: np.ndarray, preferred: np.ndarray, latency_aware: bool, seed: int,
               out_arcs: np.ndarray, out_mult: np.ndarray, out_depth: np.ndarray, unreached: np.ndarray) -> int:
    """Grow ``root``'s k trees; the number of groups, or -1 when stuck (``residual`` then restored and
    ``unreached`` marks the ranks the stuck group could not reach)."""
    jitter = seed >= 0
    if jitter:
        np.random.seed(seed)
    top = 1.0
    if len(residual):
        top = float(residual.max())
    log_arc = np.empty(k * n, dtype=np.int64)
    log_amount = np.empty(k * n, dtype=np.int64)
    logged = 0
    stack_src = np.empty(k, dtype=np.int64)
    stack_len = np.empty(k, dtype=np.int64)
    stack_mult = np.empty(k, dtype=np.int64)
    stack_src[0], stack_len[0], stack_mult[0] = -1, 0, k
    size = 1
    in_tree = np.zeros(n, dtype=np.bool_)
    depth = np.zeros(n, dtype=np.int64)
    best = np.empty(n)
    best_arc = np.empty(n, dtype=np.int64)
    group = 0
    while size > 0:
        size -= 1
        src, prefix, m = stack_src[size], stack_len[size], stack_mult[size]
        in_tree[:] = False
        depth[:] = 0
        in_tree[root] = True
        for i in range(prefix):
            arc = out_arcs[src, i]
            out_arcs[group, i] = arc
            in_tree[heads[arc]] = True
            depth[heads[arc]] = depth[tails[arc]] + 1
        best[:] = -np.inf
        best_arc[:] = -1
        # Frontier of the partial tree; among equal scores the highest arc id wins (the numpy
        # grower's stable sort, later entries overwriting).
        for u in range(n):
            if not in_tree[u]:
                continue
            for position in range(start[u], start[u + 1]):
                arc = by_tail[position]
                v = heads[arc]
                if in_tree[v] or residual[arc] <= 0:
                    continue
                score = _score(arc, residual, depth, tails, preferred, n, top, latency_aware, jitter)
                if score > best[v] or (score == best[v] and arc > best_arc[v]):
                    best[v] = score
                    best_arc[v] = arc
        edges = prefix
        while edges < n - 1:
            v = 0
            for w in range(1, n):
                if best[w] > best[v]:
                    v = w
            if best[v] == -np.inf:
                for w in range(n):
                    unreached[w] = not in_tree[w]
                for i in range(logged):
                    residual[log_arc[i]] += log_amount[i]
                return -1
            arc = best_arc[v]
            u = tails[arc]
            mu = min(m, residual[arc])
            if mu < m:
                stack_src[size], stack_len[size], stack_mult[size] = group, edges, m - mu
                size += 1
                m = mu
            residual[arc] -= mu
            log_arc[logged], log_amount[logged] = arc, mu
            logged += 1
            in_tree[v] = True
            depth[v] = depth[u] + 1
            best[v] = -np.inf
            out_arcs[group, edges] = arc
            edges += 1
            for position in range(start[v], start[v + 1]):
                other = by_tail[position]
                w = heads[other]
                if in_tree[w] or residual[other] <= 0:
                    continue
                score = _score(other, residual, depth, tails, preferred, n, top, latency_aware, jitter)
                if score > best[w]:
                    best[w] = score
                    best_arc[w] = other
        out_mult[group] = m
        for w in range(n):
            out_depth[group, w] = depth[w]
        group += 1
    return group


class GrownRoot:
    """One root's groups: multiplicities, arcs (groups × (n-1), order added), depths (groups × n)."""

    __slots__ = ("root", "multiplicity", "arcs", "depth")

    def __init__(self, root: int, multiplicity: np.ndarray, arcs: np.ndarray, depth: np.ndarray) -> None:
        self.root = root
        self.multiplicity = multiplicity
        self.arcs = arcs
        self.depth = depth

    def release(self, residual: np.ndarray) -> None:
        """Give this root's units back to ``residual`` (undo)."""
        np.add.at(residual, self.arcs.reshape(-1), np.repeat(self.multiplicity, self.arcs.shape[1]))

    def take(self, residual: np.ndarray) -> None:
        """Take this root's units from ``residual`` again (redo)."""
        np.subtract.at(residual, self.arcs.reshape(-1), np.repeat(self.multiplicity, self.arcs.shape[1]))


class FastGrower:
    """The logical graph's arcs indexed by tail, and the compiled greedy over them."""

    def __init__(self, n: int, tails: np.ndarray, heads: np.ndarray, latency_aware: bool) -> None:
        self.n = n
        self.tails = np.ascontiguousarray(tails, dtype=np.int64)
        self.heads = np.ascontiguousarray(heads, dtype=np.int64)
        self.latency_aware = latency_aware
        self.by_tail = np.argsort(self.tails, kind="stable").astype(np.int64)
        self.start = np.searchsorted(self.tails[self.by_tail], np.arange(n + 1)).astype(np.int64)
        self.unreached = np.zeros(n, dtype=np.bool_)

    def grow_root(self, root: int, k: int, residual: np.ndarray, preferred: np.ndarray,
                  seed: int = -1) -> GrownRoot | None:
        """k trees of ``root`` within ``residual`` (int64, updated in place), or None when stuck
        (``residual`` unchanged then; :attr:`unreached` marks the ranks the stuck group missed).
        ``seed`` ≥ 0: scores multiplied by uniform noise in [0.5, 1.5) (a randomized retry)."""
        n = self.n
        arcs = np.empty((k, max(n - 1, 0)), dtype=np.int64)
        mult = np.empty(k, dtype=np.int64)
        depth = np.empty((k, n), dtype=np.int32)
        groups = _grow_root(n, root, k, self.tails, self.heads, self.by_tail, self.start, residual,
                            np.ascontiguousarray(preferred, dtype=np.bool_), self.latency_aware, seed,
                            arcs, mult, depth, self.unreached)
        if groups < 0:
            return None
        return GrownRoot(root, mult[:groups].copy(), arcs[:groups].copy(), depth[:groups].copy())
