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

The kernel walks only the arcs :class:`FastGrower` lists: those with units left when it last
re-listed them (every few growths, and after any root gave its units back), in their original
relative order, so every score and tie is what walking all arcs gives (tests compare both).

Output is arrays, not :class:`~mccl.synth.treepack.tree.Tree` objects (16 million Python
tuples at 2048 GPUs): per group its multiplicity, its arcs in the order added, and the depth
of every rank. Randomized retries (``seed`` ≥ 0) draw their noise from numba's own generator,
so they are reproducible but not the numpy grower's draws.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["FastGrower", "GrownRoot", "host_index"]

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
def _allowed(arc: int, mu: int, m: int, tails: np.ndarray, host: np.ndarray, inter: np.ndarray,
             egress: np.ndarray, reserve: np.ndarray, order_pos: np.ndarray, size: int, stack_len: np.ndarray,
             stack_mult: np.ndarray, stack_cout: np.ndarray, stack_demand: np.ndarray, stack_home: np.ndarray,
             cur_cout: int, cur_untouched: int, home: int, cur_home: bool) -> bool:
    """Whether taking ``mu`` units of ``arc`` keeps the cut conditions the guard watches (module docstring)."""
    u = tails[arc]
    if inter[arc]:
        need = reserve[host[u]]
        if host[u] == home:  # the root's own groups that have not left its host yet
            for j in range(size):
                if stack_home[j]:
                    need += stack_mult[j]
            if cur_home:
                need += m - mu
        if egress[host[u]] - mu < need:
            return False
    pending = 0
    for j in range(size):
        pending += stack_mult[j]
        if order_pos[u] <= stack_len[j] and stack_cout[j] - mu < stack_demand[j]:
            return False
    return mu == m or cur_cout - mu >= (m - mu) + pending + cur_untouched


@_jit
def _lift(heap: np.ndarray, best: np.ndarray, n: int, leaves: int, w: int) -> None:
    """Rank w's entry changed: recompute its ancestors in the tournament tree (leftmost best wins)."""
    position = (leaves + w) >> 1
    while position >= 1:
        left, right = heap[2 * position], heap[2 * position + 1]
        heap[position] = right if right < n and (left >= n or best[right] > best[left]) else left
        position >>= 1


