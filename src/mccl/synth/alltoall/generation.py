"""The column-generation loop: master re-solves, stabilized pricing, Lagrangian bound.

Each round solves the restricted master (warm, from the last basis), then prices
every tensor with a shortest-path tree (:mod:`.pricing`) and adds the trees
whose reduced cost ``Σ_a β_a(T) α_a − α_c`` is negative.

* Lagrangian bound (Farley). For any prices α_a ≥ 0, with π_c(α) the cheapest
  tree of tensor c, ``z* ≤ Σ_a cap_a α_a / Σ_c π_c(α)``: dividing α by
  Σ_c π_c makes (α_a, α_c = π_c) dual feasible with Σ α_c = 1. Every pricing
  round yields one; the best is kept. A run stopped early (time budget) returns
  the RMP's solution with the proven gap ``1 − z_RMP / bound``.
* Dual stabilization (Wentges smoothing). Pricing runs at
  ``α_sep = λ α_best + (1 − λ) α_RMP``, between the RMP's duals and those of the
  best bound so far, which damps the oscillation of the duals of this very
  degenerate LP. A round whose smoothed trees price out none at the RMP's own
  duals ("misprice") prices again at α_RMP, so the loop stops only when no tree
  has negative reduced cost at the RMP's duals, i.e. at LP optimality.
* Diversity. Besides the exact tree, ``diversity`` more trees per tensor come
  from randomly perturbed tie-breaks (equal-price routes through different
  aggregation switches, different relays): one tree per tensor per round stalls
  once the fabric has an aggregation layer.
* Only tensors with α_c > 0 can price out (a tree costs ≥ 0), so only those
  tensors' trees are extracted and added; the bound needs every π_c, which the
  one all-sources shortest-path call gives anyway.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from mccl.errors import SynthesisError
from mccl.synth.alltoall.master import Master, MasterSolution
from mccl.synth.alltoall.pool import ColumnPool
from mccl.synth.alltoall.pricing import PathBatch, Pricer
from mccl.synth.options import CGOptions

__all__ = ["CGOptions", "CGResult", "OutOfPivots", "add_columns", "lagrangian_bound", "run_generation", "tie_epsilon", "seed_columns"]


@dataclass(frozen=True)
class CGResult:
    solution: MasterSolution
    bound: float  # best Lagrangian upper bound on z*, Gbit/s per block
    rounds: int
    optimal: bool  # no tree had negative reduced cost at the final RMP duals
    timed_out: bool


class OutOfPivots(Exception):
    """The master solves of ``run_generation`` took more simplex pivots than its ``pivot_budget``."""


def add_columns(master: Master, pool: ColumnPool) -> None:
    """Push the pool's columns the master does not have yet into it."""
    if len(pool) > master.n_columns:
        block, starts, links, counts = pool.coefficients(master.n_columns)
        master.add_columns(block, starts, links, counts)


def tie_epsilon(n_ranks: int) -> float:
    """Tie-break price per transfer, in the units where Σ α_c = 1: far below the tolerance."""
    return 1e-10 / max(n_ranks, 1)


