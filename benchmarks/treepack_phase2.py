"""Benchmark: Phase 2 of the AllGather tree packing (switch removal) at 128–2048 GPUs, step by step (issue 17).

Each case in a fresh interpreter: Phase 1 (cut bound) and the rounding as the pipeline runs them,
then, CPU time (``time.process_time``) of each: the split (``remove_switches`` unstraightened, with
its packing checks), the straightening, and the final packing check on the logical graph asked two
ways on the same graph — one rooted minimum cut (``packing_ok``, Hao–Orlin, :mod:`.rootcut`) and one
OR-Tools max-flow per rank (``packing_ok_by_flows``, the former check; skipped above
``--flows-up-to`` GPUs, where it takes minutes) — at the split's k (passes) and k + 1 (fails).
Peak RSS (``ru_maxrss``) of the worker; the compiled rooted cut is loaded before the timing.

    python benchmarks/treepack_phase2.py --gpus 128,512 --cases healthy,fail1,fail2,fail3
    python benchmarks/treepack_phase2.py --gpus 2048 --cases healthy --flows-up-to 512
    python benchmarks/treepack_phase2.py --gpus 512 --cases fail1,fail3 --flows-up-to 0 --before-src /work/main/src

``--before-src``: each case also on that checkout's ``src`` (a fresh interpreter each), the rows side by side
(``side`` column); the worker imports ``mccl`` from this checkout's ``src`` otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

WORKER = r"""
import json, resource, sys, time
import numpy as np
from mccl.synth.common import check_ranks
from mccl.synth.cutbound import CutChecker, max_rate
from mccl.synth.treepack.fabric import fabric_of
from mccl.synth.treepack.packcheck import packing_ok, packing_ok_by_flows
from mccl.synth.treepack.rounding import best_integral_rate
from mccl.synth.treepack.switch_removal import remove_switches, straighten_logical
from mccl.topology import fail1, fail2, fail3, rail_optimized

gpus, case, flows_too = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
topology = rail_optimized(1, gpus // 8, 8)
topology = {"healthy": lambda t: t, "fail1": fail1, "fail2": fail2, "fail3": fail3}[case](topology)
empty = np.zeros(0, dtype=np.int64)
packing_ok(1, 1, empty, empty, empty, 1)  # numba's compiled kernel loaded from its cache outside the timing
row = {}
clock = time.process_time()
fabric = fabric_of(topology, check_ranks(topology, None))
checker = CutChecker(fabric)
optimum = max_rate(fabric, checker=checker)
row["phase1_cpu_s"] = time.process_time() - clock
clock = time.process_time()
integral = best_integral_rate(fabric, 10, optimum.rate_gbps, checker)
row["rounding_cpu_s"] = time.process_time() - clock
clock = time.process_time()
logical = remove_switches(fabric, integral.units, integral.k, fabric.groups, straighten=False)
row["split_cpu_s"] = time.process_time() - clock
clock = time.process_time()
straight = straighten_logical(fabric, logical)
row["straighten_cpu_s"] = time.process_time() - clock
keys = list(logical.units)
tail = np.array([u for u, _ in keys], dtype=np.int64)
head = np.array([v for _, v in keys], dtype=np.int64)
caps = np.array([logical.units[key] for key in keys], dtype=np.int64)
n = logical.n_ranks
for k, label in ((integral.k, "pass"), (integral.k + 1, "fail")):
    clock = time.process_time()
    verdict = packing_ok(n, n, tail, head, caps, k)
    row[f"rootcut_{label}_cpu_s"] = time.process_time() - clock
    row[f"rootcut_{label}"] = verdict
    if flows_too:
        clock = time.process_time()
        row[f"flows_{label}"] = packing_ok_by_flows(n, n, tail, head, caps, k)
        row[f"flows_{label}_cpu_s"] = time.process_time() - clock
row.update({"k": integral.k, "logical_arcs": len(keys), "careful": logical.careful,
            "pieces": sum(len(pieces) for pieces in straight.routes.values()),
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
print(json.dumps(row))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="128,512")
    parser.add_argument("--cases", default="healthy,fail1,fail2,fail3")
    parser.add_argument("--flows-up-to", type=int, default=512, help="largest size to also check by n max-flows")
    parser.add_argument("--out", default=str(HERE / "results" / "treepack_phase2.jsonl"))
    parser.add_argument("--before-src", default=None, help="another checkout's src to run each case on too")
    args = parser.parse_args()
    if args.before_src is not None and not (Path(args.before_src) / "mccl").is_dir():
        parser.error(f"--before-src: {args.before_src} is not a checkout's src (no mccl package in it)")
    sides = [("after", str(HERE.parent / "src"))] + ([("before", args.before_src)] if args.before_src else [])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{'gpus':>5} {'case':<8} {'side':<6} {'ph1':>6} {'round':>6} {'split':>7} {'straight':>8} {'cut ok':>7} "
          f"{'flows ok':>8} {'ratio':>6} {'cut no':>7} {'arcs':>8} {'pieces':>8} {'rss_mb':>7}", flush=True)
    for gpus in [int(g) for g in args.gpus.split(",")]:
        for case in args.cases.split(","):
            for side, src in sides:
                row = run_case(src, gpus, case, gpus <= args.flows_up_to)
                with out.open("a") as handle:
                    handle.write(json.dumps({"gpus": gpus, "case": case, "side": side, **row}) + "\n")
                flows = row.get("flows_pass_cpu_s")
                ratio = f"{flows / row['rootcut_pass_cpu_s']:.1f}x" if flows else "-"
                print(f"{gpus:>5} {case:<8} {side:<6} {row['phase1_cpu_s']:>6.2f} {row['rounding_cpu_s']:>6.2f} "
                      f"{row['split_cpu_s']:>7.2f} {row['straighten_cpu_s']:>8.2f} {row['rootcut_pass_cpu_s']:>7.3f} "
                      f"{flows if flows is not None else float('nan'):>8.3f} {ratio:>6} {row['rootcut_fail_cpu_s']:>7.3f} "
                      f"{row['logical_arcs']:>8} {row['pieces']:>8} {row['rss_mb']:>7.0f}", flush=True)


def run_case(src: str, gpus: int, case: str, flows_too: bool) -> dict:
    """One case in a fresh interpreter importing mccl from ``src``; its row (checked: both checks agree)."""
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {src!r})\n" + WORKER, str(gpus),
                           case, "1" if flows_too else "0"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{gpus} {case} ({src}) failed:\n{done.stderr[-2000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if row.get("flows_pass", row["rootcut_pass"]) != row["rootcut_pass"] or \
            row.get("flows_fail", row["rootcut_fail"]) != row["rootcut_fail"]:
        raise RuntimeError(f"{gpus} {case}: the rooted cut and the max-flows disagree: {row}")
    return row


if __name__ == "__main__":
    main()
