"""The "mccl" torch.distributed backend against gloo: per-call time by size, and training step time.

    .venv/bin/python benchmarks/backend.py calls            # per-call, 2 ranks, 4 KiB .. 16 MiB
    .venv/bin/python benchmarks/backend.py steps            # DDP and FSDP2 examples, 4 ranks, 20 steps
    .venv/bin/python benchmarks/backend.py steps --models fsdp2 --ring-rs   # ring ReduceScatter instead
    .venv/bin/python benchmarks/backend.py steps --models fsdp2 --ring-ag   # ring AllGather (eager driver)
    .venv/bin/python benchmarks/backend.py calls --quick    # fewer sizes and repetitions
    .venv/bin/python benchmarks/backend.py calls --ranks 4 --ops reduce_scatter_tensor --sizes 1048576,16777216

``calls``: in one set of processes, interleaved repetition by repetition (so that the
load of other jobs hits every variant alike), ``dist.*`` on a gloo group, on an "mccl"
group (schedules installed: examples/mccl_setup.py's direct AllGather, direct ReduceScatter
adding in gloo's order, direct AllToAll; the pre-flight agreement on), on an "mccl" group with ``MCCL_CHECK=0``
(agreement off: the difference is what the check costs per call), and on an "mccl" group
whose ReduceScatter is a ring adding in its own order ("ring RS": what gloo's order costs). A repetition's wall time is the
slowest rank's; its CPU time (``time.process_time``, this process: the Python work
and gloo's threads) rank 0's. Figures are medians; ratios mccl / gloo.

``steps``: the examples' DDP and FSDP2 models (examples/train_ddp.py,
examples/train_fsdp2.py) built twice in each of 4 ranks, once on the gloo world and
once on an "mccl" group, stepped alternately; medians of the steps after 3 warm-up
steps. The FSDP2 model's width makes each parameter all-gather's output ``width² × 4``
bytes per rank (1024: 4 MiB).

Writes ``benchmarks/results/backend_calls.csv`` / ``backend_steps.csv`` and prints tables.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.runtime.launch import run_ranks

ROOT = Path(__file__).resolve().parents[1]
KIB, MIB = 1 << 10, 1 << 20
SIZES = [4 * KIB, 64 * KIB, MIB, 16 * MIB]
QUICK_SIZES = [4 * KIB, MIB]
OPS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "all_to_all_single")
VARIANTS = ("gloo", "mccl", "mccl_nocheck", "mccl_ring_rs")


def _ring_reduce_scatter_setup(rank: int, size: int):
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    topology = single_switch(size, 100)
    return topology, [naive_ring(topology, "allgather"), naive_ring(topology, "reducescatter")]


def _calls_rank(rank: int, n: int, sizes: list[int], reps: int, ops: tuple[str, ...] = OPS) -> list[dict]:
    import torch
    import torch.distributed as dist

    import mccl.runtime.backend as mb

    sys.path.insert(0, str(ROOT / "examples"))
    from mccl_setup import direct_setup

    warnings.filterwarnings("ignore")
    mb.register(direct_setup)
    groups = {"gloo": dist.group.WORLD, "mccl": dist.new_group(list(range(n)), backend="mccl")}
    os.environ["MCCL_CHECK"] = "0"
    groups["mccl_nocheck"] = dist.new_group(list(range(n)), backend="mccl")
    os.environ["MCCL_CHECK"] = "1"
    mb.register(_ring_reduce_scatter_setup)
    groups["mccl_ring_rs"] = dist.new_group(list(range(n)), backend="mccl")
    rows = []
    for size in sizes:
        elems = size // 4  # float32; S = the nccl-tests size: AG output, RS input, AR buffer, A2A send buffer
        for op in ops:
            x = torch.ones(elems // n if op == "all_gather_into_tensor" else elems)
            out = torch.empty(elems // n if op == "reduce_scatter_tensor" else elems)

            def call(group, op=op, x=x, out=out):
                if op == "all_gather_into_tensor":
                    dist.all_gather_into_tensor(out, x, group=group)
                elif op == "reduce_scatter_tensor":
                    dist.reduce_scatter_tensor(out, x, group=group)
                elif op == "all_reduce":
                    dist.all_reduce(x, group=group)
                else:
                    dist.all_to_all_single(out, x, group=group)

            wall = {v: [] for v in VARIANTS}
            cpu = {v: [] for v in VARIANTS}
            for _ in range(3):
                for variant in VARIANTS:
                    call(groups[variant])
            for _ in range(reps):
                for variant in VARIANTS:
                    dist.barrier()
                    start, start_cpu = time.perf_counter(), time.process_time()
                    call(groups[variant])
                    cpu[variant].append(time.process_time() - start_cpu)
                    wall[variant].append(time.perf_counter() - start)
            slowest = torch.tensor([statistics.median(wall[v]) for v in VARIANTS])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            row = {"op": op, "bytes": size, "ranks": n}
            for index, variant in enumerate(VARIANTS):
                row[f"{variant}_us"] = float(slowest[index]) * 1e6
                row[f"{variant}_cpu_us"] = statistics.median(cpu[variant]) * 1e6
            row["scheduled"] = mb.communicator(groups["mccl"]).calls.scheduled(op)
            rows.append(row)
    return rows


def _steps_rank(rank: int, n: int, kind: str, width: int, layers: int, steps: int, ring_rs: bool = False,
                ring_ag: bool = False) -> dict:
    import torch.distributed as dist

    import mccl.runtime.backend as mb

    sys.path.insert(0, str(ROOT / "examples"))
    import train_ddp
    import train_fsdp2
    from mccl_setup import direct_setup, ring_setup

    warnings.filterwarnings("ignore")
    mb.register(_ring_reduce_scatter_setup if ring_rs else ring_setup if ring_ag else direct_setup)
    build = train_ddp.build if kind == "ddp" else train_fsdp2.build
    mccl_group = dist.new_group(list(range(n)), backend="mccl")
    runs = {"gloo": build(dist.group.WORLD, width, layers), "mccl": build(mccl_group, width, layers)}
    batch = train_ddp.batch_for(rank, width)
    times = {name: [] for name in runs}
    losses = {name: [] for name in runs}
    for index in range(steps + 3):
        for name, (model, optimizer) in runs.items():
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            losses[name].append(train_ddp.step(model, optimizer, batch))
            if index >= 3:
                times[name].append((time.perf_counter() - start, time.process_time() - start_cpu))
    return {"times": times, "same_losses": losses["gloo"] == losses["mccl"],
            "counts": mb.communicator(mccl_group).calls.counts()}


def _calls(args) -> None:
    sizes = [int(v) for v in args.sizes.split(",")] if args.sizes else QUICK_SIZES if args.quick else SIZES
    ops = tuple(args.ops.split(",")) if args.ops else OPS
    rows = run_ranks(_calls_rank, args.ranks, sizes, 10 if args.quick else 30, ops, timeout_s=2400)[0]
    print(f"per call, {args.ranks} ranks, medians (wall: slowest rank; cpu: rank 0), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'op':24s} {'bytes':>9s} {'gloo us':>9s} {'mccl us':>9s} {'nochk us':>9s} {'mccl/gloo':>9s} "
          f"{'check us':>9s} {'gloo cpu':>9s} {'mccl cpu':>9s} {'ring-RS us':>10s} {'ring cpu':>9s}")
    for row in rows:
        row["ratio"] = row["mccl_us"] / row["gloo_us"]
        row["check_us"] = row["mccl_us"] - row["mccl_nocheck_us"]
        print(f"{row['op']:24s} {row['bytes']:9d} {row['gloo_us']:9.0f} {row['mccl_us']:9.0f} "
              f"{row['mccl_nocheck_us']:9.0f} {row['ratio']:9.2f} {row['check_us']:9.0f} "
              f"{row['gloo_cpu_us']:9.0f} {row['mccl_cpu_us']:9.0f} {row['mccl_ring_rs_us']:10.0f} "
              f"{row['mccl_ring_rs_cpu_us']:9.0f}")
    write_csv(ROOT / "benchmarks" / "results" / "backend_calls.csv", rows)


def _steps(args) -> None:
    rows = []
    for kind, width in ((kind, args.width) for kind in args.models.split(",")):
        results = run_ranks(_steps_rank, 4, kind, width, args.layers, args.steps, args.ring_rs, args.ring_ag,
                            timeout_s=1500)
        for name in ("gloo", "mccl"):
            # a step's time is the slowest rank's
            walls = [max(r["times"][name][i][0] for r in results) for i in range(args.steps)]
            cpus = [r["times"][name][i][1] for r in results[:1] for i in range(args.steps)]
            rows.append({"model": kind, "width": width, "layers": args.layers, "backend": name,
                         "step_ms": statistics.median(walls) * 1e3, "cpu_ms": statistics.median(cpus) * 1e3,
                         "same_losses": all(r["same_losses"] for r in results),
                         "scheduled": sum(c for (op, path), c in results[0]["counts"].items() if path == "schedule")})
    print(f"step time, 4 ranks, median of {args.steps} steps, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for row in rows:
        print(f"{row['model']:6s} width {row['width']:5d} {row['backend']:5s} {row['step_ms']:8.1f} ms "
              f"(cpu rank 0 {row['cpu_ms']:7.1f} ms) same losses {row['same_losses']} scheduled calls {row['scheduled']}")
    for kind in args.models.split(","):
        gloo, mccl = (next(r for r in rows if r["model"] == kind and r["backend"] == b) for b in ("gloo", "mccl"))
        print(f"{kind}: gloo / mccl step time = {gloo['step_ms'] / mccl['step_ms']:.2f}x (>= 1.0: mccl as fast)")
    write_csv(ROOT / "benchmarks" / "results" / "backend_steps.csv", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("calls", "steps"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--width", type=int, default=1024, help="steps: the MLP's width (1024: 4 MiB all-gathers)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=2, help="calls: world size")
    parser.add_argument("--models", default="ddp,fsdp2", help="steps: ddp, fsdp2 or both")
    parser.add_argument("--ring-rs", action="store_true",
                        help="steps: a ring ReduceScatter adding in its own order (not gloo's), for comparison")
    parser.add_argument("--ring-ag", action="store_true",
                        help="steps: a ring AllGather (the eager driver) instead of the direct one, for comparison")
    parser.add_argument("--ops", default="", help="calls: comma-separated subset of " + ",".join(OPS))
    parser.add_argument("--sizes", default="", help="calls: comma-separated sizes in bytes")
    args = parser.parse_args()
    _calls(args) if args.what == "calls" else _steps(args)


if __name__ == "__main__":
    main()