def _block_costs(pool: ColumnPool, batch: PathBatch, price: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Cost of each block's subtree in ``batch``: ``(blocks, cost)`` for every block of the batch's sources."""
    blocks = pool.blocks
    if price is None:
        pair_cost = batch.cost
    else:
        per_path = np.where(batch.links >= 0, price[np.maximum(batch.links, 0)], 0.0).sum(axis=1)
        pair_cost = per_path.reshape(batch.cost.shape)
    owner = blocks.pair_block[batch.sources[:, None], batch.destinations]
    cost = np.bincount(owner.ravel(), weights=pair_cost.ravel(), minlength=len(blocks))
    mine = np.unique(owner)
    return mine, cost[mine]


def _price(pricer: Pricer, pool: ColumnPool, price: np.ndarray, rmp: MasterSolution, options: CGOptions,
           rng: np.random.Generator, eps: float) -> int:
    """Add the subtrees found at ``price`` whose reduced cost at the RMP's duals is negative."""
    candidates = np.flatnonzero(rmp.tensor_duals > options.reduced_cost_tolerance)
    if candidates.size == 0:
        return 0
    sources = np.unique(pool.blocks.source[candidates])
    added = 0
    for variant in range(1 + options.diversity):
        batch = pricer.trees(price, sources, epsilon=eps, noise=0.0 if variant == 0 else 1e-3, rng=rng)
        blocks, cost = _block_costs(pool, batch, None if price is rmp.link_duals else rmp.link_duals)
        improving = blocks[cost < rmp.tensor_duals[blocks] - options.reduced_cost_tolerance]
        added += pool.add_batch(batch, improving)
    return added


def seed_columns(pricer: Pricer, pool: ColumnPool, capacity: np.ndarray, *, rounds: int, batches: int = 8,
                 sharpness: float = 8.0, seed: int = 0) -> tuple[float, np.ndarray]:
    """Initial trees from multiplicative-weights routing; returns the best (bound, prices) seen.

    Sources are routed in ``batches`` groups per round; before each group, link a
    is priced ``exp(κ u_a) / cap_a`` with u_a the utilization of the trees routed
    so far (scaled to max 1), so each group routes around what the earlier ones
    loaded (Garg–Könemann style) and the groups do not all herd onto the same
    equal-price route. The trees cover the fabric's alternative routes from the
    start, and the prices give a finite Lagrangian bound to stabilize around.
    """
    rng = np.random.default_rng(seed)
    eps = tie_epsilon(pool.n_ranks)
    n = pool.n_ranks
    load = np.zeros(len(capacity))
    best = (np.inf, 1.0 / capacity)
    all_blocks = np.arange(len(pool.blocks))
    source_block = pool.blocks.source
    for round_index in range(rounds):
        order = rng.permutation(n) if round_index else np.arange(n)
        for group in np.array_split(order, min(batches, n)):
            util = load / capacity
            if util.max() > 0:
                util /= util.max()
            price = np.exp(sharpness * util) / capacity
            price /= price.sum()
            batch = pricer.trees(price, np.sort(group), epsilon=eps, noise=1e-3 if round_index else 0.0, rng=rng)
            pool.add_batch(batch, all_blocks[np.isin(source_block, group)])
            load += np.bincount(batch.links[batch.links >= 0], minlength=len(capacity))
        bound = lagrangian_bound(pricer, price, capacity)
        if bound < best[0]:
            best = (bound, price)
    return best


def run_generation(master: Master, pool: ColumnPool, pricer: Pricer, capacity: np.ndarray, *,
                   options: CGOptions | None = None, deadline: float | None = None,
                   center: tuple[float, np.ndarray] | None = None, pivot_budget: int | None = None) -> CGResult:
    """Column generation from the pool's current columns until LP optimality or ``deadline``.

    Raises :class:`SynthesisError` when the deadline passes before the first master
    LP is solved (no schedule can be read off then), and :class:`OutOfPivots` when
    the master solves together take more than ``pivot_budget`` simplex pivots.
    """
    options = CGOptions() if options is None else options
    rng = np.random.default_rng(options.seed)
    eps = tie_epsilon(pool.n_ranks)
    add_columns(master, pool)
    best_bound, best_price = (np.inf, None) if center is None else center
    rounds, optimal, timed_out = 0, False, False
    spent = master.iterations + master.abandoned_iterations

    def solve() -> MasterSolution | None:
        left = None if pivot_budget is None else max(pivot_budget - (master.iterations + master.abandoned_iterations
                                                                     - spent), 0)
        solved = master.solve(_remaining(deadline), iteration_limit=left)
        if solved is None and master.stopped == "iterations":
            raise OutOfPivots(f"the master solves took more than {pivot_budget} simplex pivots")
        return solved

    rmp = solve()
    if rmp is None:
        raise SynthesisError(f"the time budget ran out before the first master LP ({master.n_columns} columns) "
                             "was solved; allow more time")
    while rounds < options.max_rounds:
        if deadline is not None and time.perf_counter() >= deadline:
            timed_out = True
            break
        rounds += 1
        smoothed = rmp.link_duals if best_price is None or options.smoothing <= 0 else (
            options.smoothing * best_price + (1 - options.smoothing) * rmp.link_duals)
        for price in (smoothed,) if smoothed is rmp.link_duals else (smoothed, rmp.link_duals):
            bound = lagrangian_bound(pricer, price, capacity)
            if bound < best_bound:
                best_bound, best_price = bound, price
            if rmp.z >= best_bound * (1 - options.tolerance):
                optimal = True
                break
            if _price(pricer, pool, price, rmp, options, rng, eps):
                add_columns(master, pool)
                break
        else:
            optimal = True  # nothing prices out at the RMP's duals
        if optimal:
            break
        solved = solve()
        if solved is None:
            timed_out = True
            break
        rmp = solved
    bound = rmp.z if optimal else max(best_bound, rmp.z)
    return CGResult(rmp, bound, rounds, optimal, timed_out)


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(deadline - time.perf_counter(), 1e-3)


def lagrangian_bound(pricer: Pricer, price: np.ndarray, capacity: np.ndarray) -> float:
    """``Σ_a cap_a α_a / Σ_c π_c(α)`` (Gbit/s per block); inf when every tree is free."""
    dist = pricer.distances(price)
    total = float(dist.sum())
    if total <= 0:
        return np.inf
    return float(capacity @ price) / total
