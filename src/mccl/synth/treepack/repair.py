"""Warm Phases 2 and 3 (ForestColl-warm, mccl-paper §4.3): keep the previous trees that fit, repair the rest.

A schedule is valid at rate x with k trees per rank when every fabric arc carries at
most its integer capacity ``floor(C_e · k / x)`` of tree edges' routes (units, from
:mod:`.rounding`). The cold path gets there through switch removal and packing on
the logical graph; a warm start already holds trees that did that on a fabric that
differs in a few links, so it works on the physical routes directly:

1. **Keep.** Per root, at most k of its previous chunks, those that touch no
   over-full arc first. Chunks whose arcs all stay within capacity together are kept
   at once (numpy over all routes); the rest are kept one by one while they fit.
2. **Repair** each tree still missing, starting from a previous tree of the same
   root that was not kept (else a copy of a kept one): its edges whose routes touch
   no arc short of capacity stay; of the others, parents first, those that still fit
   stay; every other edge is cut, leaving subtrees hanging from orphan ranks. Each
   orphan is re-attached by a new route from the root's component: a reverse BFS from
   the orphan through switches only (fewest hops first), over arcs with room, to a
   rank already reached; among orphans and entry ranks the widest route wins (the
   shallowest entry rank first for the latency-aware variant). An orphan no route
   reaches gets its subtree dissolved (its ranks become orphans, their edges freed)
   once; if the tree still cannot be completed, the warm start gives up and the
   caller packs cold.

Every edge kept or added fits the residual capacity when it is placed, so the result
is a valid packing of k trees per rank at the rounded rate x: the same throughput as a
cold synthesis at that k (cold may lose more on unbalanced switches, see
:mod:`.balance`; never less). Cost: O(routes) numpy for the keep step, and per repaired
tree O(n) numpy plus one small BFS per cut edge — no switch removal, no max-flow.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.forest import Forest
from mccl.synth.treepack.maxrate import CutChecker

__all__ = ["WarmPacking", "warm_pack"]

_SETTLE_ROUNDS = 8  # cut checks (n max-flows each) after keeping, giving back wasteful kept chunks

@dataclass(frozen=True)
class WarmPacking:
    """k trees per rank: forest rows kept (with their new chunk) plus new edges; depths per new chunk."""

    k: int
    rows: np.ndarray  # forest rows kept
    row_chunk: np.ndarray  # new chunk id of each kept row
    new_tail: np.ndarray
    new_head: np.ndarray
    new_chunk: np.ndarray
    new_routes: list[list[int]]  # physical link ids, AllGather direction
    depth: np.ndarray  # (n·k) × n
    kept_chunks: int  # previous chunks kept whole
    repaired_chunks: int


def warm_pack(forest: Forest, fabric: Fabric, units: np.ndarray, k: int, n_links: int, checker: CutChecker, *,
              latency_aware: bool = False) -> WarmPacking | None:
    """k trees per rank within ``units`` (per fabric arc) from the previous forest; None if repair gets stuck.

    ``checker``: the Phase 1 flow network of ``fabric`` (its arc capacities are overwritten).
    """
    return _Warm(forest, fabric, units, k, n_links, checker, latency_aware).run()


def _negate(key: tuple) -> tuple:
    return tuple(-value for value in key)


class _Partial:
    """One tree under repair: parent per rank (-1: orphan, the top of a hanging subtree), seed rows kept."""

    def __init__(self, n: int, root: int) -> None:
        self.root = root
        self.parent = np.full(n, -1, dtype=np.int64)
        self.rows = np.zeros(0, dtype=np.int64)  # the seed's forest rows
        self.heads = np.zeros(0, dtype=np.int64)
        self.keep = np.zeros(0, dtype=bool)  # which seed rows stay
        self.arcs = np.zeros(0, dtype=np.int64)  # the seed's route arcs, row by row
        self.owner = np.zeros(0, dtype=np.int64)  # the seed row of each of those arcs
        self.top = np.zeros(n, dtype=np.int64)
        self.dist = np.zeros(n, dtype=np.int64)
        self.depth = np.zeros(n, dtype=np.int64)
        self.reached = np.zeros(n, dtype=bool)
        self.added: list[tuple[int, int, list[int]]] = []
        self.left_root = False  # whether an edge out of the root is in place


class _Warm:
    def __init__(self, forest: Forest, fabric: Fabric, units: np.ndarray, k: int, n_links: int, checker: CutChecker,
                 latency_aware: bool) -> None:
        self.forest, self.fabric, self.k, self.latency_aware = forest, fabric, k, latency_aware
        self.checker = checker
        self.n = fabric.n_ranks
        self.n_arcs = fabric.n_arcs
        arc_of_link = np.full(max(n_links, int(forest.route_links.max(initial=-1)) + 1), -1, dtype=np.int64)
        arc_of_link[fabric.link] = np.arange(fabric.n_arcs)
        self.route_arcs = arc_of_link[forest.route_links]
        self.residual = units.astype(np.int64).copy()
        self.link_chunk = np.repeat(forest.row_chunk, forest.route_lengths)
        self.chunk_links = forest.route_offsets[forest.row_start]  # link range of each chunk
        self.log_steps = int(np.ceil(np.log2(max(self.n, 2)))) + 1
        by_head = np.argsort(fabric.head, kind="stable")
        cuts = np.searchsorted(fabric.head[by_head], np.arange(fabric.n_nodes + 1))
        self.into = [by_head[cuts[i]:cuts[i + 1]] for i in range(fabric.n_nodes)]  # in-arcs per node
        self.arc_tail = fabric.tail
        self._near_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.group_of = fabric.groups
        self.need_left = np.zeros(self.n, dtype=np.int64)  # per root, trees still to repair after the one in hand
        self.egress = np.zeros(self.n, dtype=np.int64)
        self.tight: list[np.ndarray] = []  # arcs entering each cut that keeping had to give trees back for
        self.tight_roots: list[np.ndarray] = []  # ranks inside each of those cuts

    # ---- keep ---------------------------------------------------------------------------------------

    def _load(self, chunks: np.ndarray) -> np.ndarray:
        """Units per arc that the routes of the chunks in the mask use."""
        mask = chunks[self.link_chunk]
        return np.bincount(self.route_arcs[mask], minlength=self.n_arcs)

    def _touching(self, chunks: np.ndarray, arcs: np.ndarray) -> np.ndarray:
        """Per chunk, how many of its route links (chunks in the mask only) lie on the arcs in the mask."""
        safe = np.maximum(self.route_arcs, 0)
        mask = chunks[self.link_chunk] & arcs[safe]
        return np.bincount(self.link_chunk[mask], minlength=self.forest.n_chunks)

    def _fits(self, chunk: int) -> bool:
        """Keep chunk whole if its routes fit the residual (and take them)."""
        arcs = self.route_arcs[self.chunk_links[chunk]:self.chunk_links[chunk + 1]]
        used, counts = np.unique(arcs, return_counts=True)
        if np.any(self.residual[used] < counts):
            return False
        self.residual[used] -= counts
        return True

    def keep(self) -> tuple[np.ndarray, list[list[int]]]:
        """Chunks kept whole (mask) and, per root, previous chunks to repair from (not kept, best first)."""
        forest, k, n = self.forest, self.k, self.n
        n_chunks = forest.n_chunks
        usable = forest.valid & (np.bincount(self.link_chunk[self.route_arcs < 0], minlength=n_chunks) == 0)
        touch_all = self._touching(usable, self._load(usable) > self.residual)
        order = np.lexsort((np.arange(n_chunks), touch_all, ~usable, forest.root))
        sorted_roots = forest.root[order]
        rank = np.arange(n_chunks) - np.searchsorted(sorted_roots, sorted_roots)
        candidate = np.zeros(n_chunks, dtype=bool)
        candidate[order] = usable[order] & (rank < k)
        touch = self._touching(candidate, self._load(candidate) > self.residual)
        kept = candidate & (touch == 0)
        self.residual -= self._load(kept)
        need = k - np.bincount(forest.root[kept], minlength=n)
        contested = np.flatnonzero(candidate & (touch > 0))
        others = order[usable[order] & (rank >= k)]
        tried: list[list[int]] = [[] for _ in range(n)]
        for chunk in [*contested[np.argsort(touch[contested], kind="stable")].tolist(), *others.tolist()]:
            root = int(forest.root[chunk])
            if need[root] == 0:
                continue
            if self._fits(chunk):
                kept[chunk] = True
                need[root] -= 1
            else:
                tried[root].append(chunk)
        return kept, tried

    def settle(self, kept: np.ndarray, tried: list[list[int]]) -> None:
        """Give back kept chunks that waste a cut the missing trees need (``kept``/``tried`` updated).

        The missing trees pack into the residual iff every rank v has ``maxflow(s*, v) >= Σ need``
        (switches stay balanced: a route enters and leaves a switch once). For a violated cut X,
        a kept chunk that enters X e times uses e of its units, where a tree of a root outside X
        needs only one (a root inside X: none); giving it back gains e - 1 (e). The biggest
        gains go first until the deficit is covered, then the check repeats (a few rounds).
        """
        forest, n = self.forest, self.n
        for _ in range(_SETTLE_ROUNDS):
            need = self.k - np.bincount(forest.root[kept], minlength=n)
            total = int(need.sum())
            if total == 0:
                return
            self.checker.set_arc_capacities(np.maximum(self.residual, 0))
            side = self.checker.violated_cut(need, total)
            if side is None:
                return
            self.tight.append(side[self.fabric.head] & ~side[self.fabric.tail])
            self.tight_roots.append(side[:n])
            entering = side[self.fabric.head] & ~side[self.fabric.tail]
            deficit = int(need[~side[:n]].sum()) - int(self.residual[entering].sum())
            entries = self._touching(kept, entering)
            gain = entries - (~side[forest.root]).astype(np.int64)
            order = np.flatnonzero(kept & (gain > 0))
            order = order[np.argsort(-gain[order], kind="stable")]
            back = order[np.cumsum(gain[order]) - gain[order] < max(deficit, 1)]
            if len(back) == 0:
                return
            kept[back] = False
            self.residual += self._load(np.isin(np.arange(forest.n_chunks), back))
            for chunk in back.tolist():
                tried[int(forest.root[chunk])].insert(0, chunk)

    # ---- repair -------------------------------------------------------------------------------------


    def _route_into(self, v: int, tree: _Partial) -> tuple[tuple, list[int]] | None:
        """The best route (priority, arcs from entry rank to v) from a reached rank to v through switches.

        Reverse BFS from v over switches only, arcs with room; the first layer that meets a reached
        rank decides. Priority: an entry rank with egress to spare (see :meth:`_spare`), then one of
        v's own host (an NVSwitch hop: a host cut is tight on HPN and a tree should cross it once),
        then the widest route, then the shallowest entry (latency-aware: shallowest before host and
        width). Each node's in-arcs are scanned with numpy.
        """
        near = self._near_route(v, tree)
        if near is not None:
            return near
        n, residual = self.n, self.residual
        frontier = [(v, 1 << 62)]
        toward: dict[int, int] = {}  # switch -> its arc on the way to v
        best: tuple | None = None
        while frontier:
            onward = []
            for node, width in frontier:
                arcs = self.into[node]
                room = residual[arcs]
                live = room > 0
                arcs, room = arcs[live], room[live]
                tails = self.arc_tail[arcs]
                ranks = tails < n
                onward.append((width, arcs[~ranks], room[~ranks], tails[~ranks]))
                mine = ranks.copy()
                mine[ranks] = tree.reached[tails[ranks]]
                if not mine.any():
                    continue
                arcs, tails = arcs[mine], tails[mine]
                keys = self._keys(v, tails, np.minimum(room[mine], width), tree)
                i = int(np.lexsort(keys[::-1])[-1])
                key = tuple(int(column[i]) for column in keys)
                if best is None or key > best[0]:
                    best = (key, int(arcs[i]))
            if best is not None:
                break
            frontier = []
            for width, arcs, room, tails in onward:
                for arc, tail, left in zip(arcs.tolist(), tails.tolist(), room.tolist(), strict=True):
                    if tail not in toward:
                        toward[tail] = arc
                        frontier.append((tail, min(left, width)))
        if best is None:
            return None
        route = [best[1]]
        node = self.heads[best[1]]
        while node != v:
            arc = toward[node]
            route.append(arc)
            node = self.heads[arc]
        return best[0], route

    def _extra_entries(self, root: int, arcs: np.ndarray, owner: np.ndarray, tail_depth: np.ndarray) -> np.ndarray:
        """Seed rows that enter a tight cut once more than the tree needs (per row, to be cut and re-attached).

        A tree of a root outside a cut X needs to enter X once, one of a root inside it never; every
        further entry spends a unit that another tree's only entry may need (keeping found X tight).
        """
        extra = np.zeros(len(tail_depth), dtype=bool)
        for entering, inside in zip(self.tight, self.tight_roots, strict=True):
            rows = np.unique(owner[entering[arcs]])
            if len(rows) == 0:
                continue
            if not inside[root]:
                rows = np.delete(rows, int(np.argmin(tail_depth[rows])))  # the shallowest entry stays
            extra[rows] = True
        return extra

    def _near(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        """The routes of one or two hops into rank v: first arcs and second arcs (-1 for a direct arc)."""
        cached = self._near_cache.get(v)
        if cached is None:
            firsts, seconds = [], []
            for arc in self.into[v].tolist():
                tail = self.tails[arc]
                if tail < self.n:
                    firsts.append(arc)
                    seconds.append(-1)
                    continue
                for first in self.into[tail].tolist():
                    if self.tails[first] < self.n and self.tails[first] != v:
                        firsts.append(first)
                        seconds.append(arc)
            cached = (np.array(firsts, dtype=np.int64), np.array(seconds, dtype=np.int64))
            self._near_cache[v] = cached
        return cached

    def _near_route(self, v: int, tree: _Partial) -> tuple[tuple, list[int]] | None:
        """:meth:`_route_into` restricted to one hop, then two (rank → switch → v): one numpy pass each."""
        firsts, seconds = self._near(v)
        if len(firsts) == 0:
            return None
        residual = self.residual
        room = residual[firsts]
        direct = seconds < 0
        room = np.where(direct, room, np.minimum(room, residual[np.maximum(seconds, 0)]))
        tails = self.arc_tail[firsts]
        usable = (room > 0) & tree.reached[tails]
        for hops in (direct, ~direct):  # fewest hops first, as the BFS
            pick = np.flatnonzero(usable & hops)
            if len(pick) == 0:
                continue
            keys = self._keys(v, tails[pick], room[pick], tree)
            i = int(np.lexsort(keys[::-1])[-1])
            chosen = int(pick[i])
            route = [int(firsts[chosen])] if seconds[chosen] < 0 else [int(firsts[chosen]), int(seconds[chosen])]
            return tuple(int(column[i]) for column in keys), route
        return None

    def _keys(self, v: int, tails: np.ndarray, narrow: np.ndarray, tree: _Partial) -> tuple[np.ndarray, ...]:
        """Priority columns of candidate routes into v (most significant first; see :meth:`_route_into`)."""
        group = int(self.group_of[v])
        home = (self.group_of[tails] == group) & (group >= 0)
        shallow = -tree.depth[tails]
        spare = self._spare(tails, tree)
        return (spare, shallow, home, narrow) if self.latency_aware else (spare, home, narrow, shallow)

    def _spare(self, ranks: np.ndarray, tree: _Partial) -> np.ndarray:
        """Per rank, whether it can send one more route out without starving its own trees still to repair.

        Every tree of root u leaves u once, through u's out-arcs; other trees relaying through u
        compete for them. The first edge out of the root of the tree being repaired is its own.
        """
        spare = self.egress[ranks] - 1 >= self.need_left[ranks]
        if not tree.left_root:
            spare |= ranks == tree.root
        return spare

    def _count_egress(self) -> None:
        """Residual units on each rank's out-arcs (kept up to date by :meth:`_attach`)."""
        self.egress = np.bincount(self.fabric.tail, weights=self.residual, minlength=self.fabric.n_nodes)[:self.n]
        self.egress = self.egress.astype(np.int64)

    def repair(self, seed: int | None, root: int) -> tuple[np.ndarray, list[tuple[int, int, list[int]]], np.ndarray] | None:
        """One tree of ``root`` from the previous tree ``seed`` (or from scratch): kept rows, new edges, depths."""
        forest, n = self.forest, self.n
        saved = self.residual.copy()
        tree = _Partial(n, root)
        if seed is not None:
            r0, r1 = int(forest.row_start[seed]), int(forest.row_start[seed + 1])
            tree.rows = np.arange(r0, r1)
            tails, tree.heads = forest.tail[r0:r1], forest.head[r0:r1]
            l0 = int(forest.route_offsets[r0])
            bounds = forest.route_offsets[r0:r1 + 1] - l0
            arcs = self.route_arcs[l0:int(forest.route_offsets[r1])]
            owner = np.repeat(np.arange(r1 - r0), np.diff(bounds))
            used, inverse, counts = np.unique(arcs, return_inverse=True, return_counts=True)
            short = self.residual[used] < counts
            contested = np.zeros(r1 - r0, dtype=bool)
            contested[owner[short[inverse]]] = True
            tree.keep = ~contested & ~self._extra_entries(root, arcs, owner, forest.depth[seed, tails])
            self.residual -= np.bincount(arcs[tree.keep[owner]], minlength=self.n_arcs)
            hard = np.flatnonzero(contested)
            for i in hard[np.argsort(forest.depth[seed, tails[hard]], kind="stable")].tolist():
                mine = arcs[bounds[i]:bounds[i + 1]]
                if len(np.unique(mine)) == len(mine) and np.all(self.residual[mine] >= 1):
                    self.residual[mine] -= 1
                    tree.keep[i] = True
            tree.parent[tree.heads[tree.keep]] = tails[tree.keep]
            tree.arcs, tree.owner = arcs, owner
        tree.left_root = bool(np.any(tree.parent == root))
        self._retop(tree)
        tree.depth = np.where(tree.top == root, tree.dist, 0)
        tree.reached = tree.top == root
        if not self._grow(tree):
            self.residual[:] = saved
            return None
        return tree.rows[tree.keep], tree.added, tree.depth

    def _grow(self, tree: _Partial) -> bool:
        """Attach every orphan (lazy Prim: best route first, re-checked when popped); whether all were."""
        groups = self.groups
        self._count_egress()
        pending = {v for v in np.flatnonzero(tree.parent < 0).tolist() if v != tree.root}
        heap: list[tuple[tuple, int]] = []
        waiting: list[int] = []
        dissolved: set[int] = set()
        at_home: set[int] = set()  # orphans whose queued route enters from their own host

        def evaluate(v: int) -> None:
            found = self._route_into(v, tree)
            if found is None:
                waiting.append(v)
            else:
                heapq.heappush(heap, (_negate(found[0]), v))
                if groups[v] >= 0 and groups[self.tails[found[1][0]]] == groups[v]:
                    at_home.add(v)

        for v in sorted(pending):
            evaluate(v)
        while pending:
            if not heap:
                again, waiting[:] = [v for v in waiting if v in pending], []
                for v in again:
                    evaluate(v)
                if heap:
                    continue
                stuck = sorted(v for v in pending if v not in dissolved)
                if not stuck:
                    return False
                freed = self._dissolve(tree, stuck)
                dissolved.update(stuck)
                dissolved.update(freed)
                pending.update(freed)
                waiting.clear()
                for v in sorted(pending):
                    evaluate(v)
                continue
            _, v = heapq.heappop(heap)
            if v not in pending:
                continue
            found = self._route_into(v, tree)
            if found is None:
                waiting.append(v)
                continue
            if heap and _negate(found[0]) > heap[0][0]:
                heapq.heappush(heap, (_negate(found[0]), v))  # worse than it was: let the next one go first
                continue
            members = self._attach(tree, v, found[1])
            pending.discard(v)
            touched = {groups[m] for m in members.tolist()} - {-1}
            for w in [w for w in pending if groups[w] in touched and w not in at_home]:
                evaluate(w)  # a host just reached: its other ranks may now enter through the NVSwitch
        return True

    def _dissolve(self, tree: _Partial, stuck: list[int]) -> list[int]:
        """Cut the in-host part of each stuck orphan's subtree into single ranks; their edges' units return."""
        groups = np.asarray(self.groups[:self.n])
        freed: list[int] = []
        for v in stuck:
            members = tree.top == v
            if groups[v] >= 0:
                members &= groups == groups[v]
            members[v] = False
            drop = tree.keep & members[tree.heads] if len(tree.heads) else tree.keep
            self.residual += np.bincount(tree.arcs[drop[tree.owner]], minlength=self.n_arcs)
            tree.keep &= ~drop
            tree.parent[members] = -1
            freed.extend(np.flatnonzero(members).tolist())
        self._retop(tree)
        self._count_egress()
        return freed

    def _attach(self, tree: _Partial, v: int, arcs: list[int]) -> np.ndarray:
        """Add the edge u → v along ``arcs``; the ranks of v's subtree join the root's component."""
        u = self.tails[arcs[0]]
        tree.parent[v] = u
        self.residual[arcs] -= 1
        self.egress[u] -= 1
        tree.left_root |= u == tree.root
        members = np.flatnonzero(tree.top == v)
        tree.depth[members] = tree.depth[u] + 1 + tree.dist[members]
        tree.top[members] = tree.root
        tree.reached[members] = True
        tree.added.append((u, v, arcs))
        return members

    def _scarce_first(self, need: np.ndarray) -> list[int]:
        """Roots with trees to repair, least residual egress per missing tree first.

        A root's own trees must leave it through its out-arcs, while every other tree may also
        relay through them: repaired late, a root with little egress left (a degraded NIC, a
        one-way link) finds it spent on relays. Its trees go first, then the rest route around.
        """
        egress = np.bincount(self.fabric.tail, weights=self.residual, minlength=self.fabric.n_nodes)[:self.n]
        roots = np.flatnonzero(need > 0)
        return roots[np.argsort(egress[roots] / need[roots], kind="stable")].tolist()

    def _retop(self, tree: _Partial) -> None:
        tree.top, tree.dist = self._tops(tree.parent, tree.root)

    def _tops(self, parent: np.ndarray, root: int) -> tuple[np.ndarray, np.ndarray]:
        """Per rank, the top of its subtree (root, or an orphan) and its distance to it (pointer doubling)."""
        ranks = np.arange(self.n)
        anc = np.where(parent < 0, ranks, parent)
        anc[root] = root
        dist = (anc != ranks).astype(np.int64)
        for _ in range(self.log_steps):
            dist = dist + dist[anc]
            anc = anc[anc]
        return anc, dist

    # ---- all together -------------------------------------------------------------------------------

    def run(self) -> WarmPacking | None:
        forest, k, n = self.forest, self.k, self.n
        self.tails = self.fabric.tail.tolist()
        self.heads = self.fabric.head.tolist()
        self.groups = self.fabric.groups.tolist()
        kept, tried = self.keep()
        self.settle(kept, tried)
        kept_ids = np.flatnonzero(kept)
        kept_roots = forest.root[kept_ids]
        depth = np.zeros((n * k, n), dtype=np.int32)
        slot = np.zeros(n, dtype=np.int64)  # trees placed per root
        chunk_of = np.empty(len(kept_ids), dtype=np.int64)
        for position, root in enumerate(kept_roots.tolist()):  # kept chunks first, in order, per root
            chunk_of[position] = root * k + slot[root]
            slot[root] += 1
        depth[chunk_of] = forest.depth[kept_ids]
        row_parts = [np.arange(forest.row_start[c], forest.row_start[c + 1]) for c in kept_ids.tolist()]
        chunk_parts = [np.full(len(part), chunk) for part, chunk in zip(row_parts, chunk_of.tolist(), strict=True)]
        new_tail: list[int] = []
        new_head: list[int] = []
        new_chunk: list[int] = []
        new_routes: list[list[int]] = []
        by_root: list[list[int]] = [[] for _ in range(n)]
        for chunk in kept_ids.tolist():
            by_root[int(forest.root[chunk])].append(chunk)
        repaired = 0
        self.need_left = (k - slot).astype(np.int64)
        for root in self._scarce_first(k - slot):
            missing = k - int(slot[root])
            seeds: list[int | None] = [*tried[root], *by_root[root]] or [None]
            for j in range(missing):
                self.need_left[root] -= 1
                seed = seeds[j % len(seeds)]
                fixed = self.repair(seed, root)
                if fixed is None and seed is not None:
                    fixed = self.repair(None, root)  # the previous tree misleads: grow this one from the root
                if fixed is None:
                    return None
                rows, added, tree_depth = fixed
                chunk = root * k + int(slot[root])
                slot[root] += 1
                repaired += 1
                row_parts.append(rows)
                chunk_parts.append(np.full(len(rows), chunk))
                depth[chunk] = tree_depth
                for u, v, arcs in added:
                    new_tail.append(u)
                    new_head.append(v)
                    new_chunk.append(chunk)
                    new_routes.append(self.fabric.link[arcs].tolist())
        rows = np.concatenate(row_parts) if row_parts else np.zeros(0, dtype=np.int64)
        row_chunk = np.concatenate(chunk_parts) if chunk_parts else np.zeros(0, dtype=np.int64)
        return WarmPacking(k, rows, row_chunk, np.array(new_tail, dtype=np.int64), np.array(new_head, dtype=np.int64),
                           np.array(new_chunk, dtype=np.int64), new_routes, depth, len(kept_ids), repaired)
