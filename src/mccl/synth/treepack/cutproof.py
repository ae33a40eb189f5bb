"""The cut check of the rounding and the warm keep, with most ranks proven without a max-flow.

``CutChecker.violated_cut`` asks ``maxflow(s*, v) >= need`` for every rank v, one OR-Tools
max-flow each: at 512 GPUs the warm Fail2 re-synthesis ran ~3,600 of them (settling the kept
trees: 0.85 s; the rounding's five tree counts: 0.6 s), most of the warm path's budget.

Most ranks follow from the ones already proven, by the rank rule of :mod:`.packcheck`
applied to the physical fabric (switches included): with S = s* plus the proven nodes, a
node u with ``c(S → u) >= need`` has ``maxflow(s*, u) >= need`` — a cut X ∋ u (s* ∉ X)
either holds a proven node (then it is at least that node's max-flow) or every arc from S
into u enters it. So one max-flow that passes proves its rank, and the rule then spreads
the proof through the switches it feeds. A max-flow runs only for a rank the rule does not
reach, in the checker's order (the rank that failed last first); the first that fails
gives the same sink side as ``violated_cut`` (proven ranks cannot fail).
"""

from __future__ import annotations

import numpy as np

from mccl.synth.cutbound import CutChecker
from mccl.synth.treepack import packcheck

__all__ = ["violated_cut"]


def violated_cut(checker: CutChecker, arc_capacity: np.ndarray, source_capacity: np.ndarray,
                 need: int, slack: int = 0) -> np.ndarray | None:
    """``checker.violated_cut(source_capacity, need, slack=slack)`` after
    ``checker.set_arc_capacities(arc_capacity)``, with max-flows only for the ranks the rank rule does not
    prove (module docstring; with ``slack`` the rule proves ``maxflow >= need - slack``, all the check asks).
    Also leaves those capacities set on the checker, as the two calls would. Phase 1's check
    (:func:`~mccl.synth.cutbound.max_rate`, ``find_violated``) is this too: its last round proved all 512
    ranks of a 512-GPU fabric with 512 max-flows."""
    need = int(need) - int(slack)
    fabric = checker.fabric
    checker.set_arc_capacities(arc_capacity)
    checker.net.set_capacities(checker.source_arcs, source_capacity)
    n, nodes = fabric.n_ranks, fabric.n_nodes
    positive = np.asarray(arc_capacity) > 0
    tails = fabric.tail[positive].astype(np.int64)
    heads = fabric.head[positive].astype(np.int64)
    capacity = np.asarray(arc_capacity, dtype=np.int64)[positive]
    out_arc = np.argsort(tails, kind="stable").astype(np.int64)
    out_start = np.searchsorted(tails[out_arc], np.arange(nodes + 1)).astype(np.int64)
    into = np.zeros(nodes, dtype=np.int64)  # c(S → u), S = {s*} so far
    into[:n] = source_capacity
    alone = np.arange(nodes, dtype=np.int64)  # every node its own "host": the rank rule only
    host_in = into.copy()
    host_ok = np.zeros(nodes, dtype=np.bool_)
    proven = np.zeros(nodes, dtype=np.bool_)

    def prove(start: np.ndarray) -> None:
        packcheck.prove(start, proven, into, host_in, host_ok, out_start, out_arc, heads, capacity, alone, alone,
               np.arange(nodes + 1, dtype=np.int64), int(need))

    prove(np.flatnonzero(into >= need).astype(np.int64))
    first = checker._first
    for offset in range(n):
        sink = (first + offset) % n
        if proven[sink]:
            continue
        if checker.net.max_flow(checker.source, sink) < need:
            checker._first = sink
            return checker.net.sink_side()[:nodes]
        prove(np.array([sink], dtype=np.int64))
    return None