@_jit
def _grow_root(n: int, root: int, k: int, tails: np.ndarray, heads: np.ndarray, by_tail: np.ndarray,
               start: np.ndarray, by_head: np.ndarray, head_start: np.ndarray, host: np.ndarray,
               inter: np.ndarray, reserve: np.ndarray, untouched: np.ndarray, guard: bool, residual: np.ndarray,
               preferred: np.ndarray, latency_aware: bool, seed: int, out_arcs: np.ndarray, out_mult: np.ndarray,
               out_depth: np.ndarray, unreached: np.ndarray) -> int:
    """Grow ``root``'s k trees; the number of groups, or -1 when stuck (``residual`` then restored and
    ``unreached`` marks the ranks the stuck group could not reach)."""
    jitter = seed >= 0
    egress = np.zeros(len(reserve), dtype=np.int64)
    top = 1.0
    if len(by_tail):  # the arcs listed (all with units left, and maybe some spent ones): the rest hold 0
        top = 0.0
    for position in range(len(by_tail)):
        arc = by_tail[position]
        if inter[arc]:
            egress[host[tails[arc]]] += residual[arc]
        top = max(top, float(residual[arc]))
    if jitter:
        np.random.seed(seed)
    log_arc = np.empty(k * n, dtype=np.int64)
    log_amount = np.empty(k * n, dtype=np.int64)
    logged = 0
    stack_src = np.empty(k, dtype=np.int64)
    stack_len = np.empty(k, dtype=np.int64)
    stack_mult = np.empty(k, dtype=np.int64)
    stack_cout = np.empty(k, dtype=np.int64)
    stack_demand = np.empty(k, dtype=np.int64)
    stack_home = np.empty(k, dtype=np.bool_)  # the entry's partial tree lies in the root's host
    home = host[root]
    stack_src[0], stack_len[0], stack_mult[0] = -1, 0, k
    size = 1
    in_tree = np.zeros(n, dtype=np.bool_)
    depth = np.zeros(n, dtype=np.int64)
    order_pos = np.zeros(n, dtype=np.int64)
    best = np.empty(n)
    best_arc = np.empty(n, dtype=np.int64)
    # Units on arcs from the partial tree into each rank outside it: what ``cur_cout`` loses when the rank
    # joins (kept as the tree grows, instead of a pass over the new rank's in-arcs: half the work per rank).
    into = np.zeros(n, dtype=np.int64)
    # Tournament tree over ``best``: heap[1] is the first rank of the highest score (what a scan from
    # rank 0 keeping strictly better ones finds), O(log n) per change instead of O(n) per rank added.
    leaves = 1
    while leaves < n:
        leaves *= 2
    heap = np.empty(2 * leaves, dtype=np.int64)
    group = 0
    while size > 0:
        size -= 1
        src, prefix, m = stack_src[size], stack_len[size], stack_mult[size]
        in_tree[:] = False
        depth[:] = 0
        in_tree[root] = True
        order_pos[root] = 0
        cur_untouched = untouched[root]
        cur_home = True
        for i in range(prefix):
            arc = out_arcs[src, i]
            out_arcs[group, i] = arc
            in_tree[heads[arc]] = True
            depth[heads[arc]] = depth[tails[arc]] + 1
            order_pos[heads[arc]] = i + 1
            cur_untouched += untouched[heads[arc]]
            cur_home = cur_home and host[heads[arc]] == home
        best[:] = -np.inf
        best_arc[:] = -1
        into[:] = 0
        cur_cout = 0  # residual units leaving the partial tree
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
                cur_cout += residual[arc]
                into[v] += residual[arc]
                score = _score(arc, residual, depth, tails, preferred, n, top, latency_aware, jitter)
                if score > best[v] or (score == best[v] and arc > best_arc[v]):
                    best[v] = score
                    best_arc[v] = arc
        for w in range(leaves):
            heap[leaves + w] = w
        for position in range(leaves - 1, 0, -1):
            left, right = heap[2 * position], heap[2 * position + 1]
            heap[position] = right if right < n and (left >= n or best[right] > best[left]) else left
        edges = prefix
        while edges < n - 1:
            v = heap[1]
            if best[v] == -np.inf:
                for w in range(n):
                    unreached[w] = not in_tree[w]
                for i in range(logged):
                    residual[log_arc[i]] += log_amount[i]
                return -1
            arc = best_arc[v]
            u = tails[arc]
            mu = min(m, residual[arc])
            if guard and not _allowed(arc, mu, m, tails, host, inter, egress, reserve, order_pos, size, stack_len,
                                      stack_mult, stack_cout, stack_demand, stack_home, cur_cout, cur_untouched,
                                      home, cur_home):
                # The best arc into v would break a cut the guard watches: the best allowed one into v,
                # if any (the guarded cuts only shrink while this root grows: no retry later).
                best[v] = -np.inf
                best_arc[v] = -1
                for position in range(head_start[v], head_start[v + 1]):
                    other = by_head[position]
                    w = tails[other]
                    if not in_tree[w] or residual[other] <= 0:
                        continue
                    if not _allowed(other, min(m, residual[other]), m, tails, host, inter, egress, reserve,
                                    order_pos, size, stack_len, stack_mult, stack_cout, stack_demand, stack_home,
                                    cur_cout, cur_untouched, home, cur_home):
                        continue
                    score = _score(other, residual, depth, tails, preferred, n, top, latency_aware, jitter)
                    if score > best[v] or (score == best[v] and other > best_arc[v]):
                        best[v] = score
                        best_arc[v] = other
                _lift(heap, best, n, leaves, v)
                continue
            if inter[arc]:
                egress[host[u]] -= mu
            pending = 0
            for j in range(size):
                pending += stack_mult[j]
                if order_pos[u] <= stack_len[j]:
                    stack_cout[j] -= mu
            if mu < m:
                stack_src[size], stack_len[size], stack_mult[size] = group, edges, m - mu
                stack_cout[size] = cur_cout - mu
                stack_demand[size] = (m - mu) + pending + cur_untouched
                stack_home[size] = cur_home
                size += 1
                m = mu
            residual[arc] -= mu
            cur_cout -= into[v]  # the arcs from the tree into v no longer leave it (mu of them now spent)
            log_arc[logged], log_amount[logged] = arc, mu
            logged += 1
            in_tree[v] = True
            depth[v] = depth[u] + 1
            order_pos[v] = edges + 1
            cur_untouched += untouched[v]
            cur_home = cur_home and host[v] == home
            best[v] = -np.inf
            _lift(heap, best, n, leaves, v)
            out_arcs[group, edges] = arc
            edges += 1
            for position in range(start[v], start[v + 1]):
                other = by_tail[position]
                w = heads[other]
                if in_tree[w] or residual[other] <= 0:
                    continue
                cur_cout += residual[other]
                into[w] += residual[other]
                score = _score(other, residual, depth, tails, preferred, n, top, latency_aware, jitter)
                if score > best[w]:
                    best[w] = score
                    best_arc[w] = other
                    _lift(heap, best, n, leaves, w)
        out_mult[group] = m
        for w in range(n):
            out_depth[group, w] = depth[w]
        group += 1
    return group


