"""Phase 2 epilogue: the switch removal's routes made simple and as short as capacity allows.

Splitting off a switch concatenates the routes of its two arcs, and the splitting
order (core first, then ToRs) chains ToR-to-ToR pieces: a logical arc's route can
zig-zag ``tor4 > agg4 > tor3 > agg1 > tor5`` or bounce ``u > v > u``. Bandwidth does
not care (the detours use spare ToR ↔ aggregation capacity), but every hop is
latency on every chunk that crosses it, and a route that visits a node twice is not
a path a fabric would forward on.

Only the routes change here, never the logical graph (which rank pairs are linked,
by how many units): the trees Phase 3 packs and the packing condition stay as
they are. Two passes over the (route, units) pieces:

1. **Cycle cancelling.** A route that reaches a node it already visited drops the
   loop between the two visits. Its intermediate nodes are switches (a logical
   arc joins two ranks), so what is left is a route between the same ranks through
   switches, on a subset of the links: no link's load grows.
2. **Shortest-path rerouting.** Longest pieces first, a piece's units are lifted
   off its links and put back on a shortest switch-only route from its sender to
   its receiver among the links with units to spare (bidirectional breadth-first
   search, no longer than the piece's own route), as many units as that route's
   narrowest link allows, then the next shortest; what finds no shorter route stays
   where it was. A link never carries more units than the rounding gave it
   (``units``), so the throughput the split guaranteed is kept exactly.

Greedy, so "as short as capacity allows" is per piece in that order, not a global
optimum of total length (that is an integral multi-commodity flow); on the HPN
fabrics every route ends at 2 (same host or rail) or 4 links (across rails),
the shortest there are.
Cost: O(total route length) for the first pass, one small search per long piece.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.straightkernel import Adjacency, shortest_route

__all__ = ["straighten_routes", "simple_route"]

Path = tuple[int, ...]  # physical link ids
Pieces = list[tuple[Path, int]]


def simple_route(route: Path, link_tail: np.ndarray | list[int], link_head: np.ndarray | list[int]) -> Path:
    """``route`` with every loop cut out: between two visits of a node, the links in between are dropped."""
    if not route:
        return route
    kept: list[int] = []
    position = {int(link_tail[route[0]]): 0}  # node -> number of kept links before reaching it
    for link in route:
        node = int(link_head[link])
        back = position.get(node)
        if back is None:
            kept.append(link)
            position[node] = len(kept)
            continue
        for dropped in kept[back:]:
            del position[int(link_head[dropped])]
        position[node] = back
        del kept[back:]
    return tuple(kept)


class _Residual:
    """The fabric's arcs with their spare units, adjacency as Python lists (the search's inner loop)."""

    def __init__(self, fabric: Fabric, units: np.ndarray, pieces: dict[tuple[int, int], Pieces]) -> None:
        n_links = int(fabric.link.max(initial=-1)) + 1
        self.arc_of_link = np.full(n_links, -1, dtype=np.int64)
        self.arc_of_link[fabric.link] = np.arange(fabric.n_arcs)
        self.link_of_arc = fabric.link.tolist()
        self.n_ranks = fabric.n_ranks
        tails, heads = fabric.tail.tolist(), fabric.head.tolist()
        self.heads = heads
        self.tails = tails
        self.out: list[list[tuple[int, int]]] = [[] for _ in range(fabric.n_nodes)]
        self.into: list[list[tuple[int, int]]] = [[] for _ in range(fabric.n_nodes)]
        for arc, (tail, head) in enumerate(zip(tails, heads, strict=True)):
            self.out[tail].append((arc, head))
            self.into[head].append((arc, tail))
        load = np.zeros(fabric.n_arcs, dtype=np.int64)
        for routes in pieces.values():
            for route, count in routes:
                np.add.at(load, self.arc_of_link[list(route)], count)
        self.spare = np.asarray(units, dtype=np.int64) - load  # may be < 0 only if given overloaded
        self.adjacency = Adjacency(fabric.n_nodes, fabric.tail, fabric.head)

    def arcs_of(self, route: Path) -> list[int]:
        return self.arc_of_link[list(route)].tolist()

    def shift(self, arcs: list[int], amount: int) -> None:
        np.add.at(self.spare, arcs, amount)

    def shortest(self, source: int, target: int, limit: int) -> list[int] | None:
        """Arcs of a shortest route ``source → target`` through switches with spare units, at most ``limit``
        long: :meth:`shortest_reference`'s route, compiled (:mod:`.straightkernel`; 2,048 GPUs, Fail3)."""
        return shortest_route(self.adjacency, self.spare, self.n_ranks, source, target, limit)

    def shortest_reference(self, source: int, target: int, limit: int) -> list[int] | None:
        """Arcs of a shortest route ``source → target`` through switches with spare units, at most ``limit`` long."""
        spare, n_ranks = self.spare, self.n_ranks
        forward: dict[int, tuple[int, int]] = {source: (-1, 0)}  # node -> (arc in, depth)
        backward: dict[int, tuple[int, int]] = {target: (-1, 0)}  # node -> (arc out, depth)
        ahead, behind = [source], [target]
        depth_f = depth_b = 0
        while ahead and behind and depth_f + depth_b < limit:
            meet: tuple[int, int] | None = None  # (length, node)
            grow_forward = len(ahead) <= len(behind)
            frontier, mine, other = (ahead, forward, backward) if grow_forward else (behind, backward, forward)
            depth = (depth_f if grow_forward else depth_b) + 1
            nxt: list[int] = []
            for node in frontier:
                for arc, neighbour in (self.out[node] if grow_forward else self.into[node]):
                    if spare[arc] <= 0 or neighbour in mine:
                        continue
                    if neighbour < n_ranks and neighbour != (target if grow_forward else source):
                        continue  # a route relays through switches only
                    mine[neighbour] = (arc, depth)
                    if neighbour in other:
                        length = depth + other[neighbour][1]
                        if length <= limit and (meet is None or length < meet[0]):
                            meet = (length, neighbour)
                    else:
                        nxt.append(neighbour)
            if meet is not None:
                return self._join(meet[1], forward, backward)
            if grow_forward:
                ahead, depth_f = nxt, depth
            else:
                behind, depth_b = nxt, depth
        return None

    def _join(self, middle: int, forward: dict[int, tuple[int, int]], backward: dict[int, tuple[int, int]]) -> list[int]:
        head_part: list[int] = []
        node = middle
        while forward[node][0] >= 0:
            arc = forward[node][0]
            head_part.append(arc)
            node = self.tails[arc]
        head_part.reverse()
        node = middle
        while backward[node][0] >= 0:
            arc = backward[node][0]
            head_part.append(arc)
            node = self.heads[arc]
        return head_part


