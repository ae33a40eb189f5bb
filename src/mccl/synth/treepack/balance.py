"""Phase 2 on unbalanced switches: split at the rounded rate, or at the best lower rate that splits.

The splitting theorem behind :mod:`.switch_removal` (Bang-Jensen – Frank – Jackson,
ForestColl §5.2) needs every switch to take in exactly as much as it sends out.
A switch never copies, so whatever a tree packing sends through it enters and
leaves it once: a switch can forward at most its out-capacity and use at most
its in-capacity, and the excess on the larger side is unusable. The Phase 1 cut
bound (:mod:`mccl.synth.cutbound`) still counts that excess in cuts that contain the switch,
so on a fabric degraded one direction at a time (the controller's *measured*
topology caps a rank pair's links per direction) no packing may reach it, and
splitting at the rounded rate can keep fewer than k, even zero, trees per rank.
The careful mode of :mod:`.switch_removal` balances the switches first (drains
excess in-units into s*, trims excess out-units while the cut condition holds),
which recovers most of it; this module is the last resort for what is left.

Lowering the rate raises every link's integer capacity ``floor(C_e · k / x)``
(trees per time unit) while the demand stays k per rank, so the cut condition
gains slack everywhere and the split keeps it: at a low enough rate every
physical rank-to-rank route survives as a logical arc with room for a tree per
rank. So when the split at the rounded rate x keeps f < k trees per rank we
search lower rates: geometric steps (``factor``) down from x while a step could
still beat the best ``rate · f / k`` found, then a few bisection steps between
the last rate that split worse and the best one. Every candidate is a complete,
checked split (the packing condition on the logical graph, n max-flows), so the
result is always packable; the loss against the rounded rate is reported as
``switch_balance_loss`` in the schedule's stats and is part of its
``rounding_gap`` (the Phase 1 optimum stays the reported bound).

Cost: one :func:`remove_switches` per candidate, unstraightened (the logical graph, hence
the fit, does not depend on the routes); only the split kept has its routes straightened
(:func:`~.switch_removal.straighten_logical`). Balanced fabrics (every healthy or
symmetric-fault fabric) split at the first try and pay nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.errors import SynthesisError
from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.rounding import IntegralRate, units_at
from mccl.synth.treepack.switch_removal import LogicalGraph, packing_ok, remove_switches, straighten_logical

__all__ = ["Split", "split_switches", "trees_that_fit"]

_FACTOR = 0.9  # geometric step of the rate search below the rounded rate
_MAX_STEPS = 80  # 0.9**80 ≈ 2e-4 of the rounded rate: far below any fabric seen (a safety stop)
_REFINE = 4  # bisection steps after the geometric search (loss resolution ~ 10% / 2**4)


@dataclass(frozen=True)
class Split:
    """A packable logical graph: ``k`` trees per rank fit it, at per-rank rate ``rate_gbps · k / k_rounded``."""

    logical: LogicalGraph
    k: int  # trees per rank that fit (<= the rounding's k)
    rate_gbps: float  # the rate whose integer capacities were split
    retries: int  # splits tried below the rounded rate


def trees_that_fit(logical: LogicalGraph, k: int) -> int:
    """k, or the most trees per rank (0 if none) that the split logical graph still admits."""
    if not logical.careful:
        return k
    keys = list(logical.units)
    tail = np.array([u for u, _ in keys], dtype=np.int64)
    head = np.array([v for _, v in keys], dtype=np.int64)
    caps = np.array([logical.units[key] for key in keys], dtype=np.int64)
    for fit in range(k, 0, -1):
        if packing_ok(logical.n_ranks, logical.n_ranks, tail, head, caps, fit):
            return fit
    return 0


def split_switches(fabric: Fabric, integral: IntegralRate) -> Split:
    """Split at the rounded rate; on loss, the best split found at lower rates (module docstring)."""
    k = integral.k

    def attempt(rate: float, units: np.ndarray | None = None) -> tuple[LogicalGraph, int]:
        logical = remove_switches(fabric, units_at(fabric, k, rate) if units is None else units, k, fabric.groups,
                                  straighten=False)
        return logical, trees_that_fit(logical, k)

    logical, fit = attempt(integral.rate_gbps, integral.units)
    best = Split(logical, fit, integral.rate_gbps, 0)
    if fit == k:
        return Split(straighten_logical(fabric, logical), fit, integral.rate_gbps, 0)
    retries = 0
    rate = integral.rate_gbps
    worse = rate  # the lowest rate tried that split worse than ``best``
    for _ in range(_MAX_STEPS):
        rate *= _FACTOR
        if rate * k <= best.rate_gbps * best.k * (1 + 1e-12):
            break  # no lower rate can beat the best: at most k trees fit
        retries += 1
        logical, fit = attempt(rate)
        if rate * fit > best.rate_gbps * best.k:
            best = Split(logical, fit, rate, 0)
            if fit == k:
                break
        else:
            worse = rate
    if best.k == 0:
        raise SynthesisError(f"switch removal kept no spanning tree per rank even at {rate:.3g} Gbit/s per rank "
                             f"(rounded rate {integral.rate_gbps:.3g}); the fabric's switches are too unbalanced "
                             "(far more capacity in than out) for tree packing")
    low, high = best.rate_gbps, worse
    for _ in range(_REFINE if high > low else 0):
        mid = float(np.sqrt(low * high))
        retries += 1
        logical, fit = attempt(mid)
        if mid * fit > best.rate_gbps * best.k:
            best = Split(logical, fit, mid, 0)
        if fit == k:
            low = mid
        else:
            high = mid
    return Split(straighten_logical(fabric, best.logical), best.k, best.rate_gbps, retries)
