"""Physical routes between GPUs: shortest paths whose inner nodes are switches.

A route never passes through a GPU: forwarding through a GPU is a relay, which a
schedule states explicitly as two transfers. Among equal-length routes, a switch
fabric spreads flows by ECMP; :meth:`Router.route` picks one by a deterministic
hash of a flow key, so two flows may collide on one uplink exactly as ECMP lets
them.
"""

from __future__ import annotations

import zlib
from collections import deque

from mccl.errors import TopologyError
from mccl.topology.model import Topology

__all__ = ["Router", "ecmp_index"]

# Equal-cost routes enumerated per pair before giving up on listing all (an ECMP
# group this wide is far beyond any builder here: HPN has at most one per aggregation switch).
MAX_ECMP_ROUTES = 256


def ecmp_index(key: str, n_choices: int) -> int:
    """Deterministic ECMP choice: CRC32 of the flow key modulo the group size."""
    return zlib.crc32(key.encode()) % n_choices


class Router:
    """Shortest switch-only routes on one topology, cached per source GPU.

    The cache lives on this object, not on the topology: a topology stays a value.
    """

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._predecessors: dict[str, dict[str, list[int]]] = {}

    def _search(self, src: str) -> dict[str, list[int]]:
        """BFS from ``src``; for every reached node, the links entering it on a shortest route."""
        cached = self._predecessors.get(src)
        if cached is not None:
            return cached
        topology = self.topology
        distance = {src: 0}
        predecessors: dict[str, list[int]] = {src: []}
        queue = deque([src])
        while queue:
            node = queue.popleft()
            if node != src and topology.node(node).is_gpu:
                continue  # a route ends at a GPU; it never passes through one
            for link_id in topology.out_links[node]:
                nxt = topology.links[link_id].dst
                if nxt not in distance:
                    distance[nxt] = distance[node] + 1
                    predecessors[nxt] = [link_id]
                    queue.append(nxt)
                elif distance[nxt] == distance[node] + 1:
                    predecessors[nxt].append(link_id)
        self._predecessors[src] = predecessors
        return predecessors

    def routes(self, src: str, dst: str) -> list[tuple[int, ...]]:
        """All shortest switch-only routes ``src → dst`` (link ids), in a fixed order."""
        if src == dst:
            raise TopologyError(f"no route from {src} to itself")
        predecessors = self._search(src)
        if dst not in predecessors:
            raise TopologyError(f"{src} cannot reach {dst} through switches in {self.topology.name!r}")
        found: list[tuple[int, ...]] = []
        stack: list[tuple[str, tuple[int, ...]]] = [(dst, ())]
        while stack and len(found) < MAX_ECMP_ROUTES:
            node, suffix = stack.pop()
            if node == src:
                found.append(suffix)
                continue
            for link_id in reversed(predecessors[node]):
                stack.append((self.topology.links[link_id].src, (link_id, *suffix)))
        return found

    def route(self, src: str, dst: str, flow_key: str | None = None) -> tuple[int, ...]:
        """One shortest route; among equal-cost ones, the ECMP choice for ``flow_key``."""
        options = self.routes(src, dst)
        if len(options) == 1:
            return options[0]
        key = f"{src}>{dst}" if flow_key is None else flow_key
        return options[ecmp_index(key, len(options))]
