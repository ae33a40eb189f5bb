"""Warm repair: the previous LP solution, scaled, with only the pairs that crossed a changed link re-routed.

Why. A fault on a link the previous optimum saturates (Fail2: a NIC on the
bottleneck cut) leaves the previous master basis infeasible, and re-solving the
master over the old columns from the slack basis costs about as many simplex
pivots as a cold run (rail_optimized, 512 GPUs: 2.4 k against 1.5 k), because
each of the n tensor rows needs a new basic tree. The change itself is local:
scaling every (source, destination) pair's previous routes by one factor θ ≤ 1
keeps them feasible everywhere but on the changed links, and only the pairs
whose routes cross a changed link ("affected" pairs) need other routes.

The repair LP works per route, over the affected pairs only::

    max z
    s.t. θ · z_old − z ≥ 0                                  (the other pairs keep their routes, scaled)
         Σ_r f_{p,r} − z ≥ 0                for every affected pair p
         θ · L_a + Σ_{p,r} β_a(r) f_{p,r} ≤ cap_a   for every link a         (duals y_a ≥ 0)
         θ, f ≥ 0

L_a is the previous load of the unaffected pairs on link a and r ranges over
every path the column pool holds for p (its trees' paths to p's destination).
Each feasible point is a feasible flow of the full LP (any per-pair split over
routes is a combination of trees), so z ≤ z*. The link duals y give Farley's
Lagrangian bound ``z* ≤ Σ_a cap_a y_a / Σ_c π_c(y)``
(:func:`.generation.lagrangian_bound`, one all-sources shortest-path call);
when the two meet within the column generation's tolerance, z is the LP
optimum, proven, and no master is solved. Otherwise :func:`repair` returns None
and the caller runs column generation from the previous columns (:mod:`.state`).

What makes it fast (rail_optimized, Fail2, 512 GPUs: 2.7 k affected pairs and
20 k routes; measured 53–63 pivots where the slack basis takes 3.3 k):

* Crash basis. A greedy gives every affected pair one route (pairs in small
  batches, in random order, each on the route whose busiest link would be least
  utilised), and the LP starts from the basis "z, θ and those routes basic, the
  link row the greedy's routes saturate first tight". It is primal feasible and
  near the optimum, so primal simplex has little left to do.
* Lazy link rows. The LP starts with the rows of the changed links and of the
  links the greedy loads to at least half of the busiest one; after each solve, links
  over capacity join as rows. A link outside the LP still bounds θ
  (``θ · L_a ≤ cap_a``) through θ's upper bound; when that bound binds, the
  links that set it join as rows, so that at the end every binding constraint
  is a row and the duals carry the whole certificate.

Which pairs are affected: those whose routes (LP or rounded) cross a changed link. When some capacity
grows (a recovery), also those crossing a link the old optimum saturates, and those that earlier
repairs re-routed (``detoured``): the fault they went around may be the one that cleared. When an
attempt's bound does not close and no route of an affected pair prices out, the pairs on the
saturated links that the kept pairs load join, and the repair tries again, a few times at most.

Rounding then keeps the previous chunks of the unaffected pairs (their shares
did not change) and rounds only the affected pairs on top of them (see
:func:`.pipeline.synthesize`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.synth.alltoall.build import LPFlow
from mccl.synth.alltoall.generation import lagrangian_bound, tie_epsilon
from mccl.synth.alltoall.pool import ColumnPool
from mccl.synth.alltoall.pricing import Pricer
from mccl.synth.alltoall.repairlp import RepairLP, crash, solve_with_rows
from mccl.synth.alltoall.rounding import Placement, route_load

__all__ = ["MAX_AFFECTED", "Repair", "repair", "changed_links", "pairs_crossing", "pairs_to_reround", "paths_crossing"]

_NEAR_BUSIEST = 0.5  # links the crash loads to this fraction of the busiest start as rows
_MAX_ROUNDS = 25  # pricing rounds of one attempt before giving up
MAX_AFFECTED = 0.25  # share of all (source, destination) pairs above which a repair is not tried
_FEW_MARKED = 2  # up to this many marked links, paths_crossing compares instead of looking up
_MAX_EXPANSIONS = 3  # attempts, each with more affected pairs, before a repair is declined


@dataclass(frozen=True, eq=False)
class Repair:
    """A proven-optimal repair of the previous LP solution."""

    flow: LPFlow  # every pair: the previous shares for the unaffected, the repair's for the affected
    bound: float  # the Lagrangian bound that proves flow.z optimal, Gbit/s per block
    affected: np.ndarray  # sorted pair ids (s * n + d) that were re-routed
    link_duals: np.ndarray  # y_a ≥ 0 per network link: the prices whose bound proves the optimum
    theta: float  # the unaffected pairs' scale
    iterations: int  # simplex pivots of the repair LP, all its solves
    rows: int  # link rows it ended with
    pool: ColumnPool  # the pool the flow's path ids refer to (a copy when pricing added routes)
    kept_load: np.ndarray  # θ · L_a: the LP's load of the pairs that kept their routes, Gbit/s


def changed_links(capacity: np.ndarray, old_capacity: np.ndarray) -> np.ndarray:
    """Mask of the links whose capacity differs (relative 1e-12)."""
    return ~np.isclose(capacity, old_capacity, rtol=1e-12, atol=0.0)


def pairs_crossing(pairs: np.ndarray, paths: np.ndarray, route_links: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """The pairs among ``pairs`` whose path ``paths[i]`` (a row of ``route_links``) crosses a marked link."""
    return pairs[paths_crossing(route_links, marked)[paths]]


def paths_crossing(route_links: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """Mask of the rows of ``route_links`` (link ids, -1 padded) that cross a marked link.

    Why not one lookup per column: a column of the row-major table is a strided pass over all of it
    (the pool's 1.9 M × 8 paths at 512 GPUs: ~110 ms). A few marked links (a fault: 1–2) are compared
    with the whole table, one contiguous pass each (~10 ms); more are looked up in one gather. Either
    way the row's hops are reduced by reading its booleans as one word when the width allows."""
    marked = np.asarray(marked, dtype=bool)
    rows, width = route_links.shape
    ids = np.flatnonzero(marked)
    if len(ids) == 0 or rows == 0:
        return np.zeros(rows, dtype=bool)
    if len(ids) <= _FEW_MARKED:
        hops = route_links == ids[0]
        for link in ids[1:]:
            hops |= route_links == link
    else:
        lookup = np.append(marked, False)  # index -1 (padding) reads False
        hops = lookup[route_links]
    word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width)
    if word is not None and hops.flags.c_contiguous:
        return hops.view(word).reshape(rows) != 0
    return hops.any(axis=1)


