"""Benchmark: AllToAll column generation vs the compact LP, cold vs warm (issue 4).

For rail-optimized HPN fabrics (8 GPUs per host, up to 32 hosts per segment) at
the chosen sizes, healthy and under Fail1/Fail2/Fail3: the cold synthesis time,
the warm re-synthesis time from the healthy schedule, the compact arc-based LP's
time on the same instance (while it fits its limit), the LP bound and the
rounded schedule's algbw with its gap. Times are medians of ``--repeats`` runs,
wall and CPU time of this process (the machine is shared; CPU time is steadier).

Two warm starts: "warm" passes the healthy synthesis result this process made,
so the synthesizer restarts from the solver state its result carries (columns, master
basis, LP flow and chunks, ``mccl.synth.alltoall.state``: a fault on a tight
link is repaired from the flow, ``mccl.synth.alltoall.repair``); "file warm" passes the same
schedule read back from its JSON text, which carries only routes
(``--file-warm-max-gpus`` bounds it). "back": when the fault clears, the healthy
fabric warm from the faulty warm schedule (a recovery), against the healthy cold time. Writes a CSV and a PNG next to each other and
prints a table.

    python benchmarks/synth_alltoall.py --quick            # 16 and 32 GPUs, 1 repeat
    python benchmarks/synth_alltoall.py --sizes 16,32,64,128,256,512 --repeats 3
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.errors import SynthesisError
from mccl.schedule import Schedule, dumps_schedule, loads_schedule, validate
from mccl.synth.alltoall import compact_lp, synthesize
from mccl.topology import Topology, apply_fault, rail_optimized

FAULTS = ("healthy", "Fail1", "Fail2", "Fail3")


def fabric(gpus: int) -> Topology:
    hosts = gpus // 8
    if hosts <= 32:
        return rail_optimized(1, hosts, 8)
    return rail_optimized(hosts // 32, 32, 8)


def outcome(prefix: str, schedule: Schedule | None, stats: tuple[str, ...]) -> dict[str, float | None]:
    """CSV columns ``<prefix>_lp_gbs``, ``<prefix>_algbw_gbs`` and ``<prefix>_<stat>`` of one warm run
    (all None when it did not run). A file warm start's ``fallback`` / ``abandoned_pivots`` are its
    ``warm_fallback`` / ``warm_abandoned_pivots`` stats."""
    names = {"fallback": "warm_fallback", "abandoned_pivots": "warm_abandoned_pivots"}
    meta = schedule.meta if schedule is not None else None
    columns: dict[str, float | None] = {
        f"{prefix}_lp_gbs": meta.throughput_bound_gbs if meta else None,
        f"{prefix}_algbw_gbs": meta.achieved_gbs if meta else None,
    }
    for stat in stats:
        columns[f"{prefix}_{stat}"] = meta.stat(names.get(stat, stat)) if meta else None
    return columns


def timed(function, repeats: int):  # type: ignore[no-untyped-def]
    """Median wall time, median CPU time of this process (s), and the last result."""
    times, cpu, result = [], [], None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = function()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(times), statistics.median(cpu), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,32,64,128,256,512")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--repeats-large", type=int, default=1, help="repeats at 256 GPUs and more")
    parser.add_argument("--compact-limit", type=float, default=600.0, help="seconds for one compact LP solve")
    parser.add_argument("--compact-max-gpus", type=int, default=512, help="largest size to run the compact LP at")
    parser.add_argument("--file-warm-max-gpus", type=int, default=512,
                        help="largest size to time the warm start from the schedule file at")
    parser.add_argument("--quick", action="store_true", help="16 and 32 GPUs, one repeat")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/synth_alltoall.csv"))
    args = parser.parse_args()
    sizes = [16, 32] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeats = 1 if args.quick else args.repeats
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    compact_fits = True
    header = (f"{'GPUs':>5} {'scenario':>8} {'cold s':>8} {'warm s':>8} {'cold/warm':>9} {'cpu c/w':>8} "
              f"{'cold cpu':>8} {'warm cpu':>8} {'file cpu':>8} {'c/file':>6} {'compact s':>9} "
              f"{'compact/cold':>12} {'LP GB/s':>9} {'algbw':>8} {'gap %':>6} {'columns':>8} {'maxrss MiB':>10}")
    print(header, flush=True)
    for gpus in sizes:
        reps = repeats if gpus < 256 else min(repeats, args.repeats_large)
        healthy = fabric(gpus)
        healthy_result = synthesize(healthy)  # carries its solver state (warm_state)
        healthy_file = loads_schedule(dumps_schedule(healthy_result.schedule))  # routes only, no solver state
        for scenario in FAULTS:
            topo = healthy if scenario == "healthy" else apply_fault(healthy, scenario)
            cold_s, cold_cpu, cold = timed(lambda topo=topo: synthesize(topo).schedule, reps)
            validate(cold, topo)
            if scenario == "healthy":
                healthy_cold_cpu = cold_cpu
            warm_s = warm_cpu = warm = None
            if scenario != "healthy":
                warm_s, warm_cpu, warm_result = timed(
                    lambda topo=topo, prev=healthy_result: synthesize(topo, previous=prev), reps)
                warm = warm_result.schedule
                validate(warm, topo)
            back_cpu = back = None
            if warm is not None:  # the fault clears: back to healthy, warm from the faulty schedule
                _, back_cpu, back = timed(
                    lambda prev=warm_result, fabric=healthy: synthesize(fabric, previous=prev).schedule, reps)
                validate(back, healthy)
            file_s = file_cpu = from_file = None
            if scenario != "healthy" and gpus <= args.file_warm_max_gpus:
                file_s, file_cpu, from_file = timed(
                    lambda topo=topo, prev=healthy_file: synthesize(topo, previous=prev).schedule, 1)
                validate(from_file, topo)
            compact_s = compact_cpu = compact_gbs = None
            if compact_fits and gpus <= args.compact_max_gpus:
                try:
                    compact_s, compact_cpu, result = timed(lambda topo=topo: compact_lp(topo, time_limit_s=args.compact_limit), 1)
                    compact_gbs = result.algbw_gbs
                except (SynthesisError, MemoryError):
                    compact_fits = False  # larger instances will not fit either
            meta = cold.meta
            row = {
                "gpus": gpus, "scenario": scenario, "cold_s": cold_s, "warm_s": warm_s,
                "cold_over_warm": cold_s / warm_s if warm_s else None,
                "cold_cpu_s": cold_cpu, "warm_cpu_s": warm_cpu,
                "cold_over_warm_cpu": cold_cpu / warm_cpu if warm_cpu else None,
                "file_warm_s": file_s, "file_warm_cpu_s": file_cpu,
                "cold_over_file_warm_cpu": cold_cpu / file_cpu if file_cpu else None,
                "compact_s": compact_s, "compact_cpu_s": compact_cpu,
                "compact_over_cold": compact_s / cold_s if compact_s else None,
                "compact_over_cold_cpu": compact_cpu / cold_cpu if compact_cpu else None,
                "compact_gbs": compact_gbs, "lp_gbs": meta.throughput_bound_gbs, "algbw_gbs": meta.achieved_gbs,
                "gap": meta.stat("gap"), "columns": meta.stat("columns"), "repeats": reps,
                **outcome("warm", warm, ("optimal", "restarted", "iterations", "gap", "repaired", "repair_declined",
                                         "repaired_pairs", "rerounded_pairs")),
                "back_cpu_s": back_cpu,
                **outcome("back", back, ("optimal", "repaired", "iterations", "gap")),
                **outcome("file_warm", from_file, ("optimal", "fallback", "abandoned_pivots", "iterations")),
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
            rows.append(row)

            def fmt(value, spec):  # type: ignore[no-untyped-def]
                return format(value, spec) if value is not None else "-"

            print(f"{gpus:>5} {scenario:>8} {cold_s:>8.2f} {fmt(warm_s, '>8.2f')} {fmt(row['cold_over_warm'], '>9.1f')} "
                  f"{fmt(row['cold_over_warm_cpu'], '>8.1f')} {cold_cpu:>8.2f} {fmt(warm_cpu, '>8.2f')} "
                  f"{fmt(file_cpu, '>8.2f')} {fmt(row['cold_over_file_warm_cpu'], '>6.1f')} "
                  f"{fmt(compact_s, '>9.2f')} {fmt(row['compact_over_cold'], '>12.1f')} {meta.throughput_bound_gbs:>9.2f} "
                  f"{meta.achieved_gbs:>8.2f} {100 * meta.stat('gap'):>6.2f} {meta.stat('columns'):>8.0f} "
                  f"{row['maxrss_mib']:>10.0f}", flush=True)
            if warm is not None:
                print(f"      warm: LP {warm.meta.throughput_bound_gbs:.6f} GB/s, optimal {warm.meta.stat('optimal'):.0f}, "
                      f"repaired {warm.meta.stat('repaired'):.0f} (declined {warm.meta.stat('repair_declined'):.0f}), "
                      f"pivots {warm.meta.stat('iterations'):.0f}, re-routed / re-rounded pairs "
                      f"{warm.meta.stat('repaired_pairs'):.0f} / {warm.meta.stat('rerounded_pairs'):.0f}, "
                      f"algbw {warm.meta.achieved_gbs:.2f} GB/s, gap {100 * warm.meta.stat('gap'):.2f} %", flush=True)
            if back is not None:
                print(f"      back to healthy from it: {back_cpu:.3f} s CPU (healthy cold {healthy_cold_cpu:.3f} s, "
                      f"{healthy_cold_cpu / back_cpu:.1f}x), LP {back.meta.throughput_bound_gbs:.6f} GB/s, "
                      f"repaired {back.meta.stat('repaired'):.0f}, pivots {back.meta.stat('iterations'):.0f}, "
                      f"gap {100 * back.meta.stat('gap'):.2f} %", flush=True)
            if from_file is not None:
                print(f"      file warm: LP {from_file.meta.throughput_bound_gbs:.6f} GB/s (cold "
                      f"{meta.throughput_bound_gbs:.6f}), fallback {from_file.meta.stat('warm_fallback'):.0f}, "
                      f"abandoned pivots {from_file.meta.stat('warm_abandoned_pivots'):.0f}, "
                      f"pivots {from_file.meta.stat('iterations'):.0f}", flush=True)
    write_csv(args.out, rows)
    _plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for scenario in FAULTS:
        mine = [row for row in rows if row["scenario"] == scenario]
        axis.plot([r["gpus"] for r in mine], [r["cold_s"] for r in mine], marker="o", label=f"CG cold {scenario}")
        warm = [r for r in mine if r["warm_s"]]
        if warm:
            axis.plot([r["gpus"] for r in warm], [r["warm_s"] for r in warm], marker="x", linestyle="--",
                      label=f"CG warm {scenario}")
    compact = [row for row in rows if row["compact_s"] and row["scenario"] == "healthy"]
    if compact:
        axis.plot([r["gpus"] for r in compact], [r["compact_s"] for r in compact], marker="s", color="k",
                  label="compact LP healthy")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("GPUs (rail_optimized, 8 per host)")
    axis.set_ylabel("solve time (s)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
