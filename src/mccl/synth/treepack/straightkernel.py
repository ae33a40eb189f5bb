"""The straightening's route search (:mod:`.straighten`), compiled: the same bidirectional breadth-first search.

At 2,048 GPUs under Fail3 the straightening ran one Python search per long route piece (dicts
for the visited nodes, lists for the frontiers) and took more than 5 minutes of CPU on its own
(issue 17, fifth session). This is the same search over CSR arrays: the same frontier order
(nodes in the order they were reached, each node's arcs in arc order), the same growing side
(the smaller frontier, forward on ties), the same meeting rule (the shortest join found while
expanding a level, the first such in that order) — so the same route, found without the
interpreter. :meth:`~.straighten._Residual.shortest_reference` keeps the Python search, and the
tests compare the two.

Visited marks carry a stamp (one per search) instead of being cleared: a search touches only the
nodes it reaches.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["Adjacency", "shortest_route"]

_jit = numba.njit(cache=True, nogil=True)


class Adjacency:
    """Arcs by tail and by head (CSR, arc order kept), and the search's reusable scratch arrays."""

    def __init__(self, n_nodes: int, tails: np.ndarray, heads: np.ndarray) -> None:
        tails = np.asarray(tails, dtype=np.int64)
        heads = np.asarray(heads, dtype=np.int64)
        self.tails, self.heads = tails, heads
        self.out_arc = np.argsort(tails, kind="stable").astype(np.int64)
        self.out_start = np.concatenate([[0], np.cumsum(np.bincount(tails, minlength=n_nodes))]).astype(np.int64)
        self.in_arc = np.argsort(heads, kind="stable").astype(np.int64)
        self.in_start = np.concatenate([[0], np.cumsum(np.bincount(heads, minlength=n_nodes))]).astype(np.int64)
        self.marks = np.zeros((2, n_nodes), dtype=np.int64)  # stamp of the search that reached the node, per side
        self.via = np.zeros((2, n_nodes), dtype=np.int64)  # the arc it was reached by
        self.depth = np.zeros((2, n_nodes), dtype=np.int64)
        self.stamp = np.zeros(1, dtype=np.int64)
        self.frontier = np.empty((2, n_nodes), dtype=np.int64)  # side 0 forward (from source), 1 backward
        self.grown = np.empty(n_nodes, dtype=np.int64)


def shortest_route(adjacency: Adjacency, spare: np.ndarray, n_ranks: int, source: int, target: int,
                   limit: int) -> list[int] | None:
    """Arcs of a shortest route ``source → target`` through switches with spare units, at most ``limit``
    long (as :meth:`~.straighten._Residual.shortest_reference`), or None."""
    a = adjacency
    arcs = _search(a.tails, a.heads, a.out_start, a.out_arc, a.in_start, a.in_arc, spare, n_ranks, source, target,
                   limit, a.marks, a.via, a.depth, a.stamp, a.frontier, a.grown)
    return None if len(arcs) == 0 else arcs.tolist()


@_jit
def _search(tails: np.ndarray, heads: np.ndarray, out_start: np.ndarray, out_arc: np.ndarray, in_start: np.ndarray,
            in_arc: np.ndarray, spare: np.ndarray, n_ranks: int, source: int, target: int, limit: int,
            marks: np.ndarray, via: np.ndarray, depth_of: np.ndarray, stamp: np.ndarray, frontier: np.ndarray,
            nxt: np.ndarray) -> np.ndarray:
    stamp[0] += 1
    s = stamp[0]
    size = np.zeros(2, dtype=np.int64)
    marks[0, source], via[0, source], depth_of[0, source] = s, -1, 0
    marks[1, target], via[1, target], depth_of[1, target] = s, -1, 0
    frontier[0, 0], frontier[1, 0] = source, target
    size[0], size[1] = 1, 1
    level = np.zeros(2, dtype=np.int64)
    while size[0] > 0 and size[1] > 0 and level[0] + level[1] < limit:
        side = 0 if size[0] <= size[1] else 1
        other = 1 - side
        depth = level[side] + 1
        goal = target if side == 0 else source
        meet_length = -1
        meet_node = -1
        grown = 0
        for i in range(size[side]):
            node = frontier[side, i]
            first = out_start[node] if side == 0 else in_start[node]
            last = out_start[node + 1] if side == 0 else in_start[node + 1]
            for position in range(first, last):
                arc = out_arc[position] if side == 0 else in_arc[position]
                neighbour = heads[arc] if side == 0 else tails[arc]
                if spare[arc] <= 0 or marks[side, neighbour] == s:
                    continue
                if neighbour < n_ranks and neighbour != goal:
                    continue  # a route relays through switches only
                marks[side, neighbour], via[side, neighbour], depth_of[side, neighbour] = s, arc, depth
                if marks[other, neighbour] == s:
                    length = depth + depth_of[other, neighbour]
                    if length <= limit and (meet_length < 0 or length < meet_length):
                        meet_length, meet_node = length, neighbour
                else:
                    nxt[grown] = neighbour
                    grown += 1
        if meet_node >= 0:
            route = np.empty(meet_length, dtype=np.int64)
            count = 0
            node = meet_node
            while via[0, node] >= 0:  # back to the source, then reversed
                route[count] = via[0, node]
                node = tails[via[0, node]]
                count += 1
            route[:count] = route[:count][::-1].copy()
            node = meet_node
            while via[1, node] >= 0:
                route[count] = via[1, node]
                node = heads[via[1, node]]
                count += 1
            return route[:count]
        frontier[side, :grown] = nxt[:grown]
        size[side] = grown
        level[side] = depth
    return np.empty(0, dtype=np.int64)
