"""Routes for millions of (source, destination, flow key) triples at once, equal to :class:`Router`'s.

A direct AllToAll on 2048 GPUs asks for ~8 M routes, each the ECMP choice of its own flow key;
one Python call per route costs minutes. Here, per source node, one vectorized breadth-first
search builds the shortest-route DAG as arrays (:class:`RouteDag`): each node's entering links in
the order the search of :class:`~mccl.topology.routing.Router` discovers them (queue order of the
tail, then link id) and the number of shortest routes to each node. A route of index i is then
found for many destinations at once by walking back from the destination and picking, at each
node, the entering link whose cumulative route count passes i: the same depth-first order
:meth:`Router.routes` enumerates (tests: ``tests/test_fast_paths.py``).

:func:`crc32_of_concatenation` computes ``zlib.crc32`` of many keys built from a few parts by
the CRC's linearity (``crc(A + B) = shift_len(B)(crc(A)) ^ crc(B)``, zlib's ``crc32_combine``),
so ECMP indices need no string per key.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["RouteDag", "route_dag", "walk_routes", "crc32_of_concatenation", "crc32_parts"]


@dataclass(frozen=True)
class RouteDag:
    """Shortest switch-only routes from one node. ``distance[v]``: hops (-1: unreachable);
    ``counts[v]``: shortest routes (float, exact below 2**53); node v's entering links on shortest
    routes are ``pred_link[pred_ptr[v]:pred_ptr[v + 1]]`` in discovery order; ``cum[p]``: the
    running sum, inclusive, of the tails' counts over all of ``pred_link`` (strictly increasing)."""

    source: int
    distance: np.ndarray
    counts: np.ndarray
    pred_ptr: np.ndarray
    pred_link: np.ndarray
    cum: np.ndarray


def route_dag(source: int, n_nodes: int, is_gpu: np.ndarray, out_ptr: np.ndarray, out_link: np.ndarray,
              link_src: np.ndarray, link_dst: np.ndarray, targets: np.ndarray | None = None) -> RouteDag:
    """The breadth-first search of :class:`~mccl.topology.routing.Router`, level by level in numpy.

    ``out_link[out_ptr[v]:out_ptr[v + 1]]``: the links leaving v in link-id order. A GPU other than
    the source is reached but never expanded (a route does not pass through a GPU). With
    ``targets``, the search stops at the level that reaches the last of them (a group inside
    one segment of a large fabric never searches the rest); nodes beyond stay at distance -1."""
    pending = None if targets is None else np.unique(np.asarray(targets, dtype=np.int64))
    distance = np.full(n_nodes, -1, dtype=np.int64)
    distance[source] = 0
    counts = np.zeros(n_nodes)
    counts[source] = 1.0
    frontier = np.array([source], dtype=np.int64)
    heads_by_level, links_by_level = [], []
    level = 0
    while frontier.size:
        expand = frontier if level == 0 else frontier[~is_gpu[frontier]]
        starts, stops = out_ptr[expand], out_ptr[expand + 1]
        sizes = stops - starts
        total = int(sizes.sum())
        if total == 0:
            break
        # every link leaving the level, in (queue position of its tail, link id) order
        edge = out_link[np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(total)]
        head = link_dst[edge]
        new = distance[head] == -1
        edge, head = edge[new], head[new]
        if edge.size == 0:
            break
        unique, first = np.unique(head, return_index=True)
        frontier = unique[np.argsort(first, kind="stable")]  # the queue order of the next level
        distance[frontier] = level + 1
        counts += np.bincount(head, weights=counts[link_src[edge]], minlength=n_nodes)
        heads_by_level.append(head)
        links_by_level.append(edge)
        level += 1
        if pending is not None:
            pending = pending[distance[pending] < 0]
            if not pending.size:
                break
    heads = np.concatenate(heads_by_level) if heads_by_level else np.zeros(0, dtype=np.int64)
    links = np.concatenate(links_by_level) if links_by_level else np.zeros(0, dtype=np.int64)
    order = np.argsort(heads, kind="stable")  # grouped by head, discovery order kept inside a group
    pred_link = links[order]
    pred_ptr = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(heads, minlength=n_nodes), out=pred_ptr[1:])
    return RouteDag(source, distance, counts, pred_ptr, pred_link, np.cumsum(counts[link_src[pred_link]]))


def walk_routes(dag: RouteDag, targets: np.ndarray, index: np.ndarray, link_src: np.ndarray,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Route ``index[i]`` (in :meth:`Router.routes` order) from the DAG's source to ``targets[i]``,
    for all i: ``(lengths, links)``, the routes' links concatenated. Targets must be reachable
    and indices below their route counts.

    Depth-first order is lexicographic in the entering link, destination first: at node v the
    routes through v's first entering link come first (as many as its tail has), and so on."""
    lengths = dag.distance[targets]
    offsets = np.zeros(len(targets) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    links = np.empty(int(offsets[-1]), dtype=np.int64)
    node = np.asarray(targets, dtype=np.int64).copy()
    rest = np.asarray(index, dtype=float).copy()
    position = offsets[1:].copy()  # each route is filled back to front
    running, exclusive = dag.cum, dag.cum - dag.counts[link_src[dag.pred_link]]
    active = np.flatnonzero(node != dag.source)
    while active.size:
        at = node[active]
        first = dag.pred_ptr[at]
        base = exclusive[np.minimum(first, len(exclusive) - 1)]
        chosen = np.searchsorted(running, base + rest[active], side="right")
        rest[active] -= exclusive[chosen] - base
        link = dag.pred_link[chosen]
        position[active] -= 1
        links[position[active]] = link
        node[active] = link_src[link]
        active = active[node[active] != dag.source]
    return lengths, links


def crc32_parts(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """``(crc32, length)`` of each part, as uint32 / int64 arrays (one zlib call per part)."""
    return (np.array([zlib.crc32(text) for text in texts], dtype=np.uint32),
            np.array([len(text) for text in texts], dtype=np.int64))


_SHIFT_TABLES: dict[int, np.ndarray] = {}


def _shift_tables(longest: int) -> np.ndarray:
    """``(longest + 1, 4, 256)``: for each length L, the CRC register advanced over L bytes, per
    byte of the register (the map is linear over GF(2): a register's image is the XOR of its four
    bytes' images)."""
    tables = _SHIFT_TABLES.get(longest)
    if tables is None:
        rows = []
        for length in range(longest + 1):
            zeros = bytes(length)
            base = zlib.crc32(zeros)
            rows.append([[zlib.crc32(zeros, value << (8 * k)) ^ base for value in range(256)] for k in range(4)])
        tables = _SHIFT_TABLES[longest] = np.array(rows, dtype=np.uint32)
    return tables


def crc32_of_concatenation(parts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """``zlib.crc32`` of, per row, the concatenation of its parts: ``parts[j] = (crc32, length)``
    per row (e.g. gathered from :func:`crc32_parts` tables; the first part's lengths are unused)."""
    crc = parts[0][0].astype(np.uint32)
    for part_crc, part_len in parts[1:]:
        tables = _shift_tables(int(part_len.max(initial=0)))
        length = part_len.astype(np.intp)
        crc = (tables[length, 0, crc & 0xFF] ^ tables[length, 1, (crc >> 8) & 0xFF]
               ^ tables[length, 2, (crc >> 16) & 0xFF] ^ tables[length, 3, crc >> 24] ^ part_crc)
    return crc
