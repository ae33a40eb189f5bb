"""Two probes behind the "mccl" backend's gloo settings (BENCHMARKS.md, 2026-12-01 third session).

    .venv/bin/python benchmarks/backend_probe.py small    # 13 int64 per rank: gloo AllGather vs AllToAll
    .venv/bin/python benchmarks/backend_probe.py slices   # FSDP2's 4 MiB AllGather / ReduceScatter by slice size

``small``: the pre-flight agreement's exchange (13 int64 per rank at 4 ranks), as gloo's
AllGather and as an AllToAll of the vector sent to every rank (what
:meth:`mccl.runtime.collectives.Collectives._gather_signatures` does), 300 calls each
after 20 warm-up; CPU (``time.process_time``: the process, gloo's threads included) and
wall per call.

``slices``: ``all_gather_into_tensor`` (1 MiB + 1 KiB in per rank, FSDP2's width-1024
layer) and ``reduce_scatter_tensor`` (its gradient) on the gloo world and on "mccl" groups
whose executor slices at 64 KiB, 1 MiB and 4 MiB, with the ring AllGather (the eager
driver, where the slice size matters) and the examples' direct set (exchange driver),
interleaved per repetition; medians of 20 (wall: slowest rank; CPU: mean of the ranks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

from mccl.runtime.launch import run_ranks

ROOT = Path(__file__).resolve().parents[1]
PER_RANK = 262400  # elements: a 1024 × 1024 weight and its bias, over 4 ranks
SLICES = {"ring 64K": ("ring", 64 << 10), "ring 1M": ("ring", 1 << 20), "ring 4M": ("ring", 4 << 20),
          "direct 1M": ("direct", 1 << 20)}


def _small_rank(rank: int, n: int, reps: int) -> dict:
    import torch
    import torch.distributed as dist

    group = dist.new_group(list(range(n)), backend="gloo")
    mine = torch.arange(13, dtype=torch.int64)
    out = torch.empty(13 * n, dtype=torch.int64)
    calls = {"allgather": lambda: dist.all_gather_into_tensor(out, mine, group=group),
             "alltoall": lambda: dist.all_to_all_single(out, mine.repeat(n), group=group)}
    result = {}
    for name, call in calls.items():
        for _ in range(20):
            call()
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(reps):
            call()
        result[name] = ((time.process_time() - start_cpu) / reps, (time.perf_counter() - start) / reps)
    return result


def _slices_rank(rank: int, n: int, reps: int) -> dict:
    import torch
    import torch.distributed as dist

    import mccl.runtime.backend as mb

    sys.path.insert(0, str(ROOT / "examples"))
    from mccl_setup import direct_setup, ring_setup

    warnings.filterwarnings("ignore")
    groups = {"gloo": dist.group.WORLD}
    for name, (kind, slice_bytes) in SLICES.items():
        mb.register(ring_setup if kind == "ring" else direct_setup)
        groups[name] = dist.new_group(list(range(n)), backend="mccl")
        mb.communicator(groups[name]).slice_bytes = slice_bytes
    result = {}
    for op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        x = torch.randn(PER_RANK * (1 if op == "all_gather_into_tensor" else n))
        out = torch.empty(PER_RANK * (n if op == "all_gather_into_tensor" else 1))
        times = {name: [] for name in groups}
        for repetition in range(reps + 3):
            for name, group in groups.items():
                dist.barrier()
                start, start_cpu = time.perf_counter(), time.process_time()
                getattr(dist, op)(out, x, group=group)
                if repetition >= 3:
                    times[name].append((time.perf_counter() - start, time.process_time() - start_cpu))
        result[op] = {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
                      for name, t in times.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("small", "slices"))
    args = parser.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "4 ranks, gloo on loopback")
    if args.what == "small":
        results = run_ranks(_small_rank, 4, 300, timeout_s=600)
        for name in ("allgather", "alltoall"):
            cpu = statistics.mean(r[name][0] for r in results) * 1e6
            wall = max(r[name][1] for r in results) * 1e6
            print(f"{name:10s} cpu {cpu:7.0f} us (mean of ranks)  wall {wall:7.0f} us (slowest rank)")
        return
    results = run_ranks(_slices_rank, 4, 20, timeout_s=1200)
    for op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        for name in results[0][op]:
            wall = max(r[op][name][0] for r in results) * 1e3
            cpu = statistics.mean(r[op][name][1] for r in results) * 1e3
            print(f"{op:24s} {name:10s} wall {wall:7.2f} ms  cpu {cpu:6.2f} ms")


if __name__ == "__main__":
    main()
