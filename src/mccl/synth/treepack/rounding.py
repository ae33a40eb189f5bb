"""Rounding to an executable schedule: k ≤ ``chunks`` trees per rank, integral link uses.

Measured capacities are arbitrary reals, and an exact tree packing at the
fractional optimum x* may need thousands of trees per rank. We fix instead the
number k of trees per rank (each carries 1/k of the rank's block, one chunk) and
ask for the largest rate x at which the integer capacities
``c_e(x) = floor(C_e · k / x)`` (trees a link can carry while the schedule runs
at x) still admit k trees per rank: by Edmonds' branching theorem (with switches
split off, Phase 2) that holds iff every cut X has
``sum_{e into X} c_e(x) >= k · |ranks \\ X|``.

Search per k: start at x*; while some cut X is violated (n max-flows on one
network), lower x to the largest value at which X is satisfied (the floors are
step functions, so it is a breakpoint ``C_e · k / j``); stop when none is. x only
decreases and each cut found is satisfied by every later x, so the result is the
largest feasible x for that k. Candidates k: ``chunks`` and the smaller values that
divide no larger candidate (k' = m·k never does worse than k: m copies of each
tree). The loss ``1 - x / x*`` is the rounding gap reported in the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.errors import SynthesisError
from mccl.synth.cutbound import CutChecker
from mccl.synth.treepack.cutproof import violated_cut
from mccl.synth.treepack.fabric import Fabric

__all__ = ["IntegralRate", "integral_rate", "best_integral_rate", "candidate_ks"]

_EPS = 1e-9  # relative guard so that C·k/x at an exact breakpoint floors to the intended integer


@dataclass(frozen=True)
class IntegralRate:
    """k trees per rank at rate ``rate_gbps`` fit the integer capacities ``units`` (trees per arc)."""

    k: int
    rate_gbps: float
    units: np.ndarray  # int64 per fabric arc


def units_at(fabric: Fabric, k: int, rate: float) -> np.ndarray:
    return np.floor(fabric.gbps * k / rate * (1 + _EPS)).astype(np.int64)


def _largest_rate_for_cut(gbps: np.ndarray, k: int, demand: int, upper: float) -> float:
    """The largest x <= upper with ``sum floor(gbps · k / x) >= demand`` (gbps: the cut's arcs)."""

    def enough(x: float) -> bool:
        return int(np.floor(gbps * k / x * (1 + _EPS)).sum()) >= demand

    if enough(upper):
        return upper
    low, high = upper, upper
    while not enough(low):
        low /= 2.0
    for _ in range(64):
        mid = 0.5 * (low + high)
        if enough(mid):
            low = mid
        else:
            high = mid
    floors = np.floor(gbps * k / low * (1 + _EPS))
    positive = floors > 0
    # The largest x with the same floors as at ``low``: a breakpoint C_e·k / j.
    snapped = float(np.min(gbps[positive] * k / floors[positive]))
    return snapped if enough(snapped) and snapped <= upper else low


def integral_rate(fabric: Fabric, k: int, upper: float, checker: CutChecker, *,
                  below: float = 0.0) -> IntegralRate | None:
    """The largest rate <= ``upper`` at which k trees per rank fit integer capacities; None as soon as
    a cut shows it is below ``below`` (every cut found bounds the answer from above: a rate that loses
    to one already found is not searched to the end, whose check proves every rank)."""
    n = fabric.n_ranks
    rate = upper
    source = np.full(n, k, dtype=np.int64)
    for _ in range(10_000):
        units = units_at(fabric, k, rate)
        side = violated_cut(checker, units, source, n * k)  # max-flows only where no rule proves a rank
        if side is None:
            return IntegralRate(k, rate, units)
        entering = np.flatnonzero(side[fabric.head] & ~side[fabric.tail])
        demand = k * int(np.sum(~side[:n]))
        new_rate = _largest_rate_for_cut(fabric.gbps[entering], k, demand, rate)
        rate = min(new_rate, rate * (1 - 1e-12))
        if rate < below:
            return None
    raise ArithmeticError("integral rate search did not converge")  # pragma: no cover - each round lowers x


def candidate_ks(chunks: int) -> list[int]:
    """``chunks`` and smaller k that divide no larger candidate, largest first."""
    picked: list[int] = []
    for k in range(chunks, 0, -1):
        if not any(other % k == 0 for other in picked):
            picked.append(k)
    return picked


def best_integral_rate(fabric: Fabric, chunks: int, fractional: float, checker: CutChecker,
                       *, prefer: int | None = None) -> IntegralRate:
    """The best k ≤ ``chunks`` (highest rate; fewer chunks on ties), trying ``prefer`` first."""
    ks = candidate_ks(chunks)
    if prefer is not None and 1 <= prefer <= chunks:
        ks = [prefer] + [k for k in ks if k != prefer]
    best: IntegralRate | None = None
    for k in ks:
        # A k that cannot reach the best rate within the tie tolerance cannot be chosen: stop it early.
        found = integral_rate(fabric, k, fractional, checker,
                              below=0.0 if best is None else best.rate_gbps * (1 - 1e-12))
        if found is None:
            continue
        if best is None or found.rate_gbps > best.rate_gbps * (1 + 1e-12) or (
                found.rate_gbps >= best.rate_gbps * (1 - 1e-12) and k < best.k):
            best = found
        if best.rate_gbps >= fractional * (1 - 1e-12):
            break  # no loss left to win back
    if best is None:  # pragma: no cover - candidate_ks(chunks >= 1) is never empty
        raise SynthesisError(f"no tree count to try for chunks={chunks}")
    return best
