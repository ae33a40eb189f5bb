"""Controller CPU per flagged collective, before vs after a change, interleaved (issue 11's ≤ 1 s bar at 512 GPUs).

    python benchmarks/controller_ab.py --before-src /work/main/src --gpus 512 --collectives alltoall \
        --repeats 3 --cache /tmp/loop2/cache --csv a2a512_ab

Each chain (``benchmarks/control.py --controller-cpu``: registered healthy → Fail2 → healthy → Fail2 through the
real ``ScheduleManager``, CPU of ingest + check + warm synthesis + dispatch of every flagged step) runs in a
fresh interpreter with ``PYTHONPATH`` set to one side's ``src``; the sides alternate (before, after, after,
before, ...) so that a change in the machine's load hits both alike. Why fresh interpreters: a module
imported once cannot be swapped for another checkout's, and one chain per process keeps caches and the heap
of one side from helping or hurting the other. Medians per side and step, the ratio before / after, and
the issued schedule's digest, bound and achieved algbw of each side (equal digests: the change issued the very
same schedule). Writes ``benchmarks/results/control_NAME.csv`` (every chain) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
STAGES = ("ingest_cpu_s", "check_cpu_s", "synth_cpu_s", "dispatch_cpu_s", "total_cpu_s")


def one_chain(src: Path, gpus: int, collectives: str, cache: Path | None) -> list[dict]:
    """One chain per collective in a fresh interpreter importing ``src``; its rows (one per flagged step)."""
    command = [sys.executable, str(HERE / "control.py"), "--controller-cpu", "--cpu-sizes", str(gpus),
               "--collectives", collectives, "--repeats", "1", "--large-repeats", "1", "--json-rows",
               "--cpu-csv", ""]
    if cache is not None:
        command += ["--cache", str(cache)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chain with {src} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    rows = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if not rows:
        raise RuntimeError(f"chain with {src} printed no rows:\n{done.stdout[-2000:]}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-src", type=Path, required=True, help="the checkout's src to compare against")
    parser.add_argument("--after-src", type=Path, default=HERE.parent / "src", help="default: this checkout's src")
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--collectives", default="alltoall")
    parser.add_argument("--repeats", type=int, default=3, help="chains per side (medians)")
    parser.add_argument("--cache", type=Path, default=None, help="the cold healthy syntheses (control.py --cache)")
    parser.add_argument("--csv", default="controller_ab", help="results/control_NAME.csv")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    from control import fabric_size_error  # noqa: E402  (benchmarks/ is on sys.path)

    if (size_error := fabric_size_error(args.gpus)) is not None:
        parser.error(f"--gpus: {size_error}")
    print(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), f"load {os.getloadavg()[0]:.1f}", flush=True)
    sides = {"before": args.before_src.resolve(), "after": args.after_src.resolve()}
    rows: list[dict] = []
    for repeat in range(args.repeats):
        order = ("before", "after") if repeat % 2 == 0 else ("after", "before")
        for side in order:
            load = os.getloadavg()[0]
            for row in one_chain(sides[side], args.gpus, args.collectives, args.cache):
                rows.append({"side": side, "repeat": repeat, "load": round(load, 1), **row})
                print(f"{side:>6} #{repeat} {row['collective']:>9} {row['step']:>9} total {row['total_cpu_s'] * 1e3:7.1f} ms "
                      f"(ingest {row['ingest_cpu_s'] * 1e3:.0f}, synth {row['synth_cpu_s'] * 1e3:.0f}, "
                      f"dispatch {row['dispatch_cpu_s'] * 1e3:.0f}) load {load:.1f}", flush=True)
    write_csv(RESULTS / f"control_{args.csv}.csv", rows)
    print(f"\n| collective | step | side | chains | {' | '.join(s.removesuffix('_cpu_s') + ' ms' for s in STAGES)} | "
          "before/after | bound GB/s | achieved GB/s | digest |")
    keys = sorted({(r["collective"], r["step"]) for r in rows})
    for collective, step in keys:
        medians = {}
        for side in sides:
            mine = [r for r in rows if r["side"] == side and r["collective"] == collective and r["step"] == step]
            if not mine:
                continue
            medians[side] = {stage: statistics.median(r[stage] for r in mine) for stage in STAGES}
            ratio = (f"{medians['before']['total_cpu_s'] / medians['after']['total_cpu_s']:.2f}×"
                     if side == "after" and "before" in medians else "")
            cells = " | ".join(f"{medians[side][stage] * 1e3:.0f}" for stage in STAGES)
            print(f"| {collective} | {step} | {side} | {len(mine)} | {cells} | {ratio} | "
                  f"{'/'.join(sorted({str(r['bound_gbs']) for r in mine}))} | "
                  f"{'/'.join(sorted({str(r['achieved_gbs']) for r in mine}))} | "
                  f"{'/'.join(sorted({r['digest'] for r in mine}))} |")


if __name__ == "__main__":
    main()
