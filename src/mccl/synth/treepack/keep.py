"""Warm Phase 2, first half: keep the previous trees that still fit (ForestColl-warm, mccl-paper §4.3).

A schedule is valid at rate x with k trees per rank when every fabric arc carries at
most its integer capacity ``floor(C_e · k / x)`` (units, :mod:`.rounding`) of tree
edges' routes. Per root at most k previous chunks are candidates, those touching no
over-full arc first; the candidates that together touch no over-full arc are kept at
once (numpy over all routes), the rest one by one while they fit.

Then :meth:`Keeper.settle` checks that the trees still missing can be packed into what
is left: with switches balanced (a route enters and leaves a switch once) that holds iff
every rank v has ``maxflow(s*, v) >= Σ need`` (s* → r of capacity need[r]; n max-flows
on the Phase 1 network). A kept tree may enter a violated cut X more often than needed
(once for a root outside X, never for one inside): such trees are given back, the
biggest waste first, and the check repeats. The cuts found are "tight": :mod:`.regrow`
keeps a repaired tree from entering them more than once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mccl.synth.cutbound import CutChecker
from mccl.synth.treepack.cutproof import violated_cut
from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.forest import Forest

__all__ = ["Keeper", "TightCut"]

_SETTLE_ROUNDS = 8  # cut checks (n max-flows each) after keeping, giving back wasteful kept chunks


@dataclass(frozen=True)
class TightCut:
    """A cut the missing trees needed: arcs entering its sink side X, and the ranks inside X."""

    entering: np.ndarray  # bool per fabric arc
    inside: np.ndarray  # bool per rank


@dataclass
class Keeper:
    """The previous forest's routes on fabric arcs, and the residual units (updated in place)."""

    forest: Forest
    fabric: Fabric
    residual: np.ndarray  # int64 per fabric arc
    k: int
    n_links: int
    tight: list[TightCut] = field(default_factory=list)

    def __post_init__(self) -> None:
        forest, fabric = self.forest, self.fabric
        arc_of_link = np.full(max(self.n_links, int(forest.route_links.max(initial=-1)) + 1), -1, dtype=np.int64)
        arc_of_link[fabric.link] = np.arange(fabric.n_arcs)
        self.route_arcs = arc_of_link[forest.route_links]  # -1: a link this fabric lacks (or holds at 0 Gbit/s)
        self.safe_arcs = np.maximum(self.route_arcs, 0)  # the same, -1 read as arc 0 (masked out by callers)
        self.link_chunk = np.repeat(forest.row_chunk, forest.route_lengths)
        self.chunk_links = forest.route_offsets[forest.row_start]  # route-link range of each chunk

    def _load(self, chunks: np.ndarray) -> np.ndarray:
        """Units per arc that the routes of the chunks in the mask use."""
        mask = chunks[self.link_chunk]
        return np.bincount(self.route_arcs[mask], minlength=self.fabric.n_arcs)

    def _touching(self, chunks: np.ndarray, arcs: np.ndarray) -> np.ndarray:
        """Per chunk, how many of its route links (chunks in the mask only) lie on the arcs in the mask."""
        mask = chunks[self.link_chunk] & arcs[self.safe_arcs]
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
        forest, k, n = self.forest, self.k, self.fabric.n_ranks
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

    def settle(self, kept: np.ndarray, tried: list[list[int]], checker: CutChecker) -> None:
        """Give back kept chunks that waste a cut the missing trees need (``kept``/``tried`` updated).

        The missing trees pack into the residual iff every rank v has ``maxflow(s*, v) >= Σ need``
        (switches stay balanced: a route enters and leaves a switch once). For a violated cut X,
        a kept chunk that enters X e times uses e of its units, where a tree of a root outside X
        needs only one (a root inside X: none); giving it back gains e - 1 (e). The biggest
        gains go first until the deficit is covered, then the check repeats (a few rounds).
        """
        forest, n = self.forest, self.fabric.n_ranks
        for _ in range(_SETTLE_ROUNDS):
            need = self.k - np.bincount(forest.root[kept], minlength=n)
            total = int(need.sum())
            if total == 0:
                return
            side = violated_cut(checker, np.maximum(self.residual, 0), need, total)
            if side is None:
                return
            entering = side[self.fabric.head] & ~side[self.fabric.tail]
            self.tight.append(TightCut(entering, side[:n].copy()))
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
