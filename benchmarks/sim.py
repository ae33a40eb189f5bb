"""Benchmark of the flow-level simulator and the analytic α-β model (issue 5).

    .venv/bin/python benchmarks/sim.py            # full run (several minutes on 2 shared cores)
    .venv/bin/python benchmarks/sim.py --quick    # the small cases only

Bars (issue 5): one 128 MB AllGather simulated with a synthesized schedule on 16
GPUs ≤ 1 s and on 128 GPUs ≤ 20 s; with a ring on 512 GPUs ≤ 20 s; the analytic
path on 2048 GPUs ≤ 1 s. "128 MB" is per source (S = n × 128 MiB), as in the
paper's figures. Simulation time is the wall time of ``simulate`` (lowering the
schedule included), with the CPU time of the process beside it (less sensitive to
other work on a shared machine); building the schedule is reported apart. Each small case is
the median of ``--repeat`` runs; cases over ~5 s run once.

Synthesized schedules come from ``mccl.synth.optimize``; while it raises "not
available", those rows say so and a stand-in of the same shape (hierarchical
broadcast trees, ``benchmarks/standin.py``) is measured instead, healthy and under
Fail2 (asymmetric, hence more events). Writes a CSV and a PNG next to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)
from standin import hierarchical_allgather  # noqa: E402

from mccl.errors import SynthesisError  # noqa: E402
from mccl.schedule import Collective, Schedule  # noqa: E402
from mccl.sim import Job, SimOptions, evaluate, simulate  # noqa: E402
from mccl.synth import optimize  # noqa: E402
from mccl.synth.ring import nccl_ring
from mccl.topology import Topology, apply_fault, rail_optimized  # noqa: E402

MiB = 2**20
console = Console(highlight=False, width=160)
COLUMNS = ("case", "gpus", "chunks", "transfers", "build_s", "sim_s", "cpu_s", "events", "batches", "events_per_s",
           "algbw_sim_gbs", "algbw_analytic_gbs", "bar", "note")


def hpn(gpus: int, fault: str | None = None) -> Topology:
    hosts = gpus // 8
    segments = max(1, hosts // 32)
    fabric = rail_optimized(segments, hosts // segments, 8)
    return apply_fault(fabric, fault) if fault else fabric


def measure(case: str, fabric: Topology, make: Callable[[], Schedule], chunks: int, repeat: int,
            bar_s: float | None = None, options: SimOptions | None = None) -> dict[str, object]:
    start = time.perf_counter()
    schedule = make()
    build = time.perf_counter() - start
    n = schedule.n_ranks
    size = n * 128 * MiB
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        cpu = time.process_time()
        result = simulate(fabric, [Job.single(schedule, size)], options=options or SimOptions())
        cpus.append(time.process_time() - cpu)
        walls.append(result.stats.wall_s)
        if result.stats.wall_s > 5:
            break
    assert result is not None
    wall = statistics.median(walls)
    analytic = evaluate(schedule, fabric, size)
    verdict = "" if bar_s is None else (f"<= {bar_s:g} s: " + ("met" if wall <= bar_s else "NOT met"))
    return {"case": case, "gpus": n, "chunks": chunks, "transfers": len(schedule.transfers), "build_s": build,
            "sim_s": wall, "cpu_s": statistics.median(cpus), "events": result.stats.events, "batches": result.stats.batches,
            "events_per_s": result.stats.events / wall, "algbw_sim_gbs": result.only().algbw_gbs,
            "algbw_analytic_gbs": analytic.algbw_gbs, "bar": verdict, "note": f"median of {len(walls)}"}


def missing(case: str, gpus: int, why: str) -> dict[str, object]:
    return {"case": case, "gpus": gpus, "note": why}


def analytic_row(gpus: int, bar_s: float | None) -> dict[str, object]:
    fabric = hpn(gpus)
    start = time.perf_counter()
    schedule = nccl_ring(fabric, Collective.ALLGATHER, channels=1)
    build = time.perf_counter() - start
    times, cpus = [], []
    for _ in range(3):
        start, cpu = time.perf_counter(), time.process_time()
        result = evaluate(schedule, fabric, gpus * 128 * MiB)
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    wall = statistics.median(times)
    verdict = "" if bar_s is None else (f"<= {bar_s:g} s: " + ("met" if wall <= bar_s else "NOT met"))
    return {"case": "analytic evaluate, 1-channel ring", "gpus": gpus, "chunks": 1, "transfers": len(schedule.transfers),
            "build_s": build, "sim_s": wall, "cpu_s": statistics.median(cpus), "algbw_analytic_gbs": result.algbw_gbs, "bar": verdict,
            "note": "median of 3"}


def synthesized(gpus: int, fault: str | None, repeat: int, bar_s: float | None) -> list[dict[str, object]]:
    fabric = hpn(gpus, fault)
    label = f"AllGather synthesized{' ' + fault if fault else ''}"
    rows: list[dict[str, object]] = []
    try:
        rows.append(measure(label, fabric, lambda: optimize(fabric, Collective.ALLGATHER).schedule, 0, repeat, bar_s))
    except SynthesisError as error:
        if "not available" not in str(error):
            raise
        rows.append(missing(label, gpus, "not yet available (optimize)"))
    rows.append(measure(f"AllGather trees stand-in{' ' + fault if fault else ''}", fabric,
                        lambda: hierarchical_allgather(fabric, 4), 4, repeat, bar_s))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small cases only")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sim"))
    args = parser.parse_args()
    rows: list[dict[str, object]] = []

    def add(new: list[dict[str, object]] | dict[str, object]) -> None:
        for row in new if isinstance(new, list) else [new]:
            rows.append(row)
            console.print({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()})

    start, cpu = time.perf_counter(), time.process_time()  # numba kernels: compiled, or loaded from the cache
    tiny = hpn(16)
    simulate(tiny, [Job.single(nccl_ring(tiny, "allgather", channels=1), 16 * MiB)])
    add({"case": "warm-up: numba kernels compiled or loaded from cache", "sim_s": time.perf_counter() - start,
         "cpu_s": time.process_time() - cpu, "note": "once per process; not in the rows below"})
    for gpus, bar in ((16, 1.0), (128, 20.0)):
        if gpus > 16 and args.quick:
            break
        add(synthesized(gpus, None, args.repeat, bar))
        add(synthesized(gpus, "Fail2", args.repeat, bar))
    ring_sizes = (16, 128) if args.quick else (16, 128, 512)
    for gpus in ring_sizes:
        fabric = hpn(gpus)
        bar = 20.0 if gpus == 512 else None
        add(measure("AllGather NCCL rings (8 channels)", fabric, lambda f=fabric: nccl_ring(f, "allgather"), 1,
                    args.repeat, bar))
        if gpus >= 128:
            add(measure("AllGather ring (1 channel)", fabric,
                        lambda f=fabric: nccl_ring(f, "allgather", channels=1), 1, args.repeat, bar))
    for gpus in (16, 32, 64) if args.quick else (16, 32, 64, 128, 256):
        fabric = hpn(gpus)
        add(measure("scaling: ring (1 channel)", fabric, lambda f=fabric: nccl_ring(f, "allgather", channels=1), 1,
                    args.repeat))
    for chunks in (1, 2, 4, 8):
        fabric = hpn(32)
        add(measure("scaling: chunks, ring (1 channel)", fabric,
                    lambda f=fabric, k=chunks: nccl_ring(f, "allgather", channels=1, chunks=k), chunks, args.repeat))
    fabric16 = hpn(16)
    for slices in (1, 2, 4, 8):  # store-and-forward (1) vs pipelined slices of each chunk (mccl.sim.compiled)
        add(measure(f"slices: AllGather synthesized, slices={slices}", fabric16,
                    lambda: optimize(fabric16, Collective.ALLGATHER).schedule, 0, args.repeat,
                    options=SimOptions(slices=slices)))
    for gpus in (128, 512) if args.quick else (128, 512, 2048):
        add(analytic_row(gpus, 1.0 if gpus == 2048 else None))
    write(rows, args.out)


def write(rows: list[dict[str, object]], out: Path) -> None:
    write_csv(out.with_suffix(".csv"), rows, COLUMNS)
    console.print(f"benchmarks/sim.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    console.print("| " + " | ".join(COLUMNS) + " |")
    console.print("|" + "---|" * len(COLUMNS))
    for row in rows:
        console.print("| " + " | ".join(f"{row[c]:.4g}" if isinstance(row.get(c), float) else str(row.get(c, ""))
                                        for c in COLUMNS) + " |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    scaling = [r for r in rows if r["case"] == "scaling: ring (1 channel)"]
    left.loglog([r["gpus"] for r in scaling], [r["sim_s"] for r in scaling], marker="o", label="sim time")
    left.set_xlabel("GPUs (1-channel ring AllGather, 128 MiB per source)")
    left.set_ylabel("seconds")
    left.grid(alpha=0.3)
    chunked = [r for r in rows if r["case"].startswith("scaling: chunks")]
    right.plot([r["chunks"] for r in chunked], [r["sim_s"] for r in chunked], marker="o")
    right.set_xlabel("chunks per block (32 GPUs)")
    right.set_ylabel("seconds")
    right.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out.with_suffix(".png"), dpi=110)
    console.print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