def pairs_to_reround(repaired: Repair, previous: Placement, capacity: np.ndarray, tolerance: float) -> np.ndarray:
    """The pairs whose chunks the repaired schedule rounds again: the re-routed ones, and every pair
    whose previous chunks cross a link the new optimum saturates where the kept chunks load more than
    the LP planned for them by over ``tolerance`` (relative). The previous chunks were rounded for the
    old capacities, where such a link may have had slack to absorb their rounding error (measured:
    up to 1.7 % over the LP's load at 64 GPUs under Fail2); rounded again, with the re-routed pairs,
    they keep the gap within the tolerance, and the chunks whose error is already within it stay."""
    paths = repaired.pool.paths
    flow = repaired.flow
    n_pairs = int(max(previous.block.max(initial=0), repaired.affected.max(initial=0))) + 1
    affected = np.zeros(n_pairs, dtype=bool)
    affected[repaired.affected] = True
    gone = affected[previous.block]
    rounded_kept = np.maximum(previous.load - route_load(paths[previous.path[gone]], previous.units[gone]
                                                         / previous.chunks, len(capacity)), 0.0) * flow.z
    saturated = flow.load >= capacity * (1 - 1e-6)
    over = saturated & (rounded_kept > repaired.kept_load * (1 + tolerance) + 1e-9 * capacity)
    crossing = pairs_crossing(previous.block, previous.path, paths, over)
    return np.union1d(repaired.affected, crossing)


