"""Physical routes between GPUs: shortest paths whose inner nodes are switches.

A route never passes through a GPU: forwarding through a GPU is a relay, which a
schedule states explicitly as two transfers. Among equal-length routes, a switch
fabric spreads flows by ECMP; :meth:`Router.route` picks one by a deterministic
hash of a flow key, so two flows may collide on one uplink exactly as ECMP lets
them.

Cost. A breadth-first search from the source settles only as far as the farthest
destination asked so far (it resumes when a farther one is asked), so a route inside
one host of a 2048-GPU fabric explores the host's NVSwitch, not the fabric. The ECMP
choice is found by counting routes per node (no enumeration of the equal-cost group):
``route`` costs O(route length × in-degree) once the search has settled the
destination. Results are exactly those of a full search and enumeration: the same
routes, in the same order (see :meth:`Router.routes`).
"""

from __future__ import annotations

import weakref
import zlib
from collections import deque
from collections.abc import Sequence

import numpy as np

from mccl.errors import TopologyError
from mccl.topology.model import Topology
from mccl.topology.routebatch import route_dag, walk_routes

__all__ = ["Router", "ecmp_index", "router_for"]

# Equal-cost routes enumerated per pair before giving up on listing all (an ECMP
# group this wide is far beyond any builder here: HPN has at most one per aggregation switch).
MAX_ECMP_ROUTES = 256


def ecmp_index(key: str, n_choices: int) -> int:
    """Deterministic ECMP choice: CRC32 of the flow key modulo the group size."""
    return zlib.crc32(key.encode()) % n_choices


class _Search:
    """A breadth-first search from one node, resumable: it stops as soon as the destinations
    asked for are settled. ``predecessors[v]``: the links entering ``v`` on a shortest route,
    in discovery order (the order a full search would find them in)."""

    __slots__ = ("distance", "predecessors", "queue", "counts")

    def __init__(self, source: int) -> None:
        self.distance: dict[int, int] = {source: 0}
        self.predecessors: dict[int, list[int]] = {source: []}
        self.queue: deque[int] = deque([source])
        self.counts: dict[int, int] = {source: 1}  # shortest routes from the source, per settled node


