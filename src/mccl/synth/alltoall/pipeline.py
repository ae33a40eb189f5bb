"""``synthesize``: the AllToAll schedule by column generation, rounded to whole chunks.

Pipeline (mccl-paper §4.2): LP network (:mod:`.network`) → first columns, either
multiplicative-weights trees (cold), the previous run's columns and master basis
(warm, when ``previous`` was made by this process and its solver state is kept,
:mod:`.state`), or the previous schedule's routes (warm from a file, :mod:`.warm`)
→ column generation over source-rooted trees (:mod:`.generation`,
master in HiGHS, pricing by shortest-path trees) → deep-dive rounding to at most
``chunks`` chunks per block (:mod:`.rounding`) → a Schedule (:mod:`.build`).

A warm start with kept solver state whose old basis is no longer optimal (a
change on a tight link, e.g. Fail2) first tries the repair (:mod:`.repair`):
the previous LP solution, scaled, with only the pairs that crossed a changed
link re-routed, proven optimal by the Lagrangian bound; then only those pairs
and the pairs on newly saturated links are rounded again, and the other chunks
are kept with their transfers. When the repair cannot be proven optimal, the
run goes on by column generation as above. A restart whose old basis is not kept
takes the cold path when some capacity grew (a recovery: the old columns alone cost
several cold runs), and otherwise runs under a pivot budget past which it falls
back to the cold path (:func:`.solve.restart_pivot_budget`); the LP's solve is :mod:`.solve`.

Units: capacities Gbit/s; the LP's z is the rate every (source, destination)
block gets, so algbw = n · z / 8 GB/s (a block is S/n bytes). The metadata
carries the LP bound (at LP optimality the optimum itself; after a budgeted stop
the best Lagrangian bound), the achieved algbw of the rounded schedule, the
bottleneck cut (the links whose capacity rows have a positive dual in the final
master, with the rounded schedule's base slack on each), and the stats
``solve_time_s, columns, iterations, rounds, lp_gap, rounding_gap, gap, optimal``
(gap = 1 − achieved / bound, proven) and, when warm, ``kept_fraction``,
``reused_previous`` (the previous schedule is kept as it is when it is still as
close to the new LP optimum as its rounding was to the old one: rounding skipped)
``restarted`` (1 when the run restarted from the previous solver state),
``warm_fallback`` (1 when the warm start from a schedule's routes took more
pivots than :func:`.solve.warm_pivot_budget` allows, or the restart from the solver state
more than :func:`.solve.restart_pivot_budget`, and the run fell back to the cold path;
``restarted`` tells which), ``warm_abandoned_pivots`` (the pivots spent before it did), ``repaired``
(1 when the repair gave the result; ``iterations`` are then the repair LP's
pivots and ``rounds`` 0), ``repaired_pairs`` / ``rerounded_pairs`` (pairs it
re-routed / rounded again) and ``repair_declined`` (1 when a repair was tried
and could not be proven optimal).

Step bound (App. D): ``max_steps=m`` limits every path to m transfers (pricing
on the time-expanded graph); ``max_steps="auto"`` binary-searches the smallest m
whose LP optimum equals the unbounded one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mccl.schedule import Schedule, ScheduleMeta, bottleneck_cut, link_load, steady_state_algbw
from mccl.schedule.incremental import TransferOrigin
from mccl.synth.alltoall.build import LPFlow, merged_origin, merged_schedule, schedule_from_placement
from mccl.synth.alltoall.generation import CGOptions
from mccl.synth.alltoall.network import Network, build_network
from mccl.synth.alltoall.pricing import Pricer
from mccl.synth.alltoall.repair import pairs_to_reround, repair
from mccl.synth.alltoall.rounding import Placement, deep_dive, route_load
from mccl.synth.alltoall.solve import lp_optimum, minimal_steps, restart_pivot_budget, solve, warm_pivot_budget
from mccl.synth.alltoall.state import SolverState
from mccl.synth.alltoall.warm import WarmStart, check_previous
from mccl.synth.common import describe_on
from mccl.synth.options import ALLTOALL_MAX_CHUNKS, AllToAllOptions, resolve_options
from mccl.synth.result import AllToAllStats, AllToAllWarmStats, SynthesisResult, stats_from_pairs
from mccl.topology import Topology

__all__ = ["synthesize", "lp_optimum", "minimal_steps", "restart_pivot_budget", "warm_pivot_budget"]  # the LP's four: .solve

MAX_CHUNKS = ALLTOALL_MAX_CHUNKS
_REPAIR_ROUNDING_GAP = 5e-3  # rounding error a repaired schedule tolerates (at least; else the previous gap)


def _reusable(previous: Schedule, warm: WarmStart | None, topology: Topology, lp_gbs: float, chunks: int,
              max_steps: int | None) -> bool:
    """Whether the previous schedule, unchanged, is as close to the new LP optimum as its own rounding
    was to the old one (mccl-paper §6.1: a fault off the bottleneck cut leaves it optimal); then the
    rounding is skipped and the previous chunks and transfers are kept."""
    if warm is None or warm.kept_fraction < 1.0:
        return False
    if dict(previous.meta.inputs).get("chunks") != str(chunks):
        return False
    if max_steps is not None and previous.transfers.n_steps > max_steps:
        return False
    load = link_load(previous, len(topology.links))
    achieved = steady_state_algbw(load, topology.capacities_gbps, previous.n_ranks)
    tolerated = previous.meta.stat("rounding_gap", 0.01) or 0.0
    return achieved >= lp_gbs * (1 - tolerated - 1e-9)


def synthesize(
    topology: Topology,
    ranks: Sequence[str] | None = None,
    *,
    previous: SynthesisResult | Schedule | None = None,
    options: AllToAllOptions | None = None,
    **overrides: object,
) -> SynthesisResult:
    """A throughput-optimized AllToAll schedule (see the module docstring).

    ``previous``: what is being replaced (warm start; its ranks are used): a
    :class:`SynthesisResult` of this synthesizer restarts from its solver state
    (``warm_state``), a bare schedule (e.g. from a file) seeds from its routes.
    ``options``: :class:`~mccl.synth.options.AllToAllOptions`; ``overrides``: its fields
    by name (``chunks=4``).
    """
    started = time.perf_counter()
    chosen = resolve_options("alltoall.cg", AllToAllOptions, options, overrides)
    chunks, time_limit_s, grouping = chosen.chunks, chosen.time_limit_s, chosen.grouping
    state = previous.warm_state if isinstance(previous, SynthesisResult) else None
    if isinstance(previous, SynthesisResult):
        previous = previous.schedule
    if previous is not None:
        ranks = check_previous(previous, ranks, topology)
    max_steps = minimal_steps(topology, ranks) if chosen.max_steps == "auto" else chosen.max_steps
    options = chosen.cg
    network = build_network(topology, ranks)
    deadline = None if time_limit_s is None else started + float(time_limit_s)
    inputs = [("chunks", str(int(chunks))), ("grouping", grouping), ("warm", "true" if previous is not None else "false"),
              ("max_steps", "none" if max_steps is None else str(max_steps))]
    if time_limit_s is not None:
        inputs.append(("time_limit_s", f"{time_limit_s:g}"))
    outcome, declined = None, False
    if state is not None and _repairable(state, network, max_steps, grouping, int(chunks)):
        outcome = _repaired(network, state, int(chunks), options, max_steps, tuple(inputs), previous)
        declined = outcome is None
    if outcome is None:
        outcome = _generated(network, previous, state, int(chunks), options, max_steps, grouping, tuple(inputs),
                             deadline, seed_rounds=chosen.seed_rounds, warm_seed_rounds=chosen.warm_seed_rounds,
                             warm_pivots=chosen.warm_pivots)
    load = link_load(outcome.schedule, len(topology.links))
    schedule = describe_on(outcome.schedule, topology, load=load)
    duals = outcome.link_duals
    cut = network.link_ids[np.flatnonzero(duals > 1e-9 * max(duals.max(initial=0), 1e-300))]
    if cut.size:
        schedule = schedule.with_meta(bottleneck_cut=bottleneck_cut(schedule, topology, cut_links=cut, load=load))
    n = network.n_ranks
    bound_gbs, lp_gbs = n * outcome.bound / 8.0, n * outcome.z / 8.0
    achieved = float(schedule.meta.achieved_gbs or 0.0)
    stats = [
        ("solve_time_s", time.perf_counter() - started),
        ("columns", float(outcome.columns)),
        ("iterations", float(outcome.iterations)),
        ("rounds", float(outcome.rounds)),
        ("lp_gbs", lp_gbs),
        ("lp_gap", max(0.0, 1.0 - lp_gbs / bound_gbs) if bound_gbs > 0 else 0.0),
        ("rounding_gap", max(0.0, 1.0 - achieved / lp_gbs) if lp_gbs > 0 else 0.0),
        ("gap", max(0.0, 1.0 - achieved / bound_gbs) if bound_gbs > 0 else 0.0),
        ("optimal", 1.0 if outcome.optimal else 0.0),
        ("dives", float(outcome.dives)),
    ]
    if previous is not None:
        stats += list(outcome.warm_stats) + [("repair_declined", 1.0 if declined else 0.0)]
    final = schedule.with_meta(stats=tuple(stats))
    warm_stats = None
    if previous is not None:
        warm_stats = stats_from_pairs(AllToAllWarmStats, stats)
    return SynthesisResult(
        schedule=final, method="alltoall.cg", bound_gbs=bound_gbs, achieved_gbs=achieved, optimal=outcome.optimal,
        stats=replace(stats_from_pairs(AllToAllStats, stats), warm=warm_stats), warm_state=outcome.state,
        origin=outcome.origin)


@dataclass(frozen=True, eq=False)
class _Outcome:
    """What either path (repair, column generation) hands to the common end of ``synthesize``."""

    schedule: Schedule  # not yet described on the topology, without stats
    z: float  # LP optimum found, Gbit/s per block
    bound: float  # proven upper bound on it
    link_duals: np.ndarray
    columns: int
    iterations: int
    rounds: int
    optimal: bool
    dives: int
    warm_stats: tuple[tuple[str, float], ...]
    state: SolverState
    origin: TransferOrigin | None = None  # the transfers copied from the previous schedule (warm paths)


def _repairable(state: SolverState, network: Network, max_steps: int | None, grouping: str, chunks: int) -> bool:
    """A repair (:mod:`.repair`) is tried when the state fits, its chunks are the ones asked for,
    and its basis is not simply still optimal (that restart takes no pivot at all)."""
    return (state.fits(network, max_steps, grouping) and state.placement is not None
            and state.placement.chunks == chunks and not state.basis_still_optimal(network.capacity))


def _repaired(network: Network, state: SolverState, chunks: int, options: CGOptions, max_steps: int | None,
              inputs: tuple[tuple[str, str], ...], before: Schedule | None) -> _Outcome | None:
    """The repair path: the previous solution repaired and proven optimal, only some pairs rounded
    again (:func:`.repair.pairs_to_reround`; the others keep their chunks and, when ``before`` is the
    schedule ``state`` was taken with, its transfers); None when the repair cannot be proven optimal."""
    previous = state.placement
    assert previous is not None
    repaired = repair(state.flow, state.capacity, state.pool, Pricer(network, max_steps), network.capacity,
                      placement_pairs=previous.block, placement_paths=previous.path, tolerance=options.tolerance,
                      reduced_cost_tolerance=options.reduced_cost_tolerance, seed=options.seed,
                      detoured=state.detoured, known_prices=(state.master.link_duals,))
    if repaired is None:
        return None
    pool = repaired.pool
    tolerated = max(1.0 - previous.rate / state.flow.z, _REPAIR_ROUNDING_GAP)
    again = pairs_to_reround(repaired, previous, network.capacity, tolerated)
    rounding_again = np.zeros(network.n_ranks ** 2, dtype=bool)
    rounding_again[again] = True
    kept = ~rounding_again[previous.block]
    base = np.maximum(previous.load - route_load(pool.paths[previous.path[~kept]], previous.units[~kept] / chunks,
                                                 network.n_links), 0.0)
    flow = repaired.flow
    mine = rounding_again[flow.pair]
    # The load-balanced greedy first (a few ms); the LP dives (several times that) only when it rounds
    # worse than tolerated: the previous schedule's gap, and at least half the 1 % target.
    arguments = (flow.pair[mine], flow.path[mine], flow.share[mine], pool.paths, network.capacity, chunks)
    fresh = deep_dive(*arguments, lp_rate=flow.z, base_load=base, max_lp_entries=0)
    if fresh.rate < flow.z * (1 - tolerated):
        dived = deep_dive(*arguments, lp_rate=flow.z, base_load=base)
        fresh = dived if dived.rate > fresh.rate else fresh
    placement = Placement(np.concatenate([previous.block[kept], fresh.block]),  # the merged schedule's order
                          np.concatenate([previous.path[kept], fresh.path]),
                          np.concatenate([previous.units[kept], fresh.units]), chunks, fresh.rate, fresh.dives,
                          fresh.load)
    meta = ScheduleMeta("alltoall.cg", topology=network.topology.name, inputs=inputs,
                        throughput_bound_gbs=network.n_ranks * repaired.bound / 8.0)
    origin = None
    if before is not None and len(before.chunks) == len(previous.block):
        schedule = merged_schedule(before, kept, schedule_from_placement(network, pool, fresh, meta), meta)
        origin = merged_origin(before, kept, schedule)
    else:
        schedule = schedule_from_placement(network, pool, placement, meta)
    columns = len(state.master.tensor)
    warm_stats = (("kept_fraction", 1.0), ("warm_columns", float(columns)), ("reused_previous", 0.0),
                  ("restarted", 1.0), ("warm_fallback", 0.0), ("warm_abandoned_pivots", 0.0), ("repaired", 1.0),
                  ("repaired_pairs", float(len(repaired.affected))), ("rerounded_pairs", float(len(again))))
    return _Outcome(schedule, flow.z, repaired.bound, repaired.link_duals, columns, repaired.iterations, 0, True,
                    fresh.dives, warm_stats, state.repaired(network.capacity, pool, flow, placement, repaired.affected),
                    origin)


def _generated(network: Network, previous: Schedule | None, state: SolverState | None, chunks: int, options: CGOptions, max_steps: int | None,
               grouping: str, inputs: tuple[tuple[str, str], ...], deadline: float | None, *, seed_rounds: int,
               warm_seed_rounds: int, warm_pivots: int | None) -> _Outcome:
    """The column-generation path: cold, restarted from the previous solver state, or seeded from the
    previous schedule's routes (see ``_solve``)."""
    topology = network.topology
    pool, result, master, warm = solve(network, previous=previous, state=state, max_steps=max_steps, grouping=grouping,
                                        seed_rounds=seed_rounds, options=options, deadline=deadline,
                                        warm_seed_rounds=warm_seed_rounds, warm_pivots=warm_pivots)
    solution = result.solution
    meta = ScheduleMeta("alltoall.cg", topology=topology.name, inputs=inputs,
                        throughput_bound_gbs=network.n_ranks * result.bound / 8.0)
    lp_gbs = network.n_ranks * solution.z / 8.0
    reused = _reusable(previous, warm, topology, lp_gbs, chunks, max_steps) if previous is not None else False
    before = state if previous is not None else None
    if before is not None and master.iterations == 0 and master.n_columns == len(before.master.tensor):
        flow = before.flow  # the old basis, no pivot, no new column: the very same solution
    else:
        flow = LPFlow.of(pool, solution.x, solution.z)
    placement: Placement | None
    origin = None
    if reused:
        schedule = Schedule(previous.collective, previous.ranks, previous.chunks,  # type: ignore[union-attr]
                            previous.transfers, meta)  # type: ignore[union-attr]
        origin = TransferOrigin(schedule.transfers, np.arange(len(schedule.transfers), dtype=np.int64))
        placement = before.placement if before is not None else None
    else:
        placement = deep_dive(flow.pair, flow.path, flow.share, pool.paths, network.capacity, chunks,
                              lp_rate=solution.z)
        schedule = schedule_from_placement(network, pool, placement, meta)
    warm_stats: tuple[tuple[str, float], ...] = ()
    if warm is not None:
        warm_stats = (("kept_fraction", warm.kept_fraction), ("warm_columns", float(warm.columns)),
                      ("reused_previous", 1.0 if reused else 0.0), ("restarted", 1.0 if warm.restarted else 0.0),
                      ("warm_fallback", 1.0 if warm.fell_back else 0.0),
                      ("warm_abandoned_pivots", float(warm.abandoned_pivots)), ("repaired", 0.0),
                      ("repaired_pairs", 0.0), ("rerounded_pairs", 0.0))
    taken = SolverState.take(network, max_steps, grouping, pool, master, flow, placement)
    return _Outcome(schedule, solution.z, result.bound, solution.link_duals, master.n_columns, master.iterations,
                    result.rounds, result.optimal, placement.dives if placement is not None and not reused else 0,
                    warm_stats, taken, origin)