def _candidates(pool: ColumnPool, affected: np.ndarray, flow: LPFlow) -> tuple[np.ndarray, np.ndarray]:
    """``(pair, path)``, sorted: every path the pool's trees or the flow take to an affected pair's destination.

    A tree of a block holds one path per destination of the block, in the block's destination order, so
    pair (s, d)'s path in tree k is entry ``pair_slot[s, d]`` of it: only the affected pairs' entries are
    read (at 512 GPUs ~2·10⁴ of the pool's 2·10⁶), not every tree expanded to its pairs."""
    n = pool.n_ranks
    blocks = pool.blocks
    offsets, flat = pool.column_paths()
    column_block = pool.block
    order = np.argsort(column_block, kind="stable")  # the trees of each block, in the order they were added
    first = np.searchsorted(column_block[order], np.arange(len(blocks)))
    trees = np.diff(np.append(first, len(order)))  # per block
    source, destination = affected // n, affected % n
    block, slot = blocks.pair_block[source, destination], blocks.pair_slot[source, destination]
    per_pair = trees[block]
    ends = np.cumsum(per_pair)
    total = int(ends[-1]) if len(ends) else 0
    within = np.arange(total) - np.repeat(ends - per_pair, per_pair)
    column = order[np.repeat(first[block], per_pair) + within]
    entry_pair = np.repeat(affected, per_pair)
    entry_path = flat[offsets[column] + np.repeat(slot, per_pair)]
    wanted = np.zeros(n * n, dtype=bool)
    wanted[affected] = True
    in_flow = wanted[flow.pair]
    width = pool.paths.shape[0] + 1
    key = np.unique(np.concatenate([entry_pair * width + entry_path, flow.pair[in_flow] * width
                                    + flow.path[in_flow]]))
    return key // width, key % width


def repair(flow: LPFlow, old_capacity: np.ndarray, pool: ColumnPool, pricer: Pricer, capacity: np.ndarray, *,
           placement_pairs: np.ndarray | None = None, placement_paths: np.ndarray | None = None,
           tolerance: float = 1e-7, reduced_cost_tolerance: float = 1e-9, seed: int = 0,
           max_affected: float = MAX_AFFECTED, detoured: np.ndarray | None = None,
           known_prices: tuple[np.ndarray, ...] = ()) -> Repair | None:
    """The repair of ``flow`` (optimal at ``old_capacity``) for ``capacity``, or None when it cannot be
    proven optimal (see the module docstring). ``placement_*``: the previous rounded chunks' pairs
    and paths; a pair whose chunks cross a changed link is re-routed too. ``pool`` is not changed:
    routes that pricing finds go into a copy, returned with the repair. ``detoured``: the pairs that
    earlier repairs re-routed (since the last column generation); when capacity grows they are
    re-routed again, since the fault they went around may be the one that cleared. ``known_prices``:
    link prices to try for the certificate when the repair LP's own duals do not prove its optimum
    (any prices give a valid bound; the optimal duals of a degenerate LP need not be the ones HiGHS
    returns, e.g. on the way back to healthy, where the last master's duals do prove it).

    When an attempt's bound does not close although no route of an affected pair prices out, the
    pairs that kept their routes hold it back: the pairs crossing the saturated links they load join
    the affected ones, and the repair tries again (at most ``_MAX_EXPANSIONS`` times; e.g. a recovery
    after a repair, whose detours were not on the changed links). A change that affects more than
    ``max_affected`` of all pairs is declined: the route-level LP grows with the affected pairs (~7
    routes each) and would cost more than the master (e.g. a controller's measured capacities that
    all drift a little; 512 GPUs under Fail2 affect 1 % of the pairs)."""
    changed = changed_links(capacity, old_capacity)
    if not np.any(changed) or flow.z <= 0:
        return None
    marked = changed.copy()
    if np.any(capacity > old_capacity * (1 + 1e-12)):
        # More capacity somewhere (a recovery): the pairs held back by the links the old optimum
        # saturates may now move, so they are re-routed too (and the rest can scale up).
        marked |= flow.load >= old_capacity * (1 - 1e-6)
    n = pool.n_ranks
    affected = np.zeros(0, dtype=np.int64)
    if detoured is not None and np.any(capacity > old_capacity * (1 + 1e-12)):
        affected = np.unique(np.asarray(detoured, dtype=np.int64))
    tried = False
    for _ in range(_MAX_EXPANSIONS):
        crossing = paths_crossing(pool.paths, marked)
        more = [flow.pair[crossing[flow.path]]]
        if placement_pairs is not None and placement_paths is not None:
            more.append(placement_pairs[crossing[placement_paths]])
        grown = np.union1d(affected, np.concatenate(more))
        if grown.size == 0 or (tried and grown.size == affected.size) or grown.size > max_affected * n * (n - 1):
            return None  # nothing (more) to repair, or so much that the route-level LP would outgrow the master
        affected, tried = grown, True
        outcome = _attempt(flow, affected, marked, pool, pricer, capacity, tolerance, reduced_cost_tolerance, seed,
                           known_prices)
        if outcome is None or isinstance(outcome, Repair):
            return outcome
        marked = marked | outcome
    return None