class Router:
    """Shortest switch-only routes on one topology, cached per source GPU.

    The cache lives on this object, not on the topology: a topology stays a value.
    :func:`router_for` shares one router per topology object between callers.
    """

    def __init__(self, topology: Topology) -> None:
        self._strong: Topology | None = topology  # None for shared routers, which must not keep it alive
        self._weak = weakref.ref(topology)
        index = topology.node_index
        self._index = index
        self._names = tuple(node.id for node in topology.nodes)
        self._is_gpu = tuple(node.is_gpu for node in topology.nodes)
        src, dst = topology.link_endpoints
        self._link_src: list[int] = src.tolist()
        self._link_dst: list[int] = dst.tolist()
        out: list[list[int]] = [[] for _ in topology.nodes]
        for link_id, tail in enumerate(self._link_src):
            out[tail].append(link_id)  # link-id order, as Topology.out_links
        self._out = out
        self._searches: dict[int, _Search] = {}
        self._array_view: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def topology(self) -> Topology:
        topology = self._strong if self._strong is not None else self._weak()
        if topology is None:
            raise TopologyError("the router's topology no longer exists")
        return topology

    def _position(self, node: str) -> int:
        position = self._index.get(node)
        if position is None:
            raise TopologyError(f"topology {self.topology.name!r} has no node {node!r}")
        return position

    def _settle(self, source: int, target: int) -> _Search:
        """The search from ``source``, advanced until ``target``'s predecessors are all known
        (every node one step closer than it has been expanded), or the reachable set is exhausted."""
        search = self._searches.get(source)
        if search is None:
            search = self._searches[source] = _Search(source)
        distance, predecessors, queue = search.distance, search.predecessors, search.queue
        is_gpu, out, link_dst = self._is_gpu, self._out, self._link_dst
        while queue:
            reached = distance.get(target)
            node = queue[0]
            if reached is not None and distance[node] >= reached:
                break
            queue.popleft()
            if node != source and is_gpu[node]:
                continue  # a route ends at a GPU; it never passes through one
            step = distance[node] + 1
            for link_id in out[node]:
                nxt = link_dst[link_id]
                seen = distance.get(nxt)
                if seen is None:
                    distance[nxt] = step
                    predecessors[nxt] = [link_id]
                    queue.append(nxt)
                elif seen == step:
                    predecessors[nxt].append(link_id)
        return search

    def _count(self, search: _Search, node: int) -> int:
        """Shortest routes from the search's source to settled ``node`` (memoized)."""
        counts = search.counts
        known = counts.get(node)
        if known is not None:
            return known
        pending = [node]
        while pending:  # post-order over predecessors, without recursion
            current = pending[-1]
            missing = [self._link_src[link] for link in search.predecessors[current]
                       if self._link_src[link] not in counts]
            if missing:
                pending.extend(missing)
                continue
            pending.pop()
            counts[current] = sum(counts[self._link_src[link]] for link in search.predecessors[current])
        return counts[node]

    def _endpoints(self, src: str, dst: str) -> tuple[int, int, _Search]:
        if src == dst:
            raise TopologyError(f"no route from {src} to itself")
        source, target = self._position(src), self._position(dst)
        search = self._settle(source, target)
        if target not in search.predecessors:
            raise TopologyError(f"{src} cannot reach {dst} through switches in {self.topology.name!r}")
        return source, target, search

    def routes(self, src: str, dst: str) -> list[tuple[int, ...]]:
        """All shortest switch-only routes ``src → dst`` (link ids), in a fixed order: depth-first
        from ``dst`` back to ``src``, each node's entering links in discovery order (at most
        ``MAX_ECMP_ROUTES``)."""
        source, target, search = self._endpoints(src, dst)
        predecessors, link_src = search.predecessors, self._link_src
        found: list[tuple[int, ...]] = []
        stack: list[tuple[int, tuple[int, ...]]] = [(target, ())]
        while stack and len(found) < MAX_ECMP_ROUTES:
            node, suffix = stack.pop()
            if node == source:
                found.append(suffix)
                continue
            for link_id in reversed(predecessors[node]):
                stack.append((link_src[link_id], (link_id, *suffix)))
        return found

    def n_routes(self, src: str, dst: str) -> int:
        """How many routes :meth:`routes` lists (the ECMP group size), without listing them."""
        _, target, search = self._endpoints(src, dst)
        return min(self._count(search, target), MAX_ECMP_ROUTES)

    def route_at(self, src: str, dst: str, index: int) -> tuple[int, ...]:
        """``routes(src, dst)[index]``, found by route counts instead of enumeration."""
        source, target, search = self._endpoints(src, dst)
        group = min(self._count(search, target), MAX_ECMP_ROUTES)
        if not 0 <= index < group:
            raise TopologyError(f"route index {index} out of range: {src} -> {dst} has {group} routes")
        links: list[int] = []
        node = target
        while node != source:  # the depth-first order is lexicographic in the entering link, dst first
            for link_id in search.predecessors[node]:
                tail = self._link_src[link_id]
                below = search.counts[tail] if tail in search.counts else self._count(search, tail)
                if index < below:
                    links.append(link_id)
                    node = tail
                    break
                index -= below
        return tuple(reversed(links))

    def positions(self, nodes: Sequence[str]) -> np.ndarray:
        """Node positions (indices into ``topology.nodes``) of ``nodes``, for :meth:`route_many`."""
        return np.array([self._position(node) for node in nodes], dtype=np.int64)

    def route_many(self, sources: np.ndarray, targets: np.ndarray, hashes: np.ndarray | None = None,
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Many routes at once: route i goes from node ``sources[i]`` to node ``targets[i]`` (positions,
        see :meth:`positions`) and is, among equal-cost ones, ``routes(src, dst)[hashes[i] % group]``
        (``hashes``: the CRC32 of each flow key, as :func:`ecmp_index` takes it; None: the first
        route). Equal, route by route, to :meth:`route` with those keys
        (:mod:`mccl.topology.routebatch`). Returns ``(lengths, links)``: each route's length, -1 for
        a pair with no route (or a node to itself), and the routes' links concatenated in order."""
        sources = np.asarray(sources, dtype=np.int64)
        targets = np.asarray(targets, dtype=np.int64)
        lengths = np.full(len(sources), -1, dtype=np.int64)
        walked: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        arrays = self._arrays()
        order = np.argsort(sources, kind="stable")
        for rows in np.split(order, np.flatnonzero(np.diff(sources[order])) + 1):
            if not len(rows):
                continue
            dag = route_dag(int(sources[rows[0]]), len(self._names), *arrays, targets=targets[rows])
            rows = rows[dag.distance[targets[rows]] > 0]
            group = np.minimum(dag.counts[targets[rows]], MAX_ECMP_ROUTES).astype(np.int64)
            index = np.zeros(len(rows), dtype=np.int64) if hashes is None else (
                np.asarray(hashes)[rows].astype(np.int64) % group)
            route_lengths, links = walk_routes(dag, targets[rows], index, arrays[3])
            lengths[rows] = route_lengths
            walked.append((rows, route_lengths, links))
        starts = np.zeros(len(sources) + 1, dtype=np.int64)
        np.cumsum(np.maximum(lengths, 0), out=starts[1:])
        out = np.empty(int(starts[-1]), dtype=np.int64)
        for rows, route_lengths, links in walked:  # scatter each source's routes to their rows' slots
            local = np.zeros(len(rows) + 1, dtype=np.int64)
            np.cumsum(route_lengths, out=local[1:])
            out[np.repeat(starts[rows] - local[:-1], route_lengths) + np.arange(len(links))] = links
        return lengths, out

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(is_gpu, out_ptr, out_link, link_src, link_dst)`` for :func:`route_dag` (computed once)."""
        if self._array_view is None:
            link_src = np.asarray(self._link_src, dtype=np.int64)
            out_link = np.argsort(link_src, kind="stable")  # by tail, then link id
            out_ptr = np.zeros(len(self._names) + 1, dtype=np.int64)
            np.cumsum(np.bincount(link_src, minlength=len(self._names)), out=out_ptr[1:])
            self._array_view = (np.asarray(self._is_gpu, dtype=bool), out_ptr, out_link, link_src,
                                np.asarray(self._link_dst, dtype=np.int64))
        return self._array_view

    def route(self, src: str, dst: str, flow_key: str | None = None) -> tuple[int, ...]:
        """One shortest route; among equal-cost ones, the ECMP choice for ``flow_key``."""
        group = self.n_routes(src, dst)
        if group == 1:
            return self.route_at(src, dst, 0)
        key = f"{src}>{dst}" if flow_key is None else flow_key
        return self.route_at(src, dst, ecmp_index(key, group))


_SHARED: dict[int, Router] = {}


def router_for(topology: Topology) -> Router:
    """One :class:`Router` per topology object, shared by every caller while the topology lives.

    A cache, not state: a router is a function of the topology's value, so sharing it only saves
    the searches (a fig14-style sweep builds thousands of schedules on one fabric). Keyed by
    object identity and dropped when the topology is collected, so it never outlives its key.
    """
    key = id(topology)
    router = _SHARED.get(key)
    if router is None or router._weak() is not topology:
        router = _SHARED[key] = Router(topology)
        router._strong = None  # the cache must not keep the topology alive
        weakref.finalize(topology, _SHARED.pop, key, None)
    return router
