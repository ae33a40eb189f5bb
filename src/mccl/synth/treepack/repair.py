"""Warm Phases 2 and 3 (ForestColl-warm, mccl-paper §4.3): keep the previous trees that fit, repair the rest.

A schedule is valid at rate x with k trees per rank when every fabric arc carries at
most its integer capacity ``floor(C_e · k / x)`` of tree edges' routes (units, from
:mod:`.rounding`). The cold path gets there through switch removal and packing on
the logical graph; a warm start already holds trees that did that on a fabric that
differs in a few links, so it works on their physical routes directly:

1. :mod:`.keep` keeps, per root, up to k previous trees that still fit, and gives back
   those that waste a cut the missing trees need (checked by max-flow);
2. :mod:`.regrow` repairs each missing tree from a previous one of the same root:
   edges that fit stay, the others are cut and their subtrees re-attached by new
   routes through switches. Roots with the least egress left go first.

Every edge kept or added fits the residual capacity when it is placed, so the result
is a valid packing of k trees per rank at the rounded rate x: the same throughput as a
cold synthesis at that k (cold may lose more on unbalanced switches, see
:mod:`.balance`; never less). When a tree cannot be repaired the caller packs cold.
Cost: O(routes) numpy, n max-flows per settling round, and per repaired tree O(n)
numpy plus one small route search per cut edge — no switch removal, no tree packing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mccl.synth.cutbound import CutChecker
from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.forest import Forest, segments
from mccl.synth.treepack.keep import Keeper
from mccl.synth.treepack.regrow import Regrower
from mccl.synth.treepack.regrowkernel import repair_tree

__all__ = ["WarmPacking", "warm_pack"]

_MAX_GROWN = 256  # extra trees (beyond the previous forest's) above which the repair is not tried


@dataclass(frozen=True)
class WarmPacking:
    """k trees per rank: forest rows kept (with their new chunk) plus new edges; depths per new chunk."""

    k: int
    rows: np.ndarray  # forest rows kept
    row_chunk: np.ndarray  # new chunk id of each kept row
    new_tail: np.ndarray
    new_head: np.ndarray
    new_chunk: np.ndarray
    new_route_offsets: np.ndarray  # int64, new edges + 1: CSR over ``new_route_links``
    new_route_links: np.ndarray  # int64 physical link ids, AllGather direction
    depth: np.ndarray  # (n·k) × n
    kept_chunks: int  # previous chunks kept whole
    repaired_chunks: int


def warm_pack(forest: Forest, fabric: Fabric, units: np.ndarray, k: int, n_links: int, checker: CutChecker, *,
              latency_aware: bool = False, compiled: bool = True) -> WarmPacking | None:
    """k trees per rank within ``units`` (per fabric arc) from the previous forest; None if repair gets stuck
    or would have to grow more trees than the previous forest has.

    ``checker``: the Phase 1 flow network of ``fabric`` (its arc capacities are overwritten).
    ``compiled``: repair trees with :func:`.regrowkernel.repair_tree` (False: the Python
    :class:`.regrow.Regrower`, the reference; both give the same trees).
    """
    n = fabric.n_ranks
    if k * n - forest.n_chunks > _MAX_GROWN:
        # More trees per rank than the previous schedule has (typically on the way back to healthy, where
        # the rounding picks a larger k): every extra tree is grown one by one from a copy, which past a
        # few hundred costs more than the cold packing (128 GPUs, k 6 -> 9: 1.0 s, then stuck, vs 0.6 s).
        return None
    keeper = Keeper(forest, fabric, units.astype(np.int64).copy(), k, n_links)
    kept, tried = keeper.keep()
    keeper.settle(kept, tried, checker)
    kept_ids = np.flatnonzero(kept)
    depth = np.zeros((n * k, n), dtype=np.int32)
    slot = np.zeros(n, dtype=np.int64)  # trees placed per root
    chunk_of = np.empty(len(kept_ids), dtype=np.int64)
    by_root: list[list[int]] = [[] for _ in range(n)]
    for position, (chunk, root) in enumerate(zip(kept_ids.tolist(), forest.root[kept_ids].tolist(), strict=True)):
        chunk_of[position] = root * k + slot[root]  # kept chunks first, per root
        slot[root] += 1
        by_root[root].append(chunk)
    depth[chunk_of] = forest.depth[kept_ids]
    counts = forest.row_start[kept_ids + 1] - forest.row_start[kept_ids]
    row_parts = [segments(np.arange(len(forest.tail)), forest.row_start[kept_ids], counts)]
    chunk_parts = [np.repeat(chunk_of, counts)]
    tail_parts: list[np.ndarray] = []
    head_parts: list[np.ndarray] = []
    new_chunk: list[np.ndarray] = []
    length_parts: list[np.ndarray] = []
    arc_parts: list[np.ndarray] = []
    need_left = (k - slot).astype(np.int64)
    repair = _compiled_repair(keeper, latency_aware, need_left) if compiled else _python_repair(
        keeper, latency_aware, need_left)
    repaired = 0
    for root in _scarce_first(keeper, k - slot):
        seeds: list[int | None] = [*tried[root], *by_root[root]] or [None]
        for j in range(k - int(slot[root])):
            need_left[root] -= 1
            seed = seeds[j % len(seeds)]
            fixed = repair(seed, root)
            if fixed is None and seed is not None:
                fixed = repair(None, root)  # the previous tree misleads: grow this one from the root
            if fixed is None:
                return None
            rows, added_tail, added_head, route_offsets, route_arcs, tree_depth = fixed
            chunk = root * k + int(slot[root])
            slot[root] += 1
            repaired += 1
            row_parts.append(rows)
            chunk_parts.append(np.full(len(rows), chunk))
            depth[chunk] = tree_depth
            tail_parts.append(added_tail)
            head_parts.append(added_head)
            new_chunk.append(np.full(len(added_tail), chunk, dtype=np.int64))
            length_parts.append(np.diff(route_offsets))
            arc_parts.append(route_arcs)
    empty = np.zeros(0, dtype=np.int64)
    lengths = np.concatenate([empty, *length_parts])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    links = fabric.link[np.concatenate([empty, *arc_parts])].astype(np.int64)
    return WarmPacking(k, np.concatenate(row_parts), np.concatenate(chunk_parts), np.concatenate([empty, *tail_parts]),
                       np.concatenate([empty, *head_parts]), np.concatenate([empty, *new_chunk]), offsets, links,
                       depth, len(kept_ids), repaired)


_Repaired = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _python_repair(keeper: Keeper, latency_aware: bool, need_left: np.ndarray
                   ) -> Callable[[int | None, int], _Repaired | None]:
    """The reference repair (:class:`.regrow.Regrower`), its result in the compiled one's flat form."""
    regrower = Regrower(keeper, latency_aware)
    regrower.need_left = need_left

    def repair(seed: int | None, root: int) -> _Repaired | None:
        fixed = regrower.repair(seed, root)
        if fixed is None:
            return None
        rows, added, tree_depth = fixed
        lengths = np.array([len(arcs) for _, _, arcs in added], dtype=np.int64)
        offsets = np.zeros(len(added) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        arcs = np.array([arc for _, _, route in added for arc in route], dtype=np.int64)
        return (rows, np.array([u for u, _, _ in added], dtype=np.int64),
                np.array([v for _, v, _ in added], dtype=np.int64), offsets, arcs, tree_depth)

    return repair


def _compiled_repair(keeper: Keeper, latency_aware: bool, need_left: np.ndarray
                     ) -> Callable[[int | None, int], _Repaired | None]:
    """:func:`.regrowkernel.repair_tree` over the keeper's arrays (residual and ``need_left`` shared)."""
    fabric, forest = keeper.fabric, keeper.forest
    arc_tail = np.ascontiguousarray(fabric.tail, dtype=np.int64)
    arc_head = np.ascontiguousarray(fabric.head, dtype=np.int64)
    into_arcs = np.argsort(arc_head, kind="stable").astype(np.int64)
    into_start = np.searchsorted(arc_head[into_arcs], np.arange(fabric.n_nodes + 1)).astype(np.int64)
    group = np.ascontiguousarray(fabric.groups, dtype=np.int64)
    n = fabric.n_ranks
    if keeper.tight:
        entering = np.stack([cut.entering for cut in keeper.tight]).astype(np.bool_)
        inside = np.stack([cut.inside for cut in keeper.tight]).astype(np.bool_)
    else:
        entering = np.zeros((0, fabric.n_arcs), dtype=np.bool_)
        inside = np.zeros((0, n), dtype=np.bool_)
    route_arcs = keeper.route_arcs  # int32, one per route link of the forest
    seed_depth = np.ascontiguousarray(forest.depth)
    residual = keeper.residual

    def repair(seed: int | None, root: int) -> _Repaired | None:
        ok, rows, tails, heads, offsets, arcs, tree_depth = repair_tree(
            -1 if seed is None else seed, root, n, residual, need_left, into_start, into_arcs, arc_tail, arc_head,
            group, latency_aware, entering, inside, forest.row_start, forest.tail, forest.head,
            forest.route_offsets, route_arcs, seed_depth)
        return (rows, tails, heads, offsets, arcs, tree_depth) if ok else None

    return repair


def _scarce_first(keeper: Keeper, need: np.ndarray) -> list[int]:
    """Roots with trees to repair, least residual egress per missing tree first.

    A root's own trees must leave it through its out-arcs, while every other tree may also
    relay through them: repaired late, a root with little egress left (a degraded NIC, a
    one-way link) finds it spent on relays. Its trees go first, then the rest route around.
    """
    fabric = keeper.fabric
    egress = np.bincount(fabric.tail, weights=keeper.residual, minlength=fabric.n_nodes)[:fabric.n_ranks]
    roots = np.flatnonzero(need > 0)
    return roots[np.argsort(egress[roots] / need[roots], kind="stable")].tolist()