def _attempt(flow: LPFlow, affected: np.ndarray, marked: np.ndarray, pool: ColumnPool, pricer: Pricer,
             capacity: np.ndarray, tolerance: float, reduced_cost_tolerance: float, seed: int,
             known_prices: tuple[np.ndarray, ...]) -> Repair | np.ndarray | None:
    """One repair with these affected pairs: the proven Repair; or, when the affected pairs are routed
    optimally but the bound does not close, the mask of the saturated links that pairs which kept
    their routes load; or None when HiGHS fails."""
    n, n_links = pool.n_ranks, len(capacity)
    paths = pool.paths
    candidate_pair, candidate_path = _candidates(pool, affected, flow)
    route_links = paths[candidate_path]
    first = np.searchsorted(candidate_pair, affected)
    last = np.searchsorted(candidate_pair, affected, side="right")
    is_affected = np.zeros(n * n, dtype=bool)
    is_affected[affected] = True
    kept = ~is_affected[flow.pair]
    unaffected_load = np.maximum(flow.load - route_load(paths[flow.path[~kept]], flow.share[~kept] * flow.z, n_links),
                                 0.0)
    choice = crash(route_links, first, last, unaffected_load, capacity, flow.z, np.random.default_rng(seed))
    crash_load = unaffected_load + route_load(route_links[choice], np.full(len(choice), flow.z), n_links)
    with np.errstate(divide="ignore", invalid="ignore"):
        utilization = np.nan_to_num(crash_load / capacity, nan=0.0, posinf=np.inf)
    lp = RepairLP(np.searchsorted(affected, candidate_pair), len(affected), route_links, unaffected_load, capacity,
                   flow.z)
    lp.add_links(np.flatnonzero(marked | (utilization >= _NEAR_BUSIEST * utilization.max())))
    if not lp.setcrash(choice, flow.z):
        return None
    sources = np.unique(affected // n)
    bound, copied = np.inf, False
    proven_by = np.zeros(n_links)
    for _ in range(_MAX_ROUNDS):
        values = solve_with_rows(lp, unaffected_load, capacity)
        if values is None:
            return None
        pair_duals, link_duals = lp.duals()
        bound, proven_by = min((bound, proven_by), (lagrangian_bound(pricer, link_duals, capacity), link_duals),
                               key=lambda pair: pair[0])
        for prices in known_prices:
            if values[0] > 0 and values[0] >= bound * (1 - tolerance):
                break
            bound, proven_by = min((bound, proven_by), (lagrangian_bound(pricer, prices, capacity), prices),
                                   key=lambda pair: pair[0])
        if values[0] > 0 and values[0] >= bound * (1 - tolerance):
            break
        # Not proven: price routes for the affected pairs at the LP's duals (route-level column generation).
        batch = pricer.trees(link_duals, sources, epsilon=tie_epsilon(n))
        pair = (batch.sources[:, None] * n + batch.destinations).ravel()
        mine = is_affected[pair]
        improving = mine & (batch.cost.ravel() < pair_duals[np.searchsorted(affected, pair)
                                                             .clip(0, len(affected) - 1)] - reduced_cost_tolerance)
        if not np.any(improving):  # the affected pairs are routed optimally; the others would have to move
            load = values[1] * unaffected_load + route_load(lp.route_links, values[2:], n_links)
            return (load >= capacity * (1 - 1e-6)) & (unaffected_load > 0)
        if not copied:
            pool, copied = pool.copy(), True
        new_path = pool.register_paths(batch.links[improving])
        candidate_pair = np.concatenate([candidate_pair, pair[improving]])
        candidate_path = np.concatenate([candidate_path, new_path])
        lp.add_routes(np.searchsorted(affected, pair[improving]), batch.links[improving])
    else:
        return None
    z, theta, rates = float(values[0]), float(values[1]), values[2:]
    used = rates > 1e-12 * max(float(rates.max(initial=0.0)), 1e-300)
    new_pair, new_path, new_rate = candidate_pair[used], candidate_path[used], rates[used]
    row = np.searchsorted(affected, new_pair)
    new_share = new_rate / np.bincount(row, weights=new_rate, minlength=len(affected))[row]
    load = theta * unaffected_load + route_load(pool.paths[new_path], new_rate, n_links)
    flow = LPFlow(np.concatenate([flow.pair[kept], new_pair]), np.concatenate([flow.path[kept], new_path]),
                  np.concatenate([flow.share[kept], new_share]), z, load)
    return Repair(flow, bound, affected, proven_by, theta, lp.iterations, lp.n_link_rows, pool,
                  theta * unaffected_load)
