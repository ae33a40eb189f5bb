"""One reusable max-flow network (OR-Tools ``SimpleMaxFlow``, push-relabel in C++).

Every phase of the tree packing asks many max-flow questions of one graph whose
structure stays put while capacities move (a parametric rate, a split link, a
tree that used a link). OR-Tools lets us change an arc's capacity in place and
re-solve, so each phase builds its network once (``BENCHMARKS.md``, "AllGather
by spanning-tree packing", records why OR-Tools over scipy and igraph: 2,000
nodes / 40,000 arcs, OR-Tools solves fastest and needs no rebuild). Capacities
are int64 units; callers choose the scale.
"""

from __future__ import annotations

import numpy as np
from ortools.graph.python import max_flow

__all__ = ["FlowNet", "BIG"]

# "Infinite" capacity: far above any real cut (callers scale capacities to <= 2**50).
BIG = 2**58


class FlowNet:
    """A directed network with int64 capacities; arcs are added once, capacities change in place."""

    def __init__(self, n_nodes: int) -> None:
        self._solver = max_flow.SimpleMaxFlow()
        self.n_nodes = n_nodes
        self.solves = 0

    def add_arcs(self, tail: np.ndarray, head: np.ndarray, capacity: np.ndarray) -> np.ndarray:
        """Add arcs and return their ids (in order)."""
        tail = np.asarray(tail, dtype=np.int64)
        if len(tail) == 0:
            return np.zeros(0, dtype=np.int64)
        ids = self._solver.add_arcs_with_capacity(tail, np.asarray(head, dtype=np.int64),
                                                  np.asarray(capacity, dtype=np.int64))
        self.n_nodes = max(self.n_nodes, int(np.max(tail)) + 1, int(np.max(head)) + 1)
        return np.asarray(ids, dtype=np.int64)

    def add_arc(self, tail: int, head: int, capacity: int) -> int:
        self.n_nodes = max(self.n_nodes, tail + 1, head + 1)
        return int(self._solver.add_arc_with_capacity(tail, head, int(capacity)))

    def set_capacity(self, arc: int, capacity: int) -> None:
        self._solver.set_arc_capacity(int(arc), int(capacity))

    def set_capacities(self, arcs: np.ndarray, capacities: np.ndarray) -> None:
        if len(arcs):
            self._solver.set_arcs_capacity(np.asarray(arcs, dtype=np.int64), np.asarray(capacities, dtype=np.int64))

    def max_flow(self, source: int, sink: int) -> int:
        """The max-flow value from ``source`` to ``sink``."""
        self.solves += 1
        status = self._solver.solve(int(source), int(sink))
        if status != max_flow.SimpleMaxFlow.OPTIMAL:
            raise ArithmeticError(f"max-flow solver returned {status}; capacities may overflow int64")
        return int(self._solver.optimal_flow())

    def flows(self, arcs: np.ndarray) -> np.ndarray:
        """After :meth:`max_flow`, the flow on each of ``arcs``."""
        return np.asarray(self._solver.flows(np.asarray(arcs, dtype=np.int64)), dtype=np.int64)

    def sink_side(self) -> np.ndarray:
        """After :meth:`max_flow`, the nodes that still reach the sink in the residual graph (bool mask)."""
        mask = np.zeros(self.n_nodes, dtype=bool)
        nodes = self._solver.get_sink_side_min_cut()
        mask[np.asarray(nodes, dtype=np.int64)] = True
        return mask