_REFRESH_EVERY = 8  # growths between re-listings of the live arcs (one is an O(m) pass, ~a growth's cost / 8 at 2,048)


def _starts(ends: np.ndarray, order: np.ndarray, n: int) -> np.ndarray:
    """CSR offsets of ``order`` (arc ids sorted by ``ends``) per rank 0 … n."""
    return np.concatenate([[0], np.cumsum(np.bincount(ends[order], minlength=n))]).astype(np.int64)


@_jit
def _live_listing(residual: np.ndarray, order: np.ndarray, all_start: np.ndarray, listed: np.ndarray,
                  start: np.ndarray) -> int:
    """The arcs of ``order`` (a CSR by rank, offsets ``all_start``) with units left, in the same relative
    order, into ``listed`` with their offsets into ``start``; how many. One pass (numpy's gather, mask,
    bincount and cumsum were five, ~⅙ of Phase 3 on Fail1's million logical arcs at 1024 GPUs)."""
    count = 0
    for rank in range(len(all_start) - 1):
        start[rank] = count
        for position in range(all_start[rank], all_start[rank + 1]):
            arc = order[position]
            if residual[arc] > 0:
                listed[count] = arc
                count += 1
    start[len(all_start) - 1] = count
    return count


def host_index(n: int, groups: np.ndarray | None) -> np.ndarray:
    """Each rank's host as 0, 1, …; a rank without a host (or no ``groups``) is a host of its own."""
    raw = np.full(n, -1, dtype=np.int64) if groups is None else np.asarray(groups[:n], dtype=np.int64)
    raw = np.where(raw >= 0, raw, raw.max(initial=-1) + 1 + np.arange(n))
    return np.unique(raw, return_inverse=True)[1].astype(np.int64).reshape(n)


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

    def __init__(self, n: int, tails: np.ndarray, heads: np.ndarray, latency_aware: bool,
                 groups: np.ndarray | None = None) -> None:
        self.n = n
        self.tails = np.ascontiguousarray(tails, dtype=np.int64)
        self.heads = np.ascontiguousarray(heads, dtype=np.int64)
        self.latency_aware = latency_aware
        self.all_by_tail = np.argsort(self.tails, kind="stable").astype(np.int64)
        self.all_by_head = np.argsort(self.heads, kind="stable").astype(np.int64)
        self.by_tail, self.start = self.all_by_tail, _starts(self.tails, self.all_by_tail, n)
        self.by_head, self.head_start = self.all_by_head, _starts(self.heads, self.all_by_head, n)
        self.all_start, self.all_head_start = self.start, self.head_start
        self.grows_since_refresh = 0
        self.host = host_index(n, groups)
        self.n_hosts = int(self.host.max()) + 1 if n else 0
        self.inter = self.host[self.tails] != self.host[self.heads]
        self.unreached = np.zeros(n, dtype=np.bool_)

    def released(self) -> None:
        """Units went back into the residual (a root released): arcs spent before may hold units again,
        so the next growth lists every arc afresh (:meth:`_refresh`)."""
        self.grows_since_refresh = _REFRESH_EVERY

    def _refresh(self, residual: np.ndarray) -> None:
        """List only the arcs with units left (in the same relative order, so ties break as before).

        The kernel walks the out- and in-arcs of every rank it adds (``groups × m`` arc visits): late in
        the packing most arcs are spent, and at 2,048 GPUs (640 k arcs) walking them was most of its work.
        Residuals only shrink between refreshes (a release calls :meth:`released`), so the list stays a
        superset of the live arcs, and a spent arc listed is skipped as before: the trees are identical.
        """
        listed = np.empty(len(self.all_by_tail), dtype=np.int64)
        self.start = np.empty(self.n + 1, dtype=np.int64)
        self.by_tail = listed[:_live_listing(residual, self.all_by_tail, self.all_start, listed, self.start)]
        listed = np.empty(len(self.all_by_head), dtype=np.int64)
        self.head_start = np.empty(self.n + 1, dtype=np.int64)
        self.by_head = listed[:_live_listing(residual, self.all_by_head, self.all_head_start, listed,
                                             self.head_start)]
        self.grows_since_refresh = 0

    def reserve(self, untouched: np.ndarray) -> np.ndarray:
        """Per host, the trees its untouched roots still need to send out (egress the greedy keeps free)."""
        return np.bincount(self.host, weights=untouched, minlength=self.n_hosts).astype(np.int64)

    def grow_root(self, root: int, k: int, residual: np.ndarray, preferred: np.ndarray,
                  seed: int = -1, untouched: np.ndarray | None = None, reserve: np.ndarray | None = None,
                  guard: bool = True) -> GrownRoot | None:
        """k trees of ``root`` within ``residual`` (int64, updated in place), or None when stuck
        (``residual`` unchanged then; :attr:`unreached` marks the ranks the stuck group missed).
        ``seed`` ≥ 0: scores multiplied by uniform noise in [0.5, 1.5) (a randomized retry).

        The guard (module docstring) refuses arcs that would break a cut condition of the trees
        still to pack. ``untouched``: trees each rank's own later packing still needs (None: none); ``reserve``: the same
        summed per host (:meth:`reserve`). ``guard`` False: the plain rule of the numpy grower."""
        if untouched is None:
            untouched = np.zeros(self.n, dtype=np.int64)
        if reserve is None:
            reserve = self.reserve(untouched)
        if self.grows_since_refresh >= _REFRESH_EVERY:
            self._refresh(residual)
        self.grows_since_refresh += 1
        n = self.n
        arcs = np.empty((k, max(n - 1, 0)), dtype=np.int64)
        mult = np.empty(k, dtype=np.int64)
        depth = np.empty((k, n), dtype=np.int32)
        groups = _grow_root(n, root, k, self.tails, self.heads, self.by_tail, self.start, self.by_head,
                            self.head_start, self.host, self.inter, np.ascontiguousarray(reserve, dtype=np.int64),
                            np.ascontiguousarray(untouched, dtype=np.int64), guard, residual, np.ascontiguousarray(preferred, dtype=np.bool_), self.latency_aware, seed,
                            arcs, mult, depth, self.unreached)
        if groups < 0:
            return None
        return GrownRoot(root, mult[:groups].copy(), arcs[:groups].copy(), depth[:groups].copy())
