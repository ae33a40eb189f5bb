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
    """Each logical arc's physical routes with their units, flattened (arcs in logical-arc order).

    Units are numbered globally: arc a owns ``arc_base[a] … arc_base[a + 1] - 1``, and route r the
    units below ``route_end[r]`` not owned by an earlier route, so one ``searchsorted`` finds a unit's route.
    """

    arc_base: np.ndarray  # int64, arcs + 1
    route_end: np.ndarray  # int64 per route: cumulative units over all routes (exclusive end)
    link_offsets: np.ndarray  # int64, routes + 1
    links: np.ndarray  # int64 link ids


def route_table(keys: Sequence[tuple[int, int]], routes: dict[tuple[int, int], list[tuple[tuple[int, ...], int]]]
                ) -> RouteTable:
    """The routes of ``keys`` (logical arcs, in arc-id order) as flat arrays."""
    per_arc, units, lengths, links = [], [], [], []
    for key in keys:
        total = 0
        for path, amount in routes.get(key, []):
            units.append(amount)
            lengths.append(len(path))
            links.extend(path)
            total += amount
        per_arc.append(total)
    arc_base = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(per_arc, out=arc_base[1:])
    link_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=link_offsets[1:])
    return RouteTable(arc_base, np.cumsum(np.asarray(units, dtype=np.int64)), link_offsets,
                      np.asarray(links, dtype=np.int64))


def lower_trees(ranks: tuple[str, ...], collective: Collective, trees: TreeSet, k: int, table: RouteTable) -> Schedule:
    """Trees to chunks and transfers (see the module docstring for the order and the steps).

    Per tree edge first (groups × (n-1) of them), then per transfer (edges × multiplicity): the
    transfer-level arrays are the schedule's own columns and little besides; transfers by chunk.
    """
    n = len(ranks)
    reduce = collective is Collective.REDUCESCATTER
    order = np.argsort(trees.root, kind="stable")
    root, mult = trees.root[order], trees.multiplicity[order]
    arcs, depth = trees.arcs[order], trees.depth[order]
    # First chunk of each group: root · k plus the trees of the same root before it.
    before = np.cumsum(mult) - mult
    first = root * k + before - before[np.searchsorted(root, root)]
    n_groups, per_group = arcs.shape
    edge_arc = arcs.reshape(-1)
    edge_group = np.repeat(np.arange(n_groups), per_group)
    edge_mult = mult[edge_group]
    # The first unit each edge takes on its arc: the units of the edges before it on the same arc.
    by_arc = np.argsort(edge_arc, kind="stable")
    sorted_mult = edge_mult[by_arc]
    taken = np.cumsum(sorted_mult) - sorted_mult
    sorted_arc = edge_arc[by_arc]
    unit_start = np.empty(len(edge_arc), dtype=np.int64)
    unit_start[by_arc] = taken - taken[np.searchsorted(sorted_arc, sorted_arc)] + table.arc_base[sorted_arc]
    del by_arc, sorted_mult, taken, sorted_arc
    edge_tail, edge_head = trees.arc_tail[edge_arc], trees.arc_head[edge_arc]
    flat_depth = depth.reshape(-1)
    if reduce:
        edge_step = trees.max_depth - flat_depth[edge_group * n + edge_head]
        edge_sender, edge_receiver = edge_head, edge_tail
    else:
        edge_step = flat_depth[edge_group * n + edge_tail]
        edge_sender, edge_receiver = edge_tail, edge_head
    # Transfers: one per (edge, chunk of its group), edge by edge.
    edge_of_row = np.repeat(np.arange(len(edge_arc)), edge_mult)
    offset = np.arange(len(edge_of_row)) - np.repeat(np.cumsum(edge_mult) - edge_mult, edge_mult)
    chunk = first[edge_group][edge_of_row] + offset
    unit = unit_start[edge_of_row] + offset
    # Transfers grouped by chunk (edge order within it): a warm start reads them as trees without a sort
    # (:func:`.forest.forest_of`), and its result names the ones it copies in this order.
    by_chunk = np.argsort(chunk, kind="stable")
    edge_of_row, chunk, unit = edge_of_row[by_chunk], chunk[by_chunk], unit[by_chunk]
    del by_chunk
    if np.any(unit >= table.arc_base[edge_arc[edge_of_row] + 1]):
        raise SynthesisError("a logical link carries more trees than its routes allow (a bug)")
    route = np.searchsorted(table.route_end, unit, side="right")
    del unit, offset
    lengths = table.link_offsets[route + 1] - table.link_offsets[route]
    links = segments(table.links, table.link_offsets[route], lengths, reverse=reduce)
    del route
    offsets = np.zeros(len(edge_of_row) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    op = TransferOp.REDUCE if reduce else TransferOp.COPY
    transfers = Transfers(chunk, edge_sender[edge_of_row], edge_receiver[edge_of_row], edge_step[edge_of_row],
                          np.full(len(edge_of_row), int(op), dtype=np.int8), offsets, links)
    sources = np.repeat(np.arange(n), k)
    fractions = np.full(n * k, 1.0 / k)
    none = np.full(n * k, -1)
    chunks = Chunks(none, sources, fractions) if reduce else Chunks(sources, none, fractions)
    return Schedule(collective, ranks, chunks, transfers)
