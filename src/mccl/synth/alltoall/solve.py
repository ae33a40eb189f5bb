"""The AllToAll LP solved by column generation: from the previous run's solver state (a restart),
from a previous schedule's routes (warm from a file), or cold (multiplicative-weights first
columns); each warm path under a pivot budget past which it falls back to the cold one
(mccl-paper §4.2; :mod:`.pipeline` rounds and builds the schedule from what :func:`solve` returns).

Also the two LP-only questions: :func:`lp_optimum` (the AllToAll LP bound as algbw) and
:func:`minimal_steps` (App. D, the fewest steps per path that keep it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from mccl.schedule import Schedule
from mccl.synth.alltoall.generation import CGOptions, CGResult, OutOfPivots, run_generation, seed_columns
from mccl.synth.alltoall.master import Master
from mccl.synth.alltoall.network import Network, build_network
from mccl.synth.alltoall.pool import ColumnPool, make_blocks
from mccl.synth.alltoall.pricing import Pricer
from mccl.synth.alltoall.state import SolverState
from mccl.synth.alltoall.warm import WarmStart, seed_from_schedule
from mccl.topology import Topology

__all__ = ["lp_optimum", "minimal_steps", "restart_pivot_budget", "solve", "warm_pivot_budget"]


def solve(network: Network, *, previous: Schedule | None, state: SolverState | None, max_steps: int | None,
           grouping: str,
           seed_rounds: int, options: CGOptions, deadline: float | None, warm_seed_rounds: int = 0,
           warm_pivots: int | None = None) -> tuple[ColumnPool, CGResult, Master, WarmStart | None]:
    pricer = Pricer(network, max_steps)
    warm = None
    if state is not None and previous is not None and state.fits(network, max_steps, grouping):
        # The previous run's columns and basis (:mod:`.state`): every previous route is among them.
        routes = len(previous.chunks)  # type: ignore[union-attr]
        warm = WarmStart(routes=routes, kept=routes, columns=len(state.master.tensor), restarted=True)
        if not state.basis_still_optimal(network.capacity) and np.any(network.capacity
                                                                      > state.capacity * (1 + 1e-12)):
            # More capacity somewhere (a recovery) and the old basis lost: the old columns, priced where
            # it was scarce, cost more than a cold run (see ``restart_pivot_budget``); cold straight away.
            warm = replace(warm, fell_back=True)
        else:
            pool, master, _ = state.restart(network.capacity)
            try:
                result = run_generation(master, pool, pricer, network.capacity, options=options,
                                        deadline=deadline, pivot_budget=restart_pivot_budget(master))
                return pool, result, master, warm
            except OutOfPivots:
                pass  # the restart costs more than a cold run would: start over as cold
            warm = replace(warm, fell_back=True, abandoned_pivots=master.iterations + master.abandoned_iterations)
    elif previous is not None:
        pool = ColumnPool(make_blocks(network, grouping), network.n_ranks, network.n_links)
        fallback = pricer.trees(np.zeros(network.n_links), np.arange(network.n_ranks), epsilon=1e-12)
        warm = seed_from_schedule(previous, network, pool, fallback)
        center = None
        if warm_seed_rounds:
            center = seed_columns(pricer, pool, network.capacity, rounds=warm_seed_rounds, seed=options.seed)
        master = Master(len(pool.blocks), network.capacity)
        budget = warm_pivot_budget(master) if warm_pivots is None else warm_pivots
        try:
            result = run_generation(master, pool, pricer, network.capacity, options=options, deadline=deadline,
                                    center=center, pivot_budget=budget)
            return pool, result, master, warm
        except OutOfPivots:
            pass  # the seeded masters are a degenerate trap: start over as cold (see ``warm_pivot_budget``)
        warm = replace(warm, fell_back=True, abandoned_pivots=master.iterations + master.abandoned_iterations)
    pool = ColumnPool(make_blocks(network, grouping), network.n_ranks, network.n_links)
    center = seed_columns(pricer, pool, network.capacity, rounds=seed_rounds, seed=options.seed)
    master = Master(len(pool.blocks), network.capacity)
    result = run_generation(master, pool, pricer, network.capacity, options=options, deadline=deadline,
                            center=center)
    return pool, result, master, warm


def warm_pivot_budget(master: Master) -> int:
    """Simplex pivots the master solves of a warm start from a schedule's routes may take, in all.

    Those routes are the previous *rounded* schedule's, not its LP solution, so the
    seeded master starts from the slack basis like a cold one. Usually the whole warm
    column generation then takes at most about as many pivots as the cold one (rail_optimized,
    file warm from the healthy schedule, 256 GPUs: 1 872 / 1 966 / 433 pivots under
    Fail1/2/3 for 1 792 master rows, about 1 per row); but at 512 GPUs under Fail1 the
    second master (after the first pricing round) is so degenerate that it alone took
    8.1 k pivots, and the run ~155 s CPU against ~20 s cold, whose master solves take
    ~7 k pivots in all (≈ 1.9 per row of its 3 584). Past 2 pivots per row the warm
    start has spent about what the whole cold master work costs, so it is abandoned for
    the cold path: a warm start from a file costs at most about twice a cold run.
    """
    return 2 * (master.n_tensors + master.n_links)


def restart_pivot_budget(master: Master) -> int:
    """Simplex pivots the master solves of a restart from the previous solver state may take, in all.

    A restart whose old basis is no longer optimal starts from the slack basis over the old
    columns. After a degradation (no capacity grew) those columns are near the new optimum and the
    restart is cheap (rail_optimized, 256 GPUs, from the healthy state under Fail2 with the repair
    declined: 927 pivots against the cold run's ~2 k); the budget, 2 pivots per master row like a
    warm start from a schedule's routes (:func:`warm_pivot_budget`), bounds the case where they
    are not, and past it the run falls back to the cold path (``warm_fallback`` = 1 with
    ``restarted`` = 1 and the pivots spent in ``warm_abandoned_pivots``).

    After a recovery (some capacity grew; e.g. healthy → Fail2 warm from a file's routes →
    healthy, where the repair is declined because the Fail2 optimum saturates so many links that
    over a quarter of the pairs would be re-routed) the old columns are the routes of the scarcer
    fabric. Measured at 256 GPUs: the slack-basis solve over them alone costs about a whole cold
    master (2.0 k pivots), each later round's re-solve as much again (6.7 k pivots in all, 3.2×
    cold; at 512 GPUs 282 s CPU against 33 s cold); with the cold path's first columns added the
    pivots are the cold run's (2.1 k) but each one is dearer over the larger master (≈ 0.8× cold
    in CPU), and with only the old basic columns added ≈ cold. The old columns save nothing there,
    so such a restart takes the cold path straight away (``warm_fallback`` = 1, ``restarted`` = 1,
    no abandoned pivot) and costs what cold does.
    """
    return 2 * (master.n_tensors + master.n_links)


def lp_optimum(topology: Topology, ranks: Sequence[str] | None = None, *, max_steps: int | None = None,
               grouping: str = "tensor") -> float:
    """The AllToAll LP optimum as algbw in GB/s (column generation run to optimality)."""
    network = build_network(topology, ranks)
    _, result, _, _ = solve(network, previous=None, state=None, max_steps=max_steps, grouping=grouping, seed_rounds=4,
                             options=CGOptions(), deadline=None)
    return network.n_ranks * result.solution.z / 8.0


def minimal_steps(topology: Topology, ranks: Sequence[str] | None = None, *, tolerance: float = 1e-6) -> int:
    """Appendix D: the fewest steps per path that keep the unbounded LP optimum (binary search).

    The unbounded optimum is attained with paths of at most |V| − 1 transfers,
    and never with fewer than 1, so the search runs over [1, |V| − 1].
    """
    network = build_network(topology, ranks)
    target = lp_optimum(topology, ranks)
    low, high = 1, max(network.n_nodes - 1, 1)
    while low < high:
        middle = (low + high) // 2
        if lp_optimum(topology, ranks, max_steps=middle) >= target * (1 - tolerance):
            high = middle
        else:
            low = middle + 1
    return low
