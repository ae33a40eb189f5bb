"""Phase 2's input trimmed to the units the trees can use: each link's slack scaled away before the split.

Where one slow rank sets the rate (Fail3: a spare GPU behind 50 and 100 Gbit/s cables) every other
link's integer capacity is ~20× what the trees need, and :mod:`.switch_removal`'s proportional split
spreads every in-rank over nearly every out-rank: 4.06 M logical arcs at 2,048 GPUs against the
healthy fabric's 639 k (fifth session), and the split, the straightening and Phase 3 pay for each.
Capping every link at ``need`` = Σ k (:func:`~.switch_removal._capped_first`) leaves them: a NIC cable
then still carries ~8× its healthy share of ``need``.

The split only has to keep the cut condition of Phase 1 (``maxflow(s*, v) >= need`` for every rank v,
asked on the physical graph, switches included, by :func:`~.packcheck.packing_ok`), so here each link
keeps about the share it would have on a fabric without slack:

1. **floors per capacity class** — links with about the same units (within 9 %: NVLinks, NIC cables,
   ToR uplinks, the degraded cables — a handful of classes on a built fabric, a bounded number on a
   measured one) are capped together at the least value that keeps the condition with every other
   link as given (binary search). Where that least cap is set by one small cut (Fail1: the slowed
   GPU needs its whole NIC cable, as every NIC cable has the same units), the links into that cut
   (both directions) keep their units and the rest of the class is capped again, while that at
   least halves the cap (a few rounds). A class the condition needs in full keeps its units;
2. **one common scale** — every link gets ``max(floor, ⌈α · units⌉)`` (never above its units), for the
   least α in (0, 1] that keeps the condition (bisection): the classes shrink together, in proportion,
   as on a healthy fabric at this rate, rather than one class absorbing all the others' cuts.

The condition is monotone in the capacities, so both searches are exact bisections; each step is one
rooted minimum cut on the physical graph (milliseconds: thousands of arcs, not millions). Both
directions of a full-duplex link have the same units, hence the same class and the same result: a
balanced switch stays balanced, and the splitting theorem still applies. The caller splits these
units first and keeps the result only if the logical graph passes the same check (so k, the rate and
the optimum are unchanged); 512 GPUs under Fail3: 262 k → 44 k logical arcs (healthy: 46 k).
"""

from __future__ import annotations

import numpy as np

from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.rootcut import rooted_min_cut

__all__ = ["least_units"]

_BUCKETS_PER_OCTAVE = 8  # a class: the links whose units agree within 2**(1/8) (≈ 9 %)
_MAX_CLASSES = 32  # classes below the largest 32 keep their units (a few bisections each)
_PROTECT_ROUNDS = 4  # cuts whose links a class keeps whole before its floor is taken
_SCALE_STEPS = 20  # bisection steps on α: a resolution of 1e-6 of the links' units


def least_units(fabric: Fabric, units: np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """``units`` lowered class by class, then scaled together, as far as the cut condition allows (module docstring).

    Returns ``units`` itself (unchanged) if it does not pass the condition to begin with."""
    units = np.asarray(units, dtype=np.int64)
    demand = np.broadcast_to(np.asarray(k, dtype=np.int64), (fabric.n_ranks,))
    if _failing_side(fabric, units, demand) is not None:
        return units
    pair = fabric.tail.astype(np.int64) * fabric.n_nodes + fabric.head
    reverse = fabric.head.astype(np.int64) * fabric.n_nodes + fabric.tail
    floor = units.copy()
    bucket = np.where(units > 0, np.floor(np.log2(np.maximum(units, 1)) * _BUCKETS_PER_OCTAVE), -1).astype(np.int64)
    for label in np.unique(bucket[units > 0])[::-1][:_MAX_CLASSES].tolist():
        free = bucket == label
        value = int(units[free].max())
        least = _least_floor(fabric, units, demand, free, value)
        for _ in range(_PROTECT_ROUNDS):
            if least == 0:
                break
            trial = units.copy()
            trial[free] = np.minimum(units[free], least - 1)
            side = _failing_side(fabric, trial, demand)
            entering = free & side[fabric.head] & ~side[fabric.tail]
            entering |= free & np.isin(reverse, pair[entering])  # both directions: a balanced switch stays balanced
            if not entering.any() or 4 * int(entering.sum()) > int(free.sum()):
                break  # a cut that needs much of the class: its floor is the class's own
            fewer = _least_floor(fabric, units, demand, free & ~entering, least)
            if 2 * fewer > least:
                break  # keeping that cut's links whole does not halve the others' floor: not worth singling out
            free &= ~entering
            least = fewer
        floor[free] = np.minimum(units[free], least)

    def scaled(alpha: float) -> np.ndarray:
        return np.minimum(units, np.maximum(floor, np.ceil(units * alpha).astype(np.int64)))

    low_alpha, high_alpha = 0.0, 1.0  # scaled(1.0) == units holds
    for _ in range(_SCALE_STEPS):
        middle = (low_alpha + high_alpha) / 2
        if _failing_side(fabric, scaled(middle), demand) is None:
            high_alpha = middle
        else:
            low_alpha = middle
    return scaled(high_alpha)


def _least_floor(fabric: Fabric, units: np.ndarray, demand: np.ndarray, members: np.ndarray, high: int) -> int:
    """The least cap on the ``members`` arcs (every other arc as in ``units``) that keeps the condition,
    knowing ``high`` keeps it (bisection)."""
    low = 0
    while low < high:
        middle = (low + high) // 2
        trial = units.copy()
        trial[members] = np.minimum(units[members], middle)
        if _failing_side(fabric, trial, demand) is None:
            high = middle
        else:
            low = middle + 1
    return high


def _failing_side(fabric: Fabric, units: np.ndarray, demand: np.ndarray) -> np.ndarray | None:
    """None if ``units`` on the physical graph keeps the condition (every rank v: ``maxflow(s*, v) >= Σ k``),
    else the sink side (bool mask over the fabric's nodes) of a cut below it: the arcs into that side are
    the ones a lowered class cannot spare. :func:`~.packcheck.packing_ok`'s network, asked for the side."""
    live = units > 0
    n_nodes, n_ranks = fabric.n_nodes, fabric.n_ranks
    source = n_nodes
    tails = np.concatenate([fabric.tail[live].astype(np.int64), np.full(n_ranks, source, dtype=np.int64)])
    heads = np.concatenate([fabric.head[live].astype(np.int64), np.arange(n_ranks, dtype=np.int64)])
    caps = np.concatenate([units[live], demand])
    candidates = np.zeros(n_nodes + 1, dtype=np.bool_)
    candidates[:n_ranks] = True
    need = int(demand.sum())
    cut = rooted_min_cut(n_nodes + 1, source, tails, heads, caps, candidates, need=need)
    return None if cut.value >= need else np.asarray(cut.sink_side, dtype=np.bool_)[:n_nodes]
