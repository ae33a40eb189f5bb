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
from mccl.synth.treepack.warmscan import arcs_of_links, chunk_load, chunk_touching, chunks_without_gaps, fit_chunks

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
        arc_of_link = np.full(self.n_links, -1, dtype=np.int64)
        arc_of_link[fabric.link] = np.arange(fabric.n_arcs)
        # -1: a link this fabric lacks (or holds at 0 Gbit/s); int32, one pass (5 M links at 512 GPUs)
        self.route_arcs = arcs_of_links(forest.route_links, arc_of_link)
        self.chunk_links = forest.route_offsets[forest.row_start]  # route-link range of each chunk

    def _load(self, chunks: np.ndarray) -> np.ndarray:
        """Units per arc that the routes of the chunks in the mask use (none of them on a missing link)."""
        return chunk_load(np.ascontiguousarray(chunks, dtype=np.bool_), self.chunk_links, self.route_arcs,
                          self.fabric.n_arcs)

    def _touching(self, chunks: np.ndarray, arcs: np.ndarray) -> np.ndarray:
        """Per chunk, how many of its route links (chunks in the mask only) lie on the arcs in the mask."""
        return chunk_touching(np.ascontiguousarray(chunks, dtype=np.bool_), np.ascontiguousarray(arcs, dtype=np.bool_),
                              self.chunk_links, self.route_arcs)

    def keep(self) -> tuple[np.ndarray, list[list[int]]]:
        """Chunks kept whole (mask) and, per root, previous chunks to repair from (not kept, best first)."""
        forest, k, n = self.forest, self.k, self.fabric.n_ranks
        n_chunks = forest.n_chunks
        usable = forest.valid & chunks_without_gaps(self.chunk_links, self.route_arcs)
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
        # One by one, while they fit (taken from the residual then); a root that has its k skips the rest.
        listed = np.concatenate([contested[np.argsort(touch[contested], kind="stable")], others]).astype(np.int64)
        outcome = fit_chunks(listed, np.ascontiguousarray(forest.root, dtype=np.int64), need, self.residual,
                             self.chunk_links, self.route_arcs)
        kept[listed[outcome == 1]] = True
        for chunk in listed[outcome == 2].tolist():
            tried[int(forest.root[chunk])].append(chunk)
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
