"""Phase 2's working graph: arcs with their route pools while switches are split off (:mod:`.switch_removal`).

Each arc ``(u, v)`` holds a pool of physical routes with the units on each; splitting
``u → w → t`` by γ takes γ units from the pools of ``u → w`` and ``w → t`` and pairs them
into routes of ``u → t``. Which routes a split takes does not change the logical graph,
only the routes (:mod:`.straighten` shortens them afterwards). The careful mode's
switch balancing (drain into s*, trimming out-excess while :func:`~.packcheck.packing_ok`
holds) lives here because it edits the pools.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.packcheck import packing_ok

__all__ = ["Path", "Pool", "SplitGraph"]

Path = tuple[int, ...]  # physical link ids
Pool = dict[Path, int]  # route -> units, in order of arrival


def _take(pool: Pool, amount: int) -> list[tuple[Path, int]]:
    """Remove ``amount`` units from a pool of routes (latest first: O(1) per piece); return the pieces.

    Which routes a split takes does not change the logical graph, only the routes, and
    :mod:`.straighten` shortens those afterwards.
    """
    pieces = []
    while amount > 0:
        path, units = pool.popitem()
        used = min(units, amount)
        pieces.append((path, used))
        amount -= used
        if units > used:
            pool[path] = units - used
    return pieces


def _pair_pieces(left: list[tuple[Path, int]], right: list[tuple[Path, int]]) -> list[tuple[Path, int]]:
    """Concatenate route pieces of two equal-size piece lists unit-wise."""
    out: dict[Path, int] = defaultdict(int)
    i = j = 0
    left = [list(p) for p in left]
    right = [list(p) for p in right]
    while i < len(left) and j < len(right):
        used = min(left[i][1], right[j][1])
        out[left[i][0] + right[j][0]] += used
        left[i][1] -= used
        right[j][1] -= used
        i += left[i][1] == 0
        j += right[j][1] == 0
    return list(out.items())


Key = tuple[int, int]
Snapshot = dict[Key, tuple[Pool, int] | None]


class SplitGraph:
    """Mutable multigraph of arcs with route pools (and their unit totals) during splitting."""

    def __init__(self, fabric: Fabric, units: np.ndarray) -> None:
        self.n_ranks = fabric.n_ranks
        self.n_nodes = fabric.n_nodes
        self.pools: dict[Key, Pool] = {}
        self.total: dict[Key, int] = {}
        for arc in np.flatnonzero(units > 0):
            self._put((int(fabric.tail[arc]), int(fabric.head[arc])), [((int(fabric.link[arc]),), int(units[arc]))])
        self._index()

    def _index(self) -> None:
        self.out: dict[int, set[int]] = defaultdict(set)
        self.inn: dict[int, set[int]] = defaultdict(set)
        for u, v in self.pools:
            self.out[u].add(v)
            self.inn[v].add(u)

    def _put(self, key: Key, pieces: list[tuple[Path, int]]) -> None:
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = {}
            self.total[key] = 0
        for path, units in pieces:
            pool[path] = pool.get(path, 0) + units
            self.total[key] += units

    def snapshot(self, keys: list[Key] | None = None) -> Snapshot:
        """A copy of the given arcs (all if None), to :meth:`restore` after a trial split."""
        keys = list(self.pools) if keys is None else keys
        return {key: (dict(self.pools[key]), self.total[key]) if key in self.pools else None for key in keys}

    def restore(self, saved: Snapshot, *, everything: bool = False) -> None:
        if everything:
            self.pools, self.total = {}, {}
        for key, value in saved.items():
            if value is None:
                self.pools.pop(key, None)
                self.total.pop(key, None)
            else:
                self.pools[key], self.total[key] = dict(value[0]), value[1]
        if everything:
            self._index()
            return
        for key in saved:
            if key in self.pools:
                self.out[key[0]].add(key[1])
                self.inn[key[1]].add(key[0])
            else:
                self.out[key[0]].discard(key[1])
                self.inn[key[1]].discard(key[0])

    def drain_excess(self) -> None:
        """Balance every switch with more units in than out by an arc to the super-source s* (node ``n_nodes``).

        Arcs into s* carry no flow from s*, so the cut condition is unchanged; the switch is then
        Eulerian and the splitting theorem applies to it. Splitting ``u → w → s*`` gives ``u → s*``:
        the part of u's capacity that w could never forward, dropped at the end.
        """
        balance: dict[int, int] = defaultdict(int)
        for (u, v), units in self.total.items():
            balance[v] += units
            balance[u] -= units
        for w in range(self.n_ranks, self.n_nodes):
            if balance[w] > 0:
                self.add((w, self.n_nodes), [((), balance[w])])

    def trim_out_excess(self, k: int | np.ndarray) -> None:
        """Lower the out-arcs of switches that send out more units than they take in, keeping the cut condition.

        A switch forwards at most what it takes in, so that excess is unusable; but the splitting
        theorem needs the switch balanced, and which out-arcs lose it matters to the cut condition.
        Per out-arc (largest first), the most units whose removal keeps ``packing_ok`` (binary search).
        What cannot be trimmed stays; the split then may keep fewer trees (and shows as loss).
        """
        for _ in range(3):  # trimming into a switch lowers its in-side: a few passes settle it
            changed = False
            for w in range(self.n_ranks, self.n_nodes):
                excess = sum(self.units((w, t)) for t in self.out[w]) - sum(self.units((u, w)) for u in self.inn[w])
                for t in sorted(self.out[w], key=lambda t, w=w: (-self.units((w, t)), t)):
                    if excess <= 0:
                        break
                    cut = self._largest_keeping(lambda amount, key=(w, t): self._without(key, amount),
                                                min(excess, self.units((w, t))), k)
                    if cut > 0:
                        self.remove((w, t), cut)
                        excess -= cut
                        changed = True
            if not changed:
                break

    def _without(self, key: Key, amount: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tail, head, caps = self.arrays()
        caps = caps.copy()
        caps[(tail == key[0]) & (head == key[1])] -= amount
        return tail, head, caps

    def _largest_keeping(self, arrays_for, high: int, k: int | np.ndarray) -> int:
        """The largest amount <= high whose ``arrays_for(amount)`` graph still passes ``packing_ok``."""
        low = 0
        while low < high:
            mid = (low + high + 1) // 2
            if packing_ok(self.n_nodes, self.n_ranks, *arrays_for(mid), k):
                low = mid
            else:
                high = mid - 1
        return low

    def _forget_if_empty(self, key: Key) -> None:
        if not self.pools[key]:
            del self.pools[key]
            del self.total[key]
            self.out[key[0]].discard(key[1])
            self.inn[key[1]].discard(key[0])

    def _take_from(self, key: Key, amount: int) -> list[tuple[Path, int]]:
        pieces = _take(self.pools[key], amount)
        self.total[key] -= amount
        self._forget_if_empty(key)
        return pieces

    def remove(self, key: Key, amount: int) -> None:
        self._take_from(key, amount)

    def rank_pools(self) -> dict[Key, Pool]:
        """The arcs between nodes of the fabric (without the drained excess into s*)."""
        return {key: pool for key, pool in self.pools.items() if key[1] < self.n_nodes}

    def units(self, key: Key) -> int:
        return self.total.get(key, 0)

    def add(self, key: Key, pieces: list[tuple[Path, int]]) -> None:
        self._put(key, pieces)
        self.out[key[0]].add(key[1])
        self.inn[key[1]].add(key[0])

    def split(self, u: int, w: int, t: int, amount: int) -> None:
        left = self._take_from((u, w), amount)
        right = self._take_from((w, t), amount)
        self.add((u, t), _pair_pieces(left, right))

    def drop_switch(self, w: int) -> None:
        for u in list(self.inn[w]):
            self.pools.pop((u, w), None)
            self.total.pop((u, w), None)
            self.out[u].discard(w)
        for t in list(self.out[w]):
            self.pools.pop((w, t), None)
            self.total.pop((w, t), None)
            self.inn[t].discard(w)
        self.inn.pop(w, None)
        self.out.pop(w, None)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keys = list(self.total)
        tail = np.array([u for u, _ in keys], dtype=np.int64)
        head = np.array([v for _, v in keys], dtype=np.int64)
        caps = np.array([self.total[key] for key in keys], dtype=np.int64)
        return tail, head, caps