def straighten_routes(fabric: Fabric, units: np.ndarray,
                      routes: dict[tuple[int, int], Pieces]) -> dict[tuple[int, int], Pieces]:
    """The same logical arcs with simple routes, each as short as the links' spare units allow (module docstring).

    ``units``: integer units per fabric arc (the rounding's capacities the split stayed within).
    """
    link_tail = np.full(int(fabric.link.max(initial=-1)) + 1, -1, dtype=np.int64)
    link_head = link_tail.copy()
    link_tail[fabric.link] = fabric.tail
    link_head[fabric.link] = fabric.head
    simple: dict[tuple[int, int], Pieces] = {}
    for key, pieces in routes.items():
        merged: dict[Path, int] = defaultdict(int)
        for route, count in pieces:
            merged[simple_route(route, link_tail, link_head)] += count
        simple[key] = list(merged.items())
    residual = _Residual(fabric, units, simple)
    direct = {(int(u), int(v)) for u, v in zip(fabric.tail, fabric.head, strict=True)}
    long_pieces = [(len(route), key, route, count) for key, pieces in simple.items() for route, count in pieces
                   if len(route) > 2 or (len(route) == 2 and key in direct)]
    if long_pieces:  # a piece already as short as any switch-only route of its pair cannot be shortened: no search
        hops = _switch_hops(fabric, sorted({key[0] for _, key, _, _ in long_pieces}))
        long_pieces = [piece for piece in long_pieces if hops[piece[1][0]][piece[1][1]] < piece[0]]
    if not long_pieces:
        return simple
    long_pieces.sort(key=lambda item: -item[0])
    moved: dict[tuple[int, int], dict[Path, int]] = {key: dict(pieces) for key, pieces in simple.items()}
    for length, key, route, count in long_pieces:
        own = residual.arcs_of(route)
        residual.shift(own, count)
        left = count
        while left > 0:
            arcs = residual.shortest(key[0], key[1], length - 1)
            if arcs is None:
                break
            amount = min(left, int(residual.spare[arcs].min()))
            residual.shift(arcs, -amount)
            left -= amount
            shorter = tuple(residual.link_of_arc[arc] for arc in arcs)
            pool = moved[key]
            pool[route] -= amount
            pool[shorter] = pool.get(shorter, 0) + amount
        residual.shift(own, -left)
    return {key: [(route, count) for route, count in pool.items() if count > 0] for key, pool in moved.items()}


def _switch_hops(fabric: Fabric, sources: list[int]) -> dict[int, np.ndarray]:
    """Per source rank, the fewest links to every rank on a route that relays through switches only.

    Ranks are split in two (an out-copy with the rank's out-arcs, an in-copy at ``n_nodes + rank``
    with its in-arcs), so no route passes through one; scipy's breadth-first search, 256 sources at a time.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    n, n_ranks = fabric.n_nodes, fabric.n_ranks
    heads = np.where(fabric.head < n_ranks, n + fabric.head, fabric.head)
    size = n + n_ranks
    graph = csr_matrix((np.ones(fabric.n_arcs), (fabric.tail, heads)), shape=(size, size))
    out: dict[int, np.ndarray] = {}
    for start in range(0, len(sources), 256):
        chunk = sources[start:start + 256]
        rows = shortest_path(graph, unweighted=True, indices=chunk)[:, n:]
        out.update(zip(chunk, rows, strict=True))
    return out
