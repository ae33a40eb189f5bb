"""Benchmark: AllGather tree packing (``optimize(topology, "allgather")``) at 128–2048 GPUs, cold and warm (issue 17).

Each case runs in a fresh interpreter of its own (so "cold" means cold: no route search, cut or
compiled-kernel state in memory; numba's on-disk cache is warm after the first run ever, which
saves its ~10 s compile, and its load is inside the timed call). Per case and repeat:

* ``cpu_s``: CPU time (``time.process_time``; the machine is shared) of the ``optimize`` call;
* the phase times the synthesis reports (``phase1_s`` cut bound, ``rounding_s``, ``phase2_s`` switch
  removal, ``phase3_s`` tree construction; wall clock, so inflated under load) and the same phases'
  CPU times (``phase1_cpu_s`` … ``lowering_cpu_s``, the pipeline's functions wrapped in the worker;
  the table prints these), its max-flows, trees,
  depth, the fractional bound and the achieved throughput;
* ``rss_mb``: the worker's peak resident memory (``ru_maxrss``), and ``base_mb`` after the imports;
* every emitted schedule is checked with ``validate()`` (outside the timing).

``--warm-up``: before the timed call the worker runs a 16-GPU cold and warm synthesis, as a
long-lived controller has by its second re-synthesis, so numba's on-disk cache (the compiled warm
repair, lowering and scans) is already loaded; without it the timed call pays that load (the
controller's first fault does).

Fabric: ``rail_optimized(1, gpus // 8, 8)`` (one segment, the issue's 512-GPU case is (1,64,8)).
Cases: ``healthy`` (cold); ``fail1``, ``fail2``, ``fail3`` (cold, the paper's faults on gpu0);
``fail1-warm`` … (the faulty fabric warm-started from the healthy schedule, only the warm call timed —
what the controller does when a NIC degrades); ``back-from-fail2`` … (healthy again, warm from that
warm fault schedule). ``exact_bound_gbs``: the cut bound recomputed on scipy's max-flow (an
independent engine), outside the timing, against which ``achieved_gbs`` is compared. With ``--before-src`` (main's ``src``) the same cases run on that checkout too,
and the ratios before/after are printed.

    python benchmarks/treepack_scale.py --gpus 128,256,512 --repeats 3
    python benchmarks/treepack_scale.py --gpus 1024,2048 --repeats 1 --cases healthy
    python benchmarks/treepack_scale.py --gpus 512 --cases healthy,fail2-warm --before-src /work/main/src
    python benchmarks/treepack_scale.py --gpus 128,512 --cases fail2-warm --repeats 3 --warm-up --before-src /work/main/src
    python benchmarks/treepack_scale.py --gpus 2048 --repeats 1 --cases fail1 --no-exact --dump-phase2 /tmp/ph2
    python benchmarks/treepack_scale.py --gpus 128,512 --repeats 1 \
        --cases fail1,fail1-warm,fail2,fail2-warm,fail3,fail3-warm,back-from-fail1,back-from-fail2,back-from-fail3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATS = ("phase1_s", "rounding_s", "phase2_s", "phase3_s", "max_flows", "tree_groups", "max_depth",
         "trees_per_source", "kept_fraction")

WORKER = r"""
import json, resource, sys, time
from mccl.schedule import validate
from mccl.synth import allgather_cut_bound, optimize
from mccl.synth.maxflow import scipy_max_flow
from mccl.topology import fail1, fail2, fail3, rail_optimized

gpus, case, exact_too = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
warm_up, dump = sys.argv[4] == "1", sys.argv[5]
import mccl.synth.treepack.pipeline as pipeline
phase_cpu = {}


def timed(name, function):
    # ``function`` with its CPU time added to ``phase_cpu[name]`` (the pipeline's own phase times are wall)
    def wrapper(*args, **kwargs):
        started = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            phase_cpu[name] = phase_cpu.get(name, 0.0) + time.process_time() - started
    return wrapper


for name, attribute in (("phase1_cpu_s", "max_rate"), ("rounding_cpu_s", "best_integral_rate"),
                        ("phase2_cpu_s", "split_switches"), ("phase3_cpu_s", "pack_arborescences"),
                        ("lowering_cpu_s", "lower_trees")):
    setattr(pipeline, attribute, timed(name, getattr(pipeline, attribute)))
if dump:  # Phase 3's input (n, logical units, k, host groups) pickled after the timed call, for Phase 3 alone
    import pickle
    dumped = []
    timed_split = pipeline.split_switches

    def dumping_split(fabric, integral):
        split = timed_split(fabric, integral)
        dumped.append((fabric.n_ranks, split.logical.units, split.k, fabric.groups))
        return split
    pipeline.split_switches = dumping_split
