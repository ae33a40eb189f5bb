"""The AllGather cut bound: the largest broadcast rate x at which every rank can AllGather.

One loop for the bound every schedule obeys (:func:`mccl.synth.allgather_cut_bound`) and
for Phase 1 of the tree packing (ForestColl, Zhao et al. 2025, §4; mccl-paper §4.1), with
the max-flow engine injected (:mod:`mccl.synth.maxflow`; OR-Tools by default: ~8x faster
than scipy on rail-optimized fabrics of 16–256 GPUs, e.g. 1.7 ms vs 18 ms at 32 GPUs).

Every node set X that holds some rank but not all must take in the blocks of the
ranks outside it: ``cap_in(X) >= x · |ranks \\ X|``. With a super-source s* that
feeds every rank at rate x, x is feasible iff every rank v has
``maxflow(s*, v) >= n · x`` (a cut X ∋ v costs ``cap_in(X) + x · |ranks ∩ X|``).

Search: Dinkelbach's method on the cut ratio (a parametric search that only ever
moves down). Start from an upper bound (the single-rank cuts, and for a warm start
the previous bottleneck cut re-priced at the new capacities); find a violated cut
by n max-flows on ONE network whose source arcs are re-set in place; set x to that
cut's exact ratio; repeat until no cut is violated. Every x is the ratio of a real
cut, computed in floating point from its links, so the result is a true cut value;
the integer max-flow (capacities scaled to 2**capacity_bits of the engine: 2**50 for
OR-Tools, 2**30 for scipy) only chooses the cut, at a resolution of ~1e-15 (OR-Tools) or
~1e-9 (scipy) of the total capacity. Typically 1–3 rounds of n max-flows.

The same checker answers the integral question of the rounding step
(:mod:`mccl.synth.treepack.rounding`): are integer capacities enough for k trees
per rank?
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mccl.errors import Infeasible
from mccl.synth.maxflow import MaxFlow, ortools_max_flow
from mccl.topology import FabricView

__all__ = ["CutChecker", "MaxRate", "max_rate", "cut_ratio"]

# (checker, arc capacities, source capacities, need, slack) -> the violated cut's sink side, or None
FindViolated = Callable[["CutChecker", np.ndarray, np.ndarray, int, int], "np.ndarray | None"]


@dataclass(frozen=True)
class MaxRate:
    """The fractional optimum: per-rank rate (Gbit/s) and a saturated cut attaining it."""

    rate_gbps: float
    cut_side: np.ndarray  # bool per view node: the sink side X of the saturated cut
    cut_arcs: np.ndarray  # view arc indices entering X
    rounds: int
    max_flows: int


class CutChecker:
    """View arcs plus s* → rank arcs in one network of the engine ``max_flow``; capacities change in place."""

    def __init__(self, fabric: FabricView, max_flow: MaxFlow = ortools_max_flow) -> None:
        self.fabric = fabric
        n = fabric.n_ranks
        self.source = fabric.n_nodes
        self.net = max_flow(fabric.n_nodes + 1)
        self.arcs = self.net.add_arcs(fabric.tail, fabric.head, np.zeros(fabric.n_arcs, dtype=np.int64))
        self.source_arcs = self.net.add_arcs(np.full(n, self.source), np.arange(n), np.zeros(n, dtype=np.int64))
        self._first = 0  # the sink to try first: the last one that found a violated cut

    def set_arc_capacities(self, capacities: np.ndarray) -> None:
        self.net.set_capacities(self.arcs, capacities)

    def violated_cut(self, source_capacity: np.ndarray, need: int, *, slack: int = 0) -> np.ndarray | None:
        """The sink side X of a cut with ``maxflow(s*, v) < need - slack`` for some rank v, or None."""
        self.net.set_capacities(self.source_arcs, source_capacity)
        n = self.fabric.n_ranks
        for offset in range(n):
            sink = (self._first + offset) % n
            if self.net.max_flow(self.source, sink) < need - slack:
                self._first = sink
                return self.net.sink_side()[: self.fabric.n_nodes]
        return None


def cut_ratio(fabric: FabricView, side: np.ndarray, gbps: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """``cap_in(X) / |ranks \\ X|`` for the sink side X, and the arcs entering X."""
    values = fabric.gbps if gbps is None else gbps
    entering = np.flatnonzero(side[fabric.head] & ~side[fabric.tail])
    outside = int(np.sum(~side[: fabric.n_ranks]))
    if outside == 0 or not np.any(side[: fabric.n_ranks]):
        return float("inf"), entering
    return float(values[entering].sum() / outside), entering


def max_rate(fabric: FabricView, *, hint_sides: Sequence[np.ndarray] = (), checker: CutChecker | None = None,
             max_flow: MaxFlow = ortools_max_flow, find_violated: FindViolated | None = None) -> MaxRate:
    """The fractional optimum x* (Gbit/s per rank) and its saturated cut; see the module docstring.

    ``hint_sides``: node sets whose cuts are tried as upper bounds first (warm start).
    ``checker``: a network to reuse (its engine is then used); else one of ``max_flow`` is built.
    ``find_violated``: ``(checker, arc capacities, source capacities, need, slack)`` → the sink side
    :meth:`CutChecker.violated_cut` would return (the tree packing's, which proves most ranks without a
    max-flow); None: that method.
    """
    n = fabric.n_ranks
    inflow = np.bincount(fabric.head, weights=fabric.gbps, minlength=fabric.n_nodes)[:n]
    worst = int(np.argmin(inflow))
    rate = float(inflow[worst] / (n - 1))
    if rate <= 0:
        raise Infeasible(f"rank GPU {fabric.names[worst]!r} has no incoming capacity; AllGather is impossible")
    side = np.zeros(fabric.n_nodes, dtype=bool)
    side[worst] = True
    for hint in hint_sides:
        ratio, _ = cut_ratio(fabric, hint)
        if ratio < rate:
            rate, side = ratio, hint.copy()
    checker = checker or CutChecker(fabric, max_flow)
    scale = 2.0**checker.net.capacity_bits / (fabric.gbps.sum() + n * rate)
    arc_capacity = np.floor(fabric.gbps * scale).astype(np.int64)
    checker.set_arc_capacities(arc_capacity)
    rounds = 0
    start = checker.net.solves
    for rounds in range(1, 200):  # noqa: B007 - Dinkelbach ends in a few rounds; 200 is a safety stop
        unit = int(np.floor(rate * scale))
        # Integer flooring loses at most one unit per arc of the cut: the slack below.
        source_capacity, slack = np.full(n, unit, dtype=np.int64), fabric.n_arcs + n
        violated = (checker.violated_cut(source_capacity, n * unit, slack=slack) if find_violated is None
                    else find_violated(checker, arc_capacity, source_capacity, n * unit, slack))
        if violated is None:
            break
        new_rate, _ = cut_ratio(fabric, violated)
        if new_rate >= rate * (1 - 1e-13):
            break  # the flow's rounding found no strictly tighter cut
        rate, side = new_rate, violated
    _, entering = cut_ratio(fabric, side)
    return MaxRate(rate, side, entering, rounds, checker.net.solves - start)
