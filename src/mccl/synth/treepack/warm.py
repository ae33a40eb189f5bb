"""Warm start (ForestColl-warm, mccl-paper §4.3): what a previous schedule tells the next synthesis.

A previous AllGather schedule (or ReduceScatter, read as its reversed trees) on the
same ranks and links gives, per source rank, the rank-to-rank arcs its trees used;
Phase 3 tries those arcs first for that source (A*-like ordering: a known-good
arc before the capacity order). Its bottleneck cut, re-priced at the new
capacities, is a valid upper bound to start Phase 1 from, and its chunk count is
the first k the rounding tries. A previous schedule that does not fit the
topology (other links, other ranks, another collective) is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mccl.errors import InvalidSchedule, SynthesisError
from mccl.schedule import Collective, Schedule, validate
from mccl.synth.treepack.fabric import Fabric
from mccl.topology import Topology

__all__ = ["WarmHints", "warm_hints", "kept_fraction"]


@dataclass(frozen=True)
class WarmHints:
    """Per source rank, the arcs of its previous trees; cut node sets to try; the previous k."""

    arcs: tuple[frozenset[tuple[int, int]], ...]
    cut_sides: tuple[np.ndarray, ...]
    k: int | None


def warm_hints(previous: Schedule, topology: Topology, ranks: Sequence[str], collective: Collective,
               fabric: Fabric) -> WarmHints:
    """Hints from ``previous``; :class:`SynthesisError` naming why it cannot seed this synthesis."""
    if previous.collective is not collective:
        raise SynthesisError(f"the previous schedule is a {previous.collective.value}, not a {collective.value}; "
                             "it cannot seed this synthesis")
    if tuple(previous.ranks) != tuple(ranks):
        raise SynthesisError(f"the previous schedule has ranks {list(previous.ranks)[:4]}..., this synthesis "
                             f"{list(ranks)[:4]}...; a warm start needs the same ranks in the same order")
    try:
        validate(previous, topology)
    except InvalidSchedule as error:
        raise SynthesisError(f"the previous schedule does not fit topology {topology.name!r} "
                             f"(made for {previous.meta.topology!r}): {error}") from None
    n = len(ranks)
    transfers = previous.transfers
    if collective is Collective.ALLGATHER:
        roots = previous.chunks.source[transfers.chunk]
        tails, heads = transfers.sender, transfers.receiver
    else:  # ReduceScatter: trees reversed, rooted at the block's owner
        roots = previous.chunks.destination[transfers.chunk]
        tails, heads = transfers.receiver, transfers.sender
    arcs: list[set[tuple[int, int]]] = [set() for _ in range(n)]
    for root, tail, head in zip(roots.tolist(), tails.tolist(), heads.tolist(), strict=True):
        arcs[root].add((tail, head))
    side = np.zeros(fabric.n_nodes, dtype=bool)
    index = {name: i for i, name in enumerate(fabric.names)}
    for cut_link in previous.meta.bottleneck_cut:
        link = topology.links[cut_link.link]
        node = link.src if collective is Collective.REDUCESCATTER else link.dst
        if node in index:
            side[index[node]] = True
    sides = (side,) if side[:n].any() and not side[:n].all() else ()
    counts = np.bincount(previous.block_of_chunks(), minlength=n)
    k = int(counts[0]) if np.all(counts == counts[0]) else None
    return WarmHints(tuple(frozenset(a) for a in arcs), sides, k)


def kept_fraction(hints: WarmHints, trees: Sequence) -> float:
    """Share of the new trees' arcs (weighted by multiplicity) that the previous trees of the same source used."""
    used = sum(tree.multiplicity * len(tree.edges) for tree in trees)
    kept = sum(tree.multiplicity * sum((e in hints.arcs[tree.root]) for e in tree.edges) for tree in trees)
    return kept / used if used else 0.0