healthy = rail_optimized(1, gpus // 8, 8)
faults = {"fail1": fail1, "fail2": fail2, "fail3": fail3}
base_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
previous = None
topology = healthy
if case.startswith("back-from-"):  # healthy again, warm from the warm schedule of the fault
    fault = faults[case.removeprefix("back-from-")](healthy)
    previous = optimize(fault, "allgather", previous=optimize(healthy, "allgather"))
elif case != "healthy":
    fault, _, warm = case.partition("-")
    if warm:
        previous = optimize(healthy, "allgather")
    topology = faults[fault](healthy)
if warm_up:  # a long-lived process (the controller) has run the code once: JIT caches loaded, not timed
    small = rail_optimized(1, 2, 8)
    for synth_fault in (fail2, lambda t: t):
        optimize(synth_fault(small), "allgather", previous=optimize(small, "allgather"))
phase_cpu.clear()
start = time.process_time()
result = optimize(topology, "allgather", previous=previous)
cpu = time.process_time() - start
if dump and dumped:
    with open(f"{dump}/phase2-{gpus}-{case}.pkl", "wb") as handle:
        pickle.dump(dumped[-1], handle)
validate(result.schedule, topology)
stats = dict(result.schedule.meta.stats)
exact = allgather_cut_bound(topology, result.schedule.ranks, max_flow=scipy_max_flow).algbw_gbs if exact_too else None
print(json.dumps({"cpu_s": cpu, **phase_cpu, "bound_gbs": result.bound_gbs, "achieved_gbs": result.achieved_gbs, "exact_bound_gbs": exact,
                  "transfers": len(result.schedule.transfers.chunk), "base_mb": base_mb,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  **{name: stats.get(name) for name in STAT_NAMES}}))
""".replace("STAT_NAMES", repr(STATS))


def run_case(src: str, gpus: int, case: str, timeout: float, exact: bool = True, warm_up: bool = False,
             dump: str = "") -> dict:
    """One case in a fresh interpreter importing mccl from ``src`` (``dump``: a folder for Phase 3's input)."""
    env_path = f"import sys; sys.path.insert(0, {src!r})\n"
    done = subprocess.run([sys.executable, "-c", env_path + WORKER, str(gpus), case, "1" if exact else "0",
                           "1" if warm_up else "0", dump],
                          capture_output=True,
                          text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{gpus} {case} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_row(rows: list[dict]) -> dict:
    """Per field, the median over the repeats (numbers only)."""
    out = {}
    for key in rows[0]:
        values = [row[key] for row in rows if isinstance(row[key], (int, float))]
        out[key] = statistics.median(values) if values else rows[0][key]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="128,256,512")
    parser.add_argument("--cases", default="healthy,fail2,fail2-warm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before-src", default=None, help="another checkout's src to compare against")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--no-exact", action="store_true", help="skip the scipy cut bound (minutes at 2048 GPUs)")
    parser.add_argument("--warm-up", action="store_true",
                        help="before the timed call, run a 16-GPU cold and warm synthesis in the same process "
                             "(what a long-lived controller has done: compiled kernels loaded from numba's cache)")
    parser.add_argument("--dump-phase2", default="", metavar="DIR",
                        help="pickle Phase 3's input (n, logical units, k, groups) per case into DIR (cold cases)")
    parser.add_argument("--out", default=str(HERE / "results" / "treepack_scale.jsonl"))
    args = parser.parse_args()
    sides = [("after", str(HERE.parent / "src"))] + ([("before", args.before_src)] if args.before_src else [])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (f"{'gpus':>5} {'case':<15} {'side':<6} {'cpu_s':>8} {'ph1':>6} {'ph2':>6} {'ph3':>7} {'lower':>6} {'flows':>6} "
              f"{'groups':>6} {'depth':>5} {'bound':>8} {'achieved':>8} {'exact':>8} {'rss_mb':>7} {'base_mb':>7}")
    print(header, flush=True)
    for gpus in [int(g) for g in args.gpus.split(",")]:
        for case in args.cases.split(","):
            medians = {}
            for side, src in sides:
                rows = [run_case(src, gpus, case, args.timeout, not args.no_exact, args.warm_up, args.dump_phase2)
                        for _ in range(args.repeats)]
                row = median_row(rows)
                medians[side] = row
                with out.open("a") as handle:
                    handle.write(json.dumps({"gpus": gpus, "case": case, "side": side, "repeats": rows}) + "\n")
                cpu = {name: row.get(f"{name}_cpu_s") or 0.0 for name in ("phase1", "phase2", "phase3", "lowering")}
                print(f"{gpus:>5} {case:<15} {side:<6} {row['cpu_s']:>8.2f} {cpu['phase1']:>6.2f} "
                      f"{cpu['phase2']:>6.2f} {cpu['phase3']:>7.2f} {cpu['lowering']:>6.2f} {row['max_flows']:>6.0f} "
                      f"{row['tree_groups']:>6.0f} {row['max_depth']:>5.0f} {row['bound_gbs']:>8.2f} "
                      f"{row['achieved_gbs']:>8.2f} {row['exact_bound_gbs'] or float('nan'):>8.2f} {row['rss_mb']:>7.0f} {row['base_mb']:>7.0f}", flush=True)
            if "before" in medians:
                ratio = medians["before"]["cpu_s"] / medians["after"]["cpu_s"]
                same = medians["before"]["achieved_gbs"] == medians["after"]["achieved_gbs"]
                print(f"{gpus:>5} {case:<10} before/after CPU {ratio:.2f}x; achieved equal: {same}", flush=True)


if __name__ == "__main__":
    main()
