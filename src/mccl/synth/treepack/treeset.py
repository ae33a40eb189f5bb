"""Phase 3's trees as arrays, and their lowering to a schedule with numpy (no Python loop per transfer).

A :class:`TreeSet` holds every group of identical trees the packing made: its root, its
multiplicity, its logical arcs in the order added (``groups × (n - 1)``) and the depth of
every rank in it (``groups × n``). At 2048 GPUs that is ~8,000 groups and 16 million tree
edges, 42 million transfers once expanded by multiplicity: as Python objects (the former
``Tree`` lists and per-edge ``list.extend``) that alone took minutes and gigabytes.

Lowering (mccl-paper §4.1, as :mod:`.pipeline` describes): tree edge ``u → v`` of the group
carrying chunks ``first … first + m - 1`` becomes m transfers at step depth(u) (ReduceScatter:
``v → u`` at ``D - depth(v)``), each along one physical route of the logical arc. A logical arc's
units are handed out in order, groups sorted by root (stable, packing order within a root),
edges in the order added: the unit a transfer takes is its rank among the transfers on that arc
in that order, and the route is the one whose cumulative units first exceed it.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

import numpy as np

from mccl.errors import SynthesisError
from mccl.schedule import Chunks, Collective, Schedule, TransferOp, Transfers
from mccl.synth.treepack.forest import segments

__all__ = ["TreeSet", "RouteTable", "lower_trees", "route_table"]


@dataclass(frozen=True, eq=False)
class TreeSet:
    """Groups of identical spanning out-trees, as arrays over the logical arcs ``arc_tail → arc_head``."""

    n: int
    root: np.ndarray  # int64 per group
    multiplicity: np.ndarray  # int64 per group
    arcs: np.ndarray  # int64, groups × (n - 1): logical arc ids in the order added
    depth: np.ndarray  # int32, groups × n
    arc_tail: np.ndarray  # int64 per logical arc
    arc_head: np.ndarray  # int64 per logical arc

    @property
    def n_groups(self) -> int:
        return len(self.root)

    @property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.depth.size else 0

    def trees_per_root(self) -> np.ndarray:
        """Trees (multiplicities summed) of each rank."""
        return np.bincount(self.root, weights=self.multiplicity, minlength=self.n).astype(np.int64)

    def kept_fraction(self, previous: Sequence[Set[tuple[int, int]]]) -> float:
        """Share of the tree edges (weighted by multiplicity) that the previous trees of the same root used."""
        weight = self.multiplicity.astype(np.int64) * self.arcs.shape[1]
        used = int(weight.sum())
        if used == 0:
            return 0.0
        n = self.n
        tail, head = self.arc_tail[self.arcs], self.arc_head[self.arcs]
        key = (self.root[:, None] * n + tail) * n + head
        before = np.fromiter(((root * n + u) * n + v for root, arcs in enumerate(previous) for u, v in arcs),
                             dtype=np.int64)
        kept = np.isin(key, before).sum(axis=1)
        return float((kept * self.multiplicity).sum()) / used


@dataclass(frozen=True, eq=False)
class RouteTable:
    """Each logical arc's physical routes with their units, flattened (arcs in logical-arc order)."""

    first_route: np.ndarray  # int64, arcs + 1: the routes of arc a are first_route[a]:first_route[a + 1]
    unit_end: np.ndarray  # int64 per route: cumulative units within its arc (exclusive end)
    link_offsets: np.ndarray  # int64, routes + 1
    links: np.ndarray  # int64 link ids


def route_table(keys: Sequence[tuple[int, int]], routes: dict[tuple[int, int], list[tuple[tuple[int, ...], int]]]
                ) -> RouteTable:
    """The routes of ``keys`` (logical arcs, in arc-id order) as flat arrays."""
    counts, units, lengths, links = [], [], [], []
    for key in keys:
        pool = routes.get(key, [])
        counts.append(len(pool))
        for path, amount in pool:
            units.append(amount)
            lengths.append(len(path))
            links.extend(path)
    first_route = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(counts, out=first_route[1:])
    unit = np.asarray(units, dtype=np.int64)
    cumulative = np.cumsum(unit)
    # within-arc cumulative units: subtract the total of the arcs before
    before = np.concatenate([[0], cumulative])[first_route[:-1]]
    unit_end = cumulative - np.repeat(before, counts)
    link_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=link_offsets[1:])
    return RouteTable(first_route, unit_end, link_offsets, np.asarray(links, dtype=np.int64))


