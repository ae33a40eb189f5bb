"""Warm start (ForestColl-warm, mccl-paper §4.3): what a previous schedule tells the next synthesis.

A previous AllGather schedule (or ReduceScatter, read as its reversed trees) on the
same ranks and links is checked to fit (same collective, ranks and links); its
bottleneck cut, re-priced at the new capacities, is a valid upper bound to start
Phase 1 from, and its chunk count is the first k the rounding tries. Its trees
(:mod:`.forest`) are kept or repaired by :mod:`.repair`; when that gets stuck the
cold packer runs with, per source rank, the rank-to-rank arcs its previous trees used
tried first (A*-like ordering: a known-good arc before the capacity order). A
previous schedule that does not fit the topology is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

import numpy as np

from mccl.errors import SynthesisError
from mccl.schedule import Collective, Schedule
from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.forest import Forest, readonly
from mccl.synth.treepack.tree import Tree
from mccl.synth.treepack.warmscan import MISFIT_REASONS, edges_seen_before, route_misfit
from mccl.topology import Topology, fabric_view

__all__ = ["WarmHints", "warm_hints", "preferred_arcs", "kept_fraction", "kept_fraction_of_rows"]


@dataclass(frozen=True)
class WarmHints:
    """Cut node sets to try as Phase 1 upper bounds; the previous k (None if sources differ)."""

    cut_sides: tuple[np.ndarray, ...]
    k: int | None


def warm_hints(previous: Schedule, topology: Topology, ranks: Sequence[str], collective: Collective,
               fabric: Fabric) -> WarmHints:
    """Hints from ``previous``; :class:`SynthesisError` naming why it cannot seed this synthesis."""
    if previous.collective is not collective:
        raise SynthesisError(f"the previous schedule is for {previous.collective.value}, not {collective.value}; "
                             "it cannot seed this synthesis")
    if tuple(previous.ranks) != tuple(ranks):
        raise SynthesisError(f"the previous schedule has ranks {list(previous.ranks)[:4]}..., this synthesis "
                             f"{list(ranks)[:4]}...; a warm start needs the same ranks in the same order")
    problem = _misfit(previous, topology)
    if problem:
        raise SynthesisError(f"the previous schedule does not fit topology {topology.name!r} "
                             f"(made for {previous.meta.topology!r}): {problem}")
    n = len(ranks)
    side = np.zeros(fabric.n_nodes, dtype=bool)
    # The sink side of the previous cut: the nodes its links enter in ``fabric``'s topology (for
    # ReduceScatter the reversed one, where a link enters what it left in ``topology``).
    entered = fabric.link_dst[np.array([cut_link.link for cut_link in previous.meta.bottleneck_cut], dtype=np.int64)]
    side[entered[entered < fabric.n_nodes]] = True
    sides = (side,) if side[:n].any() and not side[:n].all() else ()
    counts = np.bincount(previous.block_of_chunks(), minlength=n)
    k = int(counts[0]) if np.all(counts == counts[0]) else None
    return WarmHints(sides, k)


def _misfit(previous: Schedule, topology: Topology) -> str | None:
    """Why the previous schedule's routes are not routes of ``topology`` (None if they are).

    The previous schedule was validated when it was made; here only its fit to the new fabric
    matters (same links between the same nodes), checked with numpy instead of a full replay.
    """
    transfers = previous.transfers
    if len(transfers.route_links) == 0:
        return MISFIT_REASONS[1]
    view = fabric_view(topology, previous.ranks)  # rank r at position r: route ends compare with ranks directly
    columns = (transfers.route_links, transfers.route_offsets, transfers.sender, transfers.receiver)
    return MISFIT_REASONS[route_misfit(*map(readonly, columns), np.ascontiguousarray(view.link_src, dtype=np.int64),
                                       np.ascontiguousarray(view.link_dst, dtype=np.int64), view.n_ranks,
                                       view.n_nodes)]


def preferred_arcs(forest: Forest) -> list[frozenset[tuple[int, int]]]:
    """Per root, the rank-to-rank arcs its previous trees used (the cold packer's warm ordering)."""
    order = np.argsort(forest.root[forest.row_chunk], kind="stable")
    roots = forest.root[forest.row_chunk][order]
    bounds = np.searchsorted(roots, np.arange(forest.n + 1))
    tails, heads = forest.tail[order].tolist(), forest.head[order].tolist()
    return [frozenset(zip(tails[a:b], heads[a:b], strict=True)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def kept_fraction(arcs: Sequence[Set[tuple[int, int]]], trees: Sequence[Tree]) -> float:
    """Share of the new trees' arcs (weighted by multiplicity) that the previous trees of the same source used."""
    used = sum(tree.multiplicity * len(tree.edges) for tree in trees)
    kept = sum(tree.multiplicity * sum((e in arcs[tree.root]) for e in tree.edges) for tree in trees)
    return kept / used if used else 0.0


def kept_fraction_of_rows(forest: Forest, kept_rows: int, new_root: np.ndarray, new_tail: np.ndarray,
                          new_head: np.ndarray) -> float:
    """Share of a warm packing's tree edges that the previous trees of the same source used.

    Kept rows are previous edges of that source by construction; new edges are looked up among
    the previous edges of their source (only the sources that got new edges are indexed).
    """
    total = kept_rows + len(new_root)
    if total == 0:
        return 0.0
    if len(new_root) == 0:
        return 1.0
    n = forest.n
    roots = np.asarray(forest.root, dtype=np.int64)
    ranked = np.flatnonzero((roots >= 0) & (roots < n))
    chunks_of_root = ranked[np.argsort(roots[ranked], kind="stable")].astype(np.int64)
    root_start = np.searchsorted(roots[chunks_of_root], np.arange(n + 1)).astype(np.int64)
    seen = edges_seen_before(n, root_start, chunks_of_root, forest.row_start, forest.tail, forest.head,
                             *(np.ascontiguousarray(a, dtype=np.int64) for a in (new_root, new_tail, new_head)))
    return (kept_rows + seen) / total
