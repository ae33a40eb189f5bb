"""Benchmark: AllGather tree packing on fabrics degraded one direction at a time (unbalanced switches).

    python benchmarks/treepack_unbalanced.py                 # 2 fabrics x seeds 1-3 x 200 draws, 128 GPUs x 3
    python benchmarks/treepack_unbalanced.py --seeds 1 --trials 50 --big 0

Each draw scales 30 % of the links by U(0.05, 1), each direction on its own (what the
controller's measured topology does). Per fabric and seed: failures (no schedule or an
invalid one), the loss against the cut bound (``allgather_cut_bound``) and against the
exact pass-through optimum — the LP "max x over switch-balanced sub-capacities c' <= c
with a flow of n·x from s* to every rank inside c'" (a switch never copies, so any
packing uses a balanced c'; conversely the splitting theorem packs any balanced c') —
solved by HiGHS (scipy), on the 8-GPU fabrics only; and solve times. Then ``--big``
128-GPU rail-optimized draws, timed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from mccl.errors import MCCLError
from mccl.schedule import validate
from mccl.synth import allgather_cut_bound, optimize
from mccl.synth.treepack.fabric import fabric_of
from mccl.topology import Topology, rail_optimized, spine_leaf


def passthrough_optimum(topology: Topology) -> float:
    """The exact AllGather algbw (GB/s) of any packing whose switches only pass through (module docstring)."""
    fabric = fabric_of(topology, [node.id for node in topology.nodes if node.is_gpu])
    n, nodes, arcs = fabric.n_ranks, fabric.n_nodes, fabric.n_arcs
    n_vars = 1 + arcs + n * arcs  # x, c', one flow per sink rank
    eq_rows, eq_cols, eq_vals, ub_rows, ub_cols, ub_vals = [], [], [], [], [], []
    row = 0
    for v in range(n):
        base = 1 + arcs + v * arcs
        for node in range(nodes):
            if node == v:
                continue
            for arc in np.flatnonzero(fabric.head == node):
                eq_rows.append(row), eq_cols.append(base + arc), eq_vals.append(1.0)
            for arc in np.flatnonzero(fabric.tail == node):
                eq_rows.append(row), eq_cols.append(base + arc), eq_vals.append(-1.0)
            if node < n:  # s* feeds every rank x
                eq_rows.append(row), eq_cols.append(0), eq_vals.append(1.0)
            row += 1
        for arc in range(arcs):
            i = v * arcs + arc
            ub_rows += [i, i]
            ub_cols += [base + arc, 1 + arc]
            ub_vals += [1.0, -1.0]
    for w in range(n, nodes):  # switches balanced
        for arc in np.flatnonzero(fabric.head == w):
            eq_rows.append(row), eq_cols.append(1 + arc), eq_vals.append(1.0)
        for arc in np.flatnonzero(fabric.tail == w):
            eq_rows.append(row), eq_cols.append(1 + arc), eq_vals.append(-1.0)
        row += 1
    objective = np.zeros(n_vars)
    objective[0] = -1.0
    result = linprog(objective, A_ub=sp.csr_matrix((ub_vals, (ub_rows, ub_cols)), shape=(n * arcs, n_vars)),
                     b_ub=np.zeros(n * arcs), A_eq=sp.csr_matrix((eq_vals, (eq_rows, eq_cols)), shape=(row, n_vars)),
                     b_eq=np.zeros(row), bounds=[(0, None)] + [(0, g) for g in fabric.gbps] + [(0, None)] * (n * arcs),
                     method="highs")
    return -result.fun * n / 8.0


def draw(base: Topology, rng: np.random.Generator) -> Topology:
    factors = np.where(rng.random(len(base.links)) < 0.3, rng.uniform(0.05, 1.0, len(base.links)), 1.0)
    return base.with_capacities(base.capacities_gbps * factors)


def run(base: Topology, seed: int, trials: int, exact: bool) -> str:
    rng = np.random.default_rng(seed)
    fails, vs_cut, vs_exact, balance, times = 0, [], [], [], []
    for _ in range(trials):
        topology = draw(base, rng)
        start = time.perf_counter()
        try:
            schedule = optimize(topology, "allgather").schedule
            validate(schedule, topology)
        except MCCLError:
            fails += 1
            continue
        times.append(time.perf_counter() - start)
        achieved = schedule.meta.achieved_gbs
        vs_cut.append(1 - achieved / allgather_cut_bound(topology).algbw_gbs)
        balance.append(schedule.meta.stat("switch_balance_loss") > 0)
        if exact:
            vs_exact.append(1 - achieved / passthrough_optimum(topology))
    cut, ms = np.array(vs_cut), 1e3 * np.array(times)
    line = (f"{base.name:28s} seed {seed}: fails {fails}/{trials}  loss vs cut median {np.median(cut):.2%} "
            f"p95 {np.quantile(cut, 0.95):.2%} max {cut.max():.2%}")
    if exact:
        ex = np.array(vs_exact)
        line += f"  vs exact median {np.median(ex):.2%} p95 {np.quantile(ex, 0.95):.2%} max {ex.max():.2%}"
    return line + f"  lower-rate splits {int(np.sum(balance))}  solve median {np.median(ms):.0f} ms max {ms.max():.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--big", type=int, default=3, help="128-GPU draws to time (0: none)")
    args = parser.parse_args()
    for base in (rail_optimized(1, 2, 4), spine_leaf(2, 2, 2, 2, 100, 50)):
        for seed in (int(s) for s in args.seeds.split(",")):
            print(run(base, seed, args.trials, exact=True), flush=True)
    big = rail_optimized(1, 16, 8)
    for seed in range(args.big):
        topology = draw(big, np.random.default_rng(seed))
        start = time.perf_counter()
        schedule = optimize(topology, "allgather").schedule
        elapsed = time.perf_counter() - start
        validate(schedule, topology)
        print(f"{big.name} seed {seed}: {elapsed:.2f} s  loss vs cut {schedule.meta.stat('rounding_gap'):.3%}  "
              f"careful split {schedule.meta.stat('switch_removal_careful'):.0f}", flush=True)


if __name__ == "__main__":
    main()
