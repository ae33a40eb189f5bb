"""Max-flow engines: one calling convention, two implementations (OR-Tools, scipy).

A max-flow engine is a callable ``engine(n_nodes) -> FlowNetwork`` (networkx's
``flow_func`` idea: the algorithm takes the implementation as a parameter). A
:class:`FlowNetwork` gets its arcs once and its int64 capacities changed in place,
because every user asks many max-flow questions of one graph whose structure stays
put while capacities move (a parametric rate, a split link, a tree that used a link).
Callers choose the integer scale; ``capacity_bits`` says how large capacities (and so
the total flow) may get in that engine: 2**50 for OR-Tools (int64 push-relabel), 2**30
for scipy (its ``maximum_flow`` works in int32).

- :class:`FlowNet` (``ortools_max_flow``): OR-Tools ``SimpleMaxFlow``, push-relabel in C++,
  capacities changed in place and re-solved without a rebuild (``BENCHMARKS.md``,
  "AllGather by spanning-tree packing": 2,000 nodes / 40,000 arcs, OR-Tools fastest).
- :class:`ScipyFlowNet` (``scipy_max_flow``): ``scipy.sparse.csgraph.maximum_flow``
  (Dinic), the CSR matrix rebuilt when capacities change; no OR-Tools needed.

Both report the *minimal* sink side of a minimum cut (the nodes that still reach the
sink in the residual graph), so the two engines agree on cuts, not only on values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
from ortools.graph.python import max_flow

__all__ = ["BIG", "FlowNet", "FlowNetwork", "MaxFlow", "ScipyFlowNet", "ortools_max_flow", "scipy_max_flow"]

# "Infinite" capacity for the OR-Tools engine: far above any real cut (callers scale capacities to <= 2**50).
BIG = 2**58


class FlowNetwork(Protocol):
    """What an engine's network offers: arcs added once, capacities changed in place, solve, min cut."""

    capacity_bits: int
    solves: int

    def add_arcs(self, tail: np.ndarray, head: np.ndarray, capacity: np.ndarray) -> np.ndarray: ...

    def set_capacities(self, arcs: np.ndarray, capacities: np.ndarray) -> None: ...

    def max_flow(self, source: int, sink: int) -> int: ...

    def sink_side(self) -> np.ndarray: ...


MaxFlow = Callable[[int], FlowNetwork]


class FlowNet:
    """OR-Tools engine: a directed network with int64 capacities; arcs added once, capacities change in place."""

    capacity_bits = 50

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


class ScipyFlowNet:
    """scipy engine: the same interface over ``scipy.sparse.csgraph.maximum_flow`` (Dinic, int32)."""

    capacity_bits = 30  # int32 flows; the callers' total capacity stays below 2**31

    def __init__(self, n_nodes: int) -> None:
        self.n_nodes = n_nodes
        self.solves = 0
        self._tail = np.zeros(0, dtype=np.int64)
        self._head = np.zeros(0, dtype=np.int64)
        self._capacity = np.zeros(0, dtype=np.int64)
        self._graph = None  # CSR of the capacities, rebuilt after a change
        self._residual = None  # CSR of capacity - flow after the last solve
        self._sink = -1

    def add_arcs(self, tail: np.ndarray, head: np.ndarray, capacity: np.ndarray) -> np.ndarray:
        start = len(self._tail)
        tail, head = np.asarray(tail, dtype=np.int64), np.asarray(head, dtype=np.int64)
        self._tail = np.concatenate([self._tail, tail])
        self._head = np.concatenate([self._head, head])
        self._capacity = np.concatenate([self._capacity, np.asarray(capacity, dtype=np.int64)])
        if len(tail):
            self.n_nodes = max(self.n_nodes, int(np.max(tail)) + 1, int(np.max(head)) + 1)
        self._graph = None
        return np.arange(start, len(self._tail), dtype=np.int64)

    def set_capacities(self, arcs: np.ndarray, capacities: np.ndarray) -> None:
        if len(arcs):
            self._capacity[np.asarray(arcs, dtype=np.int64)] = np.asarray(capacities, dtype=np.int64)
            self._graph = None

    def _build(self) -> None:
        from scipy.sparse import csr_matrix

        if self._capacity.size and int(self._capacity.max()) >= 2**31:
            raise ArithmeticError("scipy max-flow capacities must fit int32; scale them to 2**30")
        n = self.n_nodes
        # Parallel arcs add up; ``graph - flow`` then holds every residual arc (flow is antisymmetric).
        self._graph = csr_matrix((self._capacity.astype(np.int32), (self._tail, self._head)), shape=(n, n))
        self._graph.sum_duplicates()

    def max_flow(self, source: int, sink: int) -> int:
        from scipy.sparse.csgraph import maximum_flow

        if self._graph is None:
            self._build()
        self.solves += 1
        result = maximum_flow(self._graph, int(source), int(sink))
        self._residual = self._graph - result.flow
        self._sink = int(sink)
        return int(result.flow_value)

    def sink_side(self) -> np.ndarray:
        """After :meth:`max_flow`, the nodes that still reach the sink in the residual graph (bool mask)."""
        from scipy.sparse.csgraph import breadth_first_order

        residual = self._residual.tocsr()
        residual.data = (residual.data > 0).astype(np.int8)
        residual.eliminate_zeros()
        order = breadth_first_order(residual.T.tocsr(), self._sink, directed=True, return_predecessors=False)
        mask = np.zeros(self.n_nodes, dtype=bool)
        mask[order] = True
        return mask


ortools_max_flow: MaxFlow = FlowNet
scipy_max_flow: MaxFlow = ScipyFlowNet
