"""Max-flow by augmenting paths up to a small limit, compiled: the exact rule's engine late in the packing.

Phase 3's exact rule (:mod:`.arborescence`) asks one max-flow per arc it adds, and only
whether the flow reaches ``total`` (the trees still to pack): a flow capped at ``total``
answers it exactly. For the last roots ``total`` is at most a few dozen while the network
still has n nodes and thousands of arcs: OR-Tools' push-relabel pays its global work per
solve (seconds per root at 1024 GPUs, one solve per arc), while at most ``total`` BFS
augmentations (Edmonds–Karp) cost microseconds each here: each search runs backwards from
the sink (one rank with few in-arcs; the source reaches nearly every node, so a path is a
few layers long), on a CSR built once per change of the arcs, and only the arcs a call
used are reset. 0.05–0.5 ms a flow at 1024 GPUs with up to ~50 trees left (issue 17).

:class:`CappedFlowNet` has the calling convention of :class:`mccl.synth.maxflow.FlowNet`
that the exact rule uses (arcs added once, capacities changed in place); ``max_flow``
returns ``min(max-flow, limit)``.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["CappedFlowNet"]

_jit = numba.njit(cache=True, nogil=True)


@_jit
def _csr(n_nodes: int, tail: np.ndarray, head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Residual edges per node: 2i is arc i forward (at its tail), 2i + 1 its reverse (at its head)."""
    arcs = len(tail)
    start = np.zeros(n_nodes + 1, dtype=np.int64)
    for i in range(arcs):
        start[tail[i] + 1] += 1
        start[head[i] + 1] += 1
    for v in range(n_nodes):
        start[v + 1] += start[v]
    fill = start[:-1].copy()
    edge = np.empty(2 * arcs, dtype=np.int64)
    for i in range(arcs):
        edge[fill[tail[i]]] = 2 * i
        fill[tail[i]] += 1
        edge[fill[head[i]]] = 2 * i + 1
        fill[head[i]] += 1
    return start, edge


@_jit
def _capped_max_flow(tail: np.ndarray, head: np.ndarray, capacity: np.ndarray, start: np.ndarray,
                     edge: np.ndarray, flow_on: np.ndarray, source: int, sink: int, limit: int) -> int:
    """min(max-flow(source → sink), limit) by shortest augmenting paths, searched backwards from the sink.

    Backwards because the sink is one rank with few in-arcs while the source reaches nearly every node:
    a path is found after a few layers. ``flow_on`` (per arc, all zero) holds the flow while it is
    built and is zeroed again on the arcs used before returning, so a call costs its searches only.
    """
    n_nodes = len(start) - 1
    via = np.full(n_nodes, -1, dtype=np.int64)
    queue = np.empty(n_nodes, dtype=np.int64)
    used_list = []
    for i in range(n_nodes):
        via[i] = -1
    flow = 0
    last = 0
    while flow < limit:
        for i in range(last):  # only the nodes the previous search marked (all of them are in its queue)
            via[queue[i]] = -1
        queue[0] = sink
        via[sink] = -2
        first, last = 0, 1
        while first < last and via[source] == -1:
            w = queue[first]
            first += 1
            for position in range(start[w], start[w + 1]):
                e = edge[position]
                arc = e >> 1
                # Searching backwards, an edge w' → w with room: arc forward into w (e odd at w's list:
                # w is the head) with flow below capacity, or arc reversed (w is the tail) carrying flow.
                if e & 1:
                    x = tail[arc]
                    room = capacity[arc] - flow_on[arc]
                else:
                    x = head[arc]
                    room = flow_on[arc]
                if room <= 0 or via[x] != -1:
                    continue
                via[x] = e
                queue[last] = x
                last += 1
        if via[source] == -1:
            break
        push = limit - flow
        x = source
        while x != sink:
            e = via[x]
            arc = e >> 1
            room = capacity[arc] - flow_on[arc] if e & 1 else flow_on[arc]
            push = min(push, room)
            x = head[arc] if e & 1 else tail[arc]
        x = source
        while x != sink:
            e = via[x]
            arc = e >> 1
            if e & 1:
                flow_on[arc] += push
            else:
                flow_on[arc] -= push
            used_list.append(arc)
            x = head[arc] if e & 1 else tail[arc]
        flow += push
    for arc in used_list:
        flow_on[arc] = 0
    return flow


class CappedFlowNet:
    """A directed network with int64 capacities whose max-flow is only needed up to ``limit``."""

    def __init__(self, n_nodes: int, limit: int) -> None:
        self.n_nodes = n_nodes
        self.limit = int(limit)
        self.solves = 0
        self._tail: list[np.ndarray] = []
        self._head: list[np.ndarray] = []
        self._capacity = np.zeros(0, dtype=np.int64)
        self._count = 0
        self._structure: tuple[np.ndarray, np.ndarray] | None = None  # residual CSR, rebuilt after arcs are added
        self._flow_on = np.zeros(0, dtype=np.int64)

    def add_arcs(self, tail: np.ndarray, head: np.ndarray, capacity: np.ndarray) -> np.ndarray:
        """Add arcs and return their ids (in order)."""
        tail = np.asarray(tail, dtype=np.int64)
        head = np.asarray(head, dtype=np.int64)
        ids = np.arange(self._count, self._count + len(tail), dtype=np.int64)
        if len(tail):
            self._tail.append(tail)
            self._head.append(head)
            self._capacity = np.concatenate([self._capacity, np.asarray(capacity, dtype=np.int64)])
            self._count += len(tail)
            self._structure = None
            self.n_nodes = max(self.n_nodes, int(tail.max()) + 1, int(head.max()) + 1)
        return ids

    def add_arc(self, tail: int, head: int, capacity: int) -> int:
        return int(self.add_arcs(np.array([tail]), np.array([head]), np.array([capacity]))[0])

    def set_capacity(self, arc: int, capacity: int) -> None:
        self._capacity[int(arc)] = int(capacity)

    def max_flow(self, source: int, sink: int) -> int:
        """``min(max-flow, limit)`` from ``source`` to ``sink``."""
        self.solves += 1
        if not self._tail:
            return 0
        if self._structure is None:
            if len(self._tail) > 1:
                self._tail = [np.concatenate(self._tail)]
                self._head = [np.concatenate(self._head)]
            self._structure = _csr(self.n_nodes, self._tail[0], self._head[0])
            self._flow_on = np.zeros(self._count, dtype=np.int64)
        start, edge = self._structure
        return int(_capped_max_flow(self._tail[0], self._head[0], self._capacity, start, edge, self._flow_on,
                                    int(source), int(sink), self.limit))
