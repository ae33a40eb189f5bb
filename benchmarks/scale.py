"""Benchmark: building and α-β-evaluating NCCL-style schedules at 128–2048 GPUs, before vs after (issue 11, §5).

Two sides in one run, each case in a fresh interpreter of its own: ``after`` imports mccl from this
checkout's ``src``; ``before`` from ``--before-src`` (main's ``src``: the transfer-by-transfer
construction). Per case and repeat, CPU time (``time.process_time``; the machine is shared) of

* ``build``: ``optimize(topology, collective, ranks, method=...)`` (``ring.nccl``, 8 channels, for
  AllGather / ReduceScatter / AllReduce; ``alltoall.direct`` with PXN for AllToAll), on a topology
  built fresh for the repeat (so no route search is reused across repeats);
* ``eval``: ``mccl.sim.analytic.evaluate(schedule, topology, 1 GiB)``;

and the worker's peak resident memory (``ru_maxrss``; the imports alone are ~``base_rss_mb``).
Fabrics: HPN rail-optimized segments of 128 GPUs (``rail_optimized(gpus // 128, 16, 8)``). Group
cases (the Fig. 14 shapes on a 2048-GPU fabric): ``tp8`` (the 8 GPUs of host 0), ``dp8`` (rail 0
of hosts 0–7), ``ep64`` (hosts 0–7), one group cold; ``sweep``: every such group of the fabric
in turn on one topology (the shared route cache at work), CPU per group.

Both sides' algbw are printed: the α-β result must not change. Writes a CSV and a PNG.

    python benchmarks/scale.py --quick                                   # 128 GPUs, after only
    python benchmarks/scale.py --before-src /work/main/src --before-single allgather@2048
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

KINDS = {"allgather": "ring.nccl", "reducescatter": "ring.nccl", "allreduce": "ring.nccl", "alltoall": "alltoall.direct"}
GROUPS = {"tp8": ("allgather", "reducescatter"), "dp8": ("allgather", "reducescatter"), "ep64": ("alltoall",)}
SIZE_BYTES = 2**30
HERE = Path(__file__).resolve().parent


def group_ranks(shape: str, index: int) -> list[str]:
    """The ``index``-th group of ``shape`` on a fabric of 8-GPU hosts (GPU ``8h + r`` is rail r of host h)."""
    if shape == "tp8":
        return [f"gpu{8 * index + r}" for r in range(8)]
    if shape == "dp8":  # rail index % 8 of the 8 hosts of block index // 8
        block, rail = divmod(index, 8)
        return [f"gpu{8 * (8 * block + h) + rail}" for h in range(8)]
    return [f"gpu{64 * index + i}" for i in range(64)]


def group_count(shape: str, gpus: int) -> int:
    return gpus // 8 if shape in ("tp8", "dp8") else gpus // 64


def worker(case: dict) -> dict:
    """One case on one side (runs in its own interpreter; mccl comes from PYTHONPATH)."""
    import gc
    import resource
    import time

    from mccl.sim import evaluate
    from mccl.synth import optimize
    from mccl.topology import rail_optimized

    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gpus, collective = case["gpus"], case["collective"]
    method = KINDS[collective]
    options = {"channels": 8} if method == "ring.nccl" else {}
    topo_s, build_s, eval_s, algbw, transfers = [], [], [], None, None
    for _ in range(case["repeats"]):
        gc.collect()
        started = time.process_time()
        topology = rail_optimized(gpus // 128, 16, 8)
        topo_s.append(time.process_time() - started)
        if case["shape"] == "sweep":
            shape = case["group"]
            count = group_count(shape, gpus)
            started = time.process_time()
            for index in range(count):
                result = optimize(topology, collective, group_ranks(shape, index), method=method, **options)
                evaluate(result.schedule, topology, SIZE_BYTES)
            build_s.append((time.process_time() - started) / count)
            eval_s.append(0.0)
            continue
        ranks = None if case["shape"] == "fabric" else group_ranks(case["shape"], 0)
        started = time.process_time()
        result = optimize(topology, collective, ranks, method=method, **options)
        build_s.append(time.process_time() - started)
        started = time.process_time()
        evaluation = evaluate(result.schedule, topology, SIZE_BYTES)
        eval_s.append(time.process_time() - started)
        algbw, transfers = evaluation.algbw_gbs, len(result.schedule.transfers)
        del result, evaluation
    return {"topo_s": topo_s, "build_s": build_s, "eval_s": eval_s, "algbw_gbs": algbw, "transfers": transfers,
            "base_rss_mb": base_rss, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_side(src: Path, case: dict, timeout_s: float) -> dict | None:
    """``case`` in a fresh interpreter with mccl from ``src``; None when it failed or ran out of time."""
    env = dict(os.environ, PYTHONPATH=str(src))
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(case)],
                              env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"  {case}: over {timeout_s:.0f} s, left out", flush=True)
        return None
    if done.returncode != 0:
        print(f"  {case}: failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def cases(args: argparse.Namespace) -> list[dict]:
    chosen = []
    for gpus in args.gpus:
        for collective in args.collectives:
            chosen.append({"shape": "fabric", "group": "", "gpus": gpus, "collective": collective})
    if not args.no_groups:
        for shape, collectives in GROUPS.items():
            for collective in collectives:
                chosen.append({"shape": shape, "group": shape, "gpus": args.group_fabric, "collective": collective})
                chosen.append({"shape": "sweep", "group": shape, "gpus": args.group_fabric, "collective": collective})
    return chosen


def label(case: dict) -> str:
    return f"{case['collective']}@{case['gpus']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[128, 512, 1024, 2048])
    parser.add_argument("--collectives", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group-fabric", type=int, default=2048, help="GPUs of the fabric the group cases run on")
    parser.add_argument("--no-groups", action="store_true")
    parser.add_argument("--before-src", type=Path, help="main's src directory (omit: after only)")
    parser.add_argument("--before-max-gpus", type=int, default=1024,
                        help="fabric cases above this many GPUs skip the before side (its memory: ~280 B per transfer)")
    parser.add_argument("--before-single", nargs="*", default=[],
                        help="collective@gpus cases run on the before side anyway, once (e.g. allgather@2048)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per case and side")
    parser.add_argument("--quick", action="store_true", help="128 GPUs, 1 repeat, no group cases")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "scale")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.quick:
        args.gpus, args.repeats, args.no_groups = [128], 1, True

    from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

    after_src = HERE.parent / "src"
    rows = []
    print(f"{'case':<28} {'side':<6} {'reps':>4} {'build s':>9} {'eval s':>8} {'total s':>9} {'peak MB':>8} "
          f"{'algbw GB/s':>11} {'transfers':>10}", flush=True)
    for case in cases(args):
        sides = [("after", after_src, args.repeats)]
        if args.before_src is not None:
            if case["shape"] != "fabric" or case["gpus"] <= args.before_max_gpus:
                sides.insert(0, ("before", args.before_src, args.repeats))
            elif label(case) in args.before_single:
                sides.insert(0, ("before", args.before_src, 1))
        row = {"shape": case["shape"] if case["shape"] != "sweep" else f"sweep:{case['group']}",
               "gpus": case["gpus"], "collective": case["collective"], "method": KINDS[case["collective"]]}
        for side, src, repeats in sides:
            measured = run_side(src, dict(case, repeats=repeats), args.timeout)
            if measured is None:
                continue
            build, evaluation = statistics.median(measured["build_s"]), statistics.median(measured["eval_s"])
            total = statistics.median([b + e for b, e in zip(measured["build_s"], measured["eval_s"], strict=True)])
            row.update({f"{side}_repeats": repeats, f"{side}_build_s": build, f"{side}_eval_s": evaluation,
                        f"{side}_total_s": total, f"{side}_peak_rss_mb": measured["peak_rss_mb"],
                        f"{side}_base_rss_mb": measured["base_rss_mb"], f"{side}_algbw_gbs": measured["algbw_gbs"],
                        "transfers": measured["transfers"], "topology_s": statistics.median(measured["topo_s"])})
            name = row["shape"] if case["shape"] != "fabric" else "fabric"
            algbw = "" if measured["algbw_gbs"] is None else f"{measured['algbw_gbs']:.4f}"
            print(f"{name + ' ' + label(case):<28} {side:<6} {repeats:>4} {build:>9.4f} {evaluation:>8.4f} {total:>9.4f} "
                  f"{measured['peak_rss_mb']:>8.0f} {algbw:>11} {measured['transfers'] or '':>10}", flush=True)
        if "before_total_s" in row and "after_total_s" in row:
            row["speedup"] = row["before_total_s"] / row["after_total_s"]
            print(f"{'':<28} ratio before/after: {row['speedup']:.1f}x", flush=True)
        rows.append(row)
    columns = ["shape", "gpus", "collective", "method", "transfers", "topology_s"]
    columns += [f"{side}_{key}" for side in ("before", "after")
                for key in ("repeats", "build_s", "eval_s", "total_s", "peak_rss_mb", "base_rss_mb", "algbw_gbs")]
    columns.append("speedup")
    write_csv(args.out.with_suffix(".csv"), rows, columns)
    plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.csv')} and .png")


def plot(rows: list[dict], path: Path) -> None:
    """Build + α-β CPU against fabric size, per collective, both sides (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for collective in KINDS:
        for side, style in (("before", "--"), ("after", "-")):
            points = [(row["gpus"], row[f"{side}_total_s"]) for row in rows
                      if row["shape"] == "fabric" and row["collective"] == collective and f"{side}_total_s" in row]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                axis.plot(xs, ys, style, marker="o", label=f"{collective} {side}")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("GPUs (HPN segments of 128)")
    axis.set_ylabel("build + α-β evaluate, CPU s (median)")
    axis.set_title("NCCL-style schedules: build + evaluate")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
