"""Warm Phase 3: repair one tree on its physical routes (ForestColl-warm, mccl-paper §4.3).

A tree still missing after :mod:`.keep` starts from a previous tree of the same root
that was not kept (else a copy of a kept one, else the root alone): its edges whose
routes touch no arc short of capacity stay, except further entries into a tight cut
(:class:`~.keep.TightCut`); of the others, parents first, those that still fit stay.
Every other edge is cut, leaving subtrees hanging from orphan ranks.

Orphans are attached lazily, best first (a heap, each route re-checked when popped): a
reverse BFS from the orphan through switches only (fewest hops first: one and two hops
from a per-rank table, then the general search), over arcs with room, to a rank already
reached. Priority: the entry rank can spare the egress (its own trees still to repair
each need one unit of it), then it lies in the orphan's host (an NVSwitch hop: a host
cut is tight on HPN and a tree should cross it once), then the widest route, then the
shallowest entry (latency-aware: shallowest before host and width). An orphan that no
route reaches gets the in-host part of its subtree dissolved into single ranks (their
edges' units return) once; a tree that still cannot be completed is given up.

Every edge kept or added fits the residual when placed, so a completed tree never
overloads an arc. Cost per tree: O(n) numpy plus one route search per cut edge.
"""

from __future__ import annotations

import heapq

import numpy as np

from mccl.synth.treepack.keep import Keeper

__all__ = ["Regrower"]


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


class Regrower:
    """Repairs trees one at a time in the keeper's residual (updated in place)."""

    def __init__(self, keeper: Keeper, latency_aware: bool) -> None:
        fabric = keeper.fabric
        self.keeper, self.forest, self.fabric = keeper, keeper.forest, fabric
        self.residual = keeper.residual
        self.route_arcs = keeper.route_arcs
        self.latency_aware = latency_aware
        self.n = fabric.n_ranks
        self.n_arcs = fabric.n_arcs
        self.log_steps = int(np.ceil(np.log2(max(self.n, 2)))) + 1
        by_head = np.argsort(fabric.head, kind="stable")
        cuts = np.searchsorted(fabric.head[by_head], np.arange(fabric.n_nodes + 1))
        self.into = [by_head[cuts[i]:cuts[i + 1]] for i in range(fabric.n_nodes)]  # in-arcs per node
        self.arc_tail = fabric.tail
        self.tails = fabric.tail.tolist()
        self.heads = fabric.head.tolist()
        self.groups = fabric.groups.tolist()
        self.group_of = fabric.groups
        self._near_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.need_left = np.zeros(self.n, dtype=np.int64)  # per root, trees still to repair after the one in hand
        self.egress = np.zeros(self.n, dtype=np.int64)

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
        for cut in self.keeper.tight:
            rows = np.unique(owner[cut.entering[arcs]])
            if len(rows) == 0:
                continue
            if not cut.inside[root]:
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