def lower_trees(ranks: tuple[str, ...], collective: Collective, trees: TreeSet, k: int, table: RouteTable) -> Schedule:
    """Trees to chunks and transfers (see the module docstring for the order and the steps)."""
    n = len(ranks)
    reduce = collective is Collective.REDUCESCATTER
    order = np.argsort(trees.root, kind="stable")
    root, mult = trees.root[order], trees.multiplicity[order]
    arcs, depth = trees.arcs[order], trees.depth[order]
    # First chunk of each group: root · k plus the trees of the same root before it.
    before = np.cumsum(mult) - mult
    root_start = np.searchsorted(root, np.arange(n))
    first = root * k + before - before[root_start[root]]
    edges = arcs.shape[1]
    # One row per (group, edge, chunk of the group): group-major, then edge, then chunk.
    group_of_row = np.repeat(np.repeat(np.arange(len(root)), edges), np.repeat(mult, edges))
    edge_arc = arcs.reshape(-1)
    row_arc = np.repeat(edge_arc, np.repeat(mult, edges))
    rows = len(row_arc)
    # Index of the row within its (group, edge) run = its chunk offset.
    run_start = np.repeat(np.cumsum(np.repeat(mult, edges)) - np.repeat(mult, edges), np.repeat(mult, edges))
    chunk = first[group_of_row] + (np.arange(rows) - run_start)
    # The unit each row takes on its arc: its rank among that arc's rows in row order.
    by_arc = np.argsort(row_arc, kind="stable")
    sorted_arc = row_arc[by_arc]
    arc_first = np.searchsorted(sorted_arc, sorted_arc, side="left")
    unit = np.empty(rows, dtype=np.int64)
    unit[by_arc] = np.arange(rows) - arc_first
    lo, hi = table.first_route[row_arc], table.first_route[row_arc + 1]
    # Route of each row: the first route of its arc whose cumulative units exceed the unit.
    route = _first_exceeding(table.unit_end, lo, hi, unit)
    tail, head = trees.arc_tail[row_arc], trees.arc_head[row_arc]
    flat_depth = depth.reshape(-1)
    if reduce:
        deepest = trees.max_depth
        step = deepest - flat_depth[group_of_row * n + head]
        sender, receiver = head, tail
    else:
        step = flat_depth[group_of_row * n + tail]
        sender, receiver = tail, head
    lengths = table.link_offsets[route + 1] - table.link_offsets[route]
    links = segments(table.links, table.link_offsets[route], lengths, reverse=reduce)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    op = TransferOp.REDUCE if reduce else TransferOp.COPY
    transfers = Transfers(chunk, sender, receiver, step, np.full(rows, int(op), dtype=np.int8), offsets, links)
    sources = np.repeat(np.arange(n), k)
    fractions = np.full(n * k, 1.0 / k)
    none = np.full(n * k, -1)
    chunks = Chunks(none, sources, fractions) if reduce else Chunks(sources, none, fractions)
    return Schedule(collective, ranks, chunks, transfers)


def _first_exceeding(unit_end: np.ndarray, lo: np.ndarray, hi: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """Per row, the smallest route index r in [lo, hi) with ``unit_end[r] > unit`` (vectorized bisection)."""
    left, right = lo.copy(), hi.copy()
    while True:
        active = left < right
        if not active.any():
            break
        middle = (left + right) // 2
        probe = np.where(active, middle, 0)
        go_right = active & (unit_end[probe] <= unit)
        left = np.where(go_right, middle + 1, left)
        right = np.where(active & ~go_right, middle, right)
    if np.any(left >= hi):
        raise SynthesisError("a logical link carries more trees than its routes allow (a bug)")
    return left

