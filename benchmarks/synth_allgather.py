"""Benchmark: AllGather tree-packing solve time, cold and warm, on HPN rail-optimized fabrics.

    python benchmarks/synth_allgather.py --quick                  # 16-64 GPUs, 1 repeat
    python benchmarks/synth_allgather.py --sizes 16,32,64,128,256,512 --repeat 3
    python benchmarks/synth_allgather.py --maxflow                # max-flow library comparison

For each size (GPUs) and scenario (healthy, Fail1, Fail2, Fail3) it solves cold and warm
(warm from the healthy schedule of the same size), takes the median of ``--repeat`` runs,
and reports throughput (optimum, achieved), rounding loss, max depth and the warm/cold
speed-up. Each size runs in a child process so that its peak resident memory is its own
(``ru_maxrss``). Times are wall clock and CPU time of the solving process (the
machine may be shared; the warm/cold speed-up is a ratio of CPU times). Writes CSV and a PNG plot next to ``--out`` (default
``benchmarks/results/synth_allgather``).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

SIZES = {16: (1, 2, 8), 32: (1, 4, 8), 64: (1, 8, 8), 128: (1, 16, 8), 256: (1, 32, 8), 512: (2, 32, 8)}
SCENARIOS = ("healthy", "Fail1", "Fail2", "Fail3")


def run_size(gpus: int, repeat: int) -> list[dict]:
    """All scenarios of one size, in this process (called in a child)."""
    from mccl.schedule import validate
    from mccl.synth.treepack import synthesize
    from mccl.topology import apply_fault, rail_optimized

    base = rail_optimized(*SIZES[gpus])
    rows = []
    healthy = synthesize(base)
    for scenario in SCENARIOS:
        topology = base if scenario == "healthy" else apply_fault(base, scenario)
        for mode in ("cold", "warm"):
            times, cpu, schedule = [], [], None
            for _ in range(repeat):
                start, start_cpu = time.perf_counter(), time.process_time()
                schedule = synthesize(topology, previous=healthy if mode == "warm" else None).schedule
                times.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
            validate(schedule, topology)
            meta = schedule.meta
            rows.append({
                "gpus": gpus, "scenario": scenario, "mode": mode, "median_s": statistics.median(times),
                "median_cpu_s": statistics.median(cpu),
                "optimum_gbs": meta.throughput_bound_gbs, "achieved_gbs": meta.achieved_gbs,
                "rounding_gap": meta.stat("rounding_gap"), "chunks": int(meta.stat("trees_per_source")),
                "max_depth": int(meta.stat("max_depth")), "max_flows": int(meta.stat("max_flows")),
                "kept_fraction": meta.stat("kept_fraction", float("nan")),
                "reused_trees": meta.stat("reused_trees_fraction", float("nan")),
                "warm_repair": meta.stat("warm_repair", float("nan")),  # 1: kept + repaired, 0: fell back to cold packing
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            })
    return rows


def maxflow_comparison(repeat: int) -> list[dict]:
    """One max-flow on a random 2,000-node / 40,000-arc graph, by library (build and solve timed apart)."""
    import numpy as np

    rng = np.random.default_rng(7)
    nodes, arcs = 2000, 40000
    tail = rng.integers(0, nodes, arcs)
    head = (tail + rng.integers(1, nodes, arcs)) % nodes
    caps = rng.integers(1, 1000, arcs)
    results = []

    def timed(label: str, build, solve) -> None:
        builds, solves, value = [], [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            graph = build()
            t1 = time.perf_counter()
            value = solve(graph)
            t2 = time.perf_counter()
            builds.append(t1 - t0)
            solves.append(t2 - t1)
        results.append({"library": label, "build_ms": 1e3 * statistics.median(builds),
                        "solve_ms": 1e3 * statistics.median(solves), "flow": int(value)})

    from ortools.graph.python import max_flow

    def ortools_build():
        solver = max_flow.SimpleMaxFlow()
        solver.add_arcs_with_capacity(tail, head, caps)
        return solver

    def ortools_solve(solver):
        solver.solve(0, nodes - 1)
        return solver.optimal_flow()

    timed("ortools SimpleMaxFlow", ortools_build, ortools_solve)
    solver = ortools_build()
    ortools_solve(solver)
    t0 = time.perf_counter()
    for _ in range(repeat):
        solver.set_arc_capacity(0, int(caps[0]) + 1)  # change in place, re-solve: no rebuild
        ortools_solve(solver)
    results.append({"library": "ortools re-solve after set_arc_capacity", "build_ms": 0.0,
                    "solve_ms": 1e3 * (time.perf_counter() - t0) / repeat, "flow": int(solver.optimal_flow())})

    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    def scipy_build():
        graph = csr_matrix((caps.astype(np.int32), (tail, head)), shape=(nodes, nodes))
        graph.sum_duplicates()
        return graph

    timed("scipy maximum_flow (dinic)", scipy_build, lambda g: maximum_flow(g, 0, nodes - 1, method="dinic").flow_value)
    timed("scipy maximum_flow (edmonds_karp)", scipy_build,
          lambda g: maximum_flow(g, 0, nodes - 1, method="edmonds_karp").flow_value)
    try:
        import igraph
    except ImportError:
        results.append({"library": "igraph (not installed)", "build_ms": float("nan"), "solve_ms": float("nan"), "flow": -1})
    else:
        timed("igraph Graph.maxflow", lambda: igraph.Graph(n=nodes, edges=list(zip(tail.tolist(), head.tolist(), strict=True)),
                                                          directed=True),
              lambda g: g.maxflow_value(0, nodes - 1, capacity=caps.tolist()))
    try:
        import networkx
    except ImportError:
        results.append({"library": "networkx (not installed)", "build_ms": float("nan"), "solve_ms": float("nan"), "flow": -1})
    else:
        def nx_build():
            graph = networkx.DiGraph()
            for a, b, c in zip(tail.tolist(), head.tolist(), caps.tolist(), strict=True):
                cap = graph[a][b]["capacity"] + c if graph.has_edge(a, b) else c
                graph.add_edge(a, b, capacity=cap)
            return graph

        timed("networkx preflow_push", nx_build, lambda g: networkx.maximum_flow_value(g, 0, nodes - 1))
    flows = {row["flow"] for row in results if row["flow"] >= 0}
    if len(flows) != 1:
        raise SystemExit(f"max-flow libraries disagree: {flows}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,32,64,128", help="GPU counts, from " + ",".join(map(str, SIZES)))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="16,32,64 GPUs, 1 repeat")
    parser.add_argument("--maxflow", action="store_true", help="only the max-flow library comparison")
    parser.add_argument("--out", default="benchmarks/results/synth_allgather")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_size(args.child, args.repeat)))
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.maxflow:
        rows = maxflow_comparison(max(args.repeat, 5))
        print(f"{'library':45s} {'build ms':>9s} {'solve ms':>9s} {'flow':>8s}")
        for row in rows:
            print(f"{row['library']:45s} {row['build_ms']:9.2f} {row['solve_ms']:9.2f} {row['flow']:8d}")
        write_csv(out.with_name(out.name + "_maxflow.csv"), rows)
        return
    sizes = [16, 32, 64] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeat = 1 if args.quick else args.repeat
    rows: list[dict] = []
    for gpus in sizes:
        if gpus not in SIZES:
            raise SystemExit(f"unknown size {gpus}; choose from {sorted(SIZES)}")
        child = subprocess.run([sys.executable, __file__, "--child", str(gpus), "--repeat", str(repeat)],
                               check=True, capture_output=True, text=True)
        got = json.loads(child.stdout)
        rows.extend(got)
        cold = {row["scenario"]: row["median_cpu_s"] for row in got if row["mode"] == "cold"}
        for row in got:
            row["warm_speedup"] = cold[row["scenario"]] / row["median_cpu_s"] if row["mode"] == "warm" else float("nan")
            print(f"{row['gpus']:4d} {row['scenario']:8s} {row['mode']:5s} {row['median_s']:8.3f} s wall "
                  f"{row['median_cpu_s']:8.3f} s cpu  "
                  f"opt {row['optimum_gbs']:8.2f} GB/s  achieved {row['achieved_gbs']:8.2f}  "
                  f"loss {100 * row['rounding_gap']:6.3f}%  k {row['chunks']:2d}  depth {row['max_depth']:3d}  "
                  f"flows {row['max_flows']:6d}  speedup {row['warm_speedup']:5.2f}  "
                  f"kept {row['kept_fraction']:.2f}  whole {row['reused_trees']:.2f}  repair {row['warm_repair']:.0f}  "
                  f"rss {row['peak_rss_mib']:7.1f} MiB", flush=True)
    write_csv(out.with_suffix(".csv"), rows)
    _plot(out.with_suffix(".png"), rows)


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for scenario in SCENARIOS:
        for mode, style in (("cold", "-"), ("warm", "--")):
            points = [(r["gpus"], r["median_s"]) for r in rows if r["scenario"] == scenario and r["mode"] == mode]
            if points:
                ax.plot(*zip(*points, strict=True), style, marker="o", label=f"{scenario} {mode}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs (rail_optimized)")
    ax.set_ylabel("solve time, s (median)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
