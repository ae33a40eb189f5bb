"""Benchmark of ``mccl sim fig14`` (issue 11, deliverable 4): the full table, its cost, and a measurement
behind every deviation from the paper's Fail2 peaks (2.85× Llama, 4.99× DeepSeek).

    PYTHONPATH=src .venv/bin/python benchmarks/fig14.py --out benchmarks/results/fig14
    PYTHONPATH=src .venv/bin/python benchmarks/fig14.py --skip-cli   # no timed `mccl sim fig14` runs

Parts:

1. ``mccl sim fig14 --out DIR`` in a fresh interpreter, ``--repeat`` times: wall and CPU seconds
   (children's rusage), median. The bar: ≤ 10 min at 2048 GPUs (the command runs 128–2048).
2. The full table (every model, size, fault) as CSV, and every call of every step.
3. Deviations, each a measurement:
   a. Llama under Fail2 — what share of its healthy NCCL communication crosses a NIC, and whether
      any schedule could beat the DP ring there (the group's max-flow cut bound);
   b. Llama what-ifs at 1024 GPUs: the paper's 16K-token step (2 micro-batches), DP/FSDP over
      host-spanning 64-GPU groups, both — which of them the paper's 2.85× needs;
   c. the overlay choice: tree packing on one host with the NIC loop through ToR + aggregation
      (healthy), which the one-host overlay leaves out;
   d. concurrency: the two EP groups of a segment under Fail2 (re-optimized + direct) evaluated
      jointly on one fabric against each alone;
   e. α-β against the flow-level simulator (4 slices) for the groups that decide the speedups;
   f. what the compute time derived from the paper's communication shares implies: the MFU it would
      take to do a step's matrix FLOPs (6 · parameters · tokens per GPU) in it on an H100 (989 TFLOP/s
      dense BF16, 1979 FP8).
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.experiments.fig14 import Fig14Model, fig14_training, group_fabric  # noqa: E402
from mccl.experiments.fig14_workloads import DEEPSEEK, LLAMA, groups, llama_volumes  # noqa: E402
from mccl.schedule import Collective, link_load  # noqa: E402
from mccl.sim.analytic import evaluate  # noqa: E402
from mccl.sim.engine import simulate_schedule  # noqa: E402
from mccl.sim.inputs import SimOptions  # noqa: E402
from mccl.synth import optimize  # noqa: E402
from mccl.topology import apply_fault, rail_optimized  # noqa: E402

console = Console(highlight=False, width=160)


def time_cli(repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``mccl sim fig14 --out <tmp>`` in a fresh interpreter."""
    walls, cpus = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as out:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "from mccl.cli.main import main; raise SystemExit(main("
                            f"['sim', 'fig14', '--out', {out!r}]))"], check=True, capture_output=True)
            walls.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def full_table(out: Path) -> None:
    model = Fig14Model()
    started = time.process_time()
    report = fig14_training(model=model)
    console.print(f"full table: {time.process_time() - started:.1f} s CPU in-process")
    steps, calls = [], []
    for step in report.steps:
        steps.append({"model": step.workload, "gpus": step.n_gpus, "fault": step.fault,
                      "compute_s": f"{step.compute_s:.3f}", "nccl_comm_s": f"{step.nccl_comm_s:.3f}",
                      "mccl_comm_s": f"{step.mccl_comm_s:.3f}", "nccl_step_s": f"{step.nccl_step_s:.3f}",
                      "mccl_step_s": f"{step.mccl_step_s:.3f}", "speedup": f"{step.speedup:.4f}"})
        for call in step.calls:
            calls.append({"model": step.workload, "gpus": step.n_gpus, "fault": step.fault, "call": call.call.name,
                          "count": call.count, "nccl_ms": f"{call.nccl_s * 1e3:.4f}",
                          "mccl_ms": f"{call.mccl_s * 1e3:.4f}", "choice": call.mccl_choice,
                          "faulted_group_nccl_ms": f"{call.faulted_nccl_s * 1e3:.4f}",
                          "faulted_group_reopt_ms": "" if call.faulted_reopt_s is None
                          else f"{call.faulted_reopt_s * 1e3:.4f}"})
    write_csv(out / "fig14_steps.csv", steps)
    write_csv(out / "fig14_calls.csv", calls)
    console.print("| model | GPUs | fault | NCCL step (s) | mccl step (s) | speedup |")
    for row in steps:
        console.print(f"| {row['model']} | {row['gpus']} | {row['fault']} | {row['nccl_step_s']} | "
                      f"{row['mccl_step_s']} | {float(row['speedup']):.3f}x |")
    report.plot(out)


def llama_fail2(model: Fig14Model) -> None:
    """(a) Which share of Llama's healthy NCCL comm crosses a NIC; the DP ring against its cut bound."""
    healthy = model.comm(LLAMA, 1024, "healthy")
    total = sum(c.count * c.nccl_s for c in healthy)
    for call in healthy:
        console.print(f"  healthy 1024: {call.call.short}: {call.count} x {call.nccl_s * 1e3:.3f} ms = "
                      f"{call.count * call.nccl_s / total:.1%} of NCCL comm")
    faulted = model.fabric(1024, "Fail2")
    ranks = groups(LLAMA, "dp", 1024)[0]
    sub = group_fabric(faulted, ranks)
    for call in LLAMA.calls[2:]:
        ring = optimize(sub, call.collective, ranks, method="ring.nccl").schedule
        bound = model.bound_time(sub, ranks, call.size_bytes)
        console.print(f"  Fail2 1024 DP group of gpu0 ({len(ranks)} GPUs): {call.short} ring bandwidth term "
                      f"{evaluate(ring, sub, call.size_bytes).bandwidth_time_s:.4f} s, cut bound {bound:.4f} s")


def llama_what_ifs(model: Fig14Model) -> None:
    """(b) Llama variants at 1024 GPUs under Fail2 and Fail1."""
    host_dp = tuple(dataclasses.replace(call, group="ep") if call.group == "dp" else call for call in LLAMA.calls)
    variants = {
        "as stated (256 micro-batches, DP rail groups)": LLAMA,
        "paper's 16K-token step (2 micro-batches)": dataclasses.replace(LLAMA, microbatches=2),
        "DP over 64-GPU host-spanning groups": dataclasses.replace(LLAMA, calls=host_dp),
        "both": dataclasses.replace(LLAMA, calls=host_dp, microbatches=2),
    }
    for label, workload in variants.items():
        cells = []
        for fault in ("Fail1", "Fail2", "Fail3"):
            step = model.step(workload, 1024, fault)
            cells.append(f"{fault} {step.speedup:.2f}x")
        tp = sum(c.count * c.nccl_s for c in model.comm(workload, 1024, "healthy") if c.call.group == "tp")
        whole = sum(c.count * c.nccl_s for c in model.comm(workload, 1024, "healthy"))
        console.print(f"  Llama 1024, {label}: {', '.join(cells)}; TP share of healthy comm {tp / whole:.1%}")


def overlay_choice() -> None:
    """(c) One host's TP AllGather with and without the NIC loop (ToR + aggregation), healthy and Fail1."""
    full = rail_optimized(1, 16, 8)
    ranks = groups(LLAMA, "tp", 128)[0]
    size = LLAMA.calls[0].size_bytes
    for fault in ("healthy", "Fail1"):
        fabric = full if fault == "healthy" else apply_fault(full, fault)
        ring = evaluate(optimize(fabric, Collective.ALLGATHER, ranks, method="ring.nccl").schedule, fabric, size)
        overlay = group_fabric(fabric, ranks)
        tree_overlay = evaluate(optimize(overlay, Collective.ALLGATHER, ranks).schedule, overlay, size)
        tree_loop = evaluate(optimize(fabric, Collective.ALLGATHER, ranks).schedule, fabric, size)
        console.print(f"  TP AllGather 256 MiB, {fault}: ring {ring.time_s * 1e3:.3f} ms, tree packing on the host "
                      f"overlay {tree_overlay.time_s * 1e3:.3f} ms, with the NIC loop {tree_loop.time_s * 1e3:.3f} ms "
                      f"(ring / loop = {ring.time_s / tree_loop.time_s:.3f})")


def concurrency() -> None:
    """(d) The two EP groups of segment 0 under Fail2, on one fabric: re-optimized (group of gpu0) + direct."""
    fabric = apply_fault(rail_optimized(1, 16, 8), "Fail2")
    first, second = groups(DEEPSEEK, "ep", 128)[:2]
    size = DEEPSEEK.calls[1].size_bytes
    reopt = optimize(fabric, Collective.ALLTOALL, first).schedule
    direct = optimize(fabric, Collective.ALLTOALL, second, method="alltoall.direct", chunks=4).schedule
    caps = fabric.capacities_gbps / 8 * 1e9
    alone = [evaluate(s, fabric, size) for s in (reopt, direct)]
    loads = [link_load(s, len(fabric.links)) * size / s.n_ranks for s in (reopt, direct)]
    shared = int(np.count_nonzero((loads[0] > 0) & (loads[1] > 0)))
    joint = float(np.max((loads[0] + loads[1]) / caps))
    console.print(f"  EP A2A 448 MiB, Fail2: re-optimized alone {alone[0].bandwidth_time_s * 1e3:.3f} ms, healthy "
                  f"neighbour alone {alone[1].bandwidth_time_s * 1e3:.3f} ms, links used by both {shared}, joint "
                  f"bandwidth term {joint * 1e3:.3f} ms")


def flow_check() -> None:
    """(e) α-β against the flow-level simulator (4 slices) on the groups that decide the speedups."""
    full = rail_optimized(1, 16, 8)
    cases = [("Llama TP AG", LLAMA, "tp", Collective.ALLGATHER, LLAMA.calls[0].size_bytes, "Fail3"),
             ("DeepSeek ZeRO AG", DEEPSEEK, "ep", Collective.ALLGATHER, DEEPSEEK.calls[4].size_bytes, "Fail2"),
             ("DeepSeek EP A2A", DEEPSEEK, "ep", Collective.ALLTOALL, DEEPSEEK.calls[1].size_bytes, "Fail2")]
    for label, workload, kind, collective, size, fault in cases:
        ranks = groups(workload, kind, 128)[0]
        for state in ("healthy", fault):
            fabric = group_fabric(full if state == "healthy" else apply_fault(full, state), ranks)
            base = "alltoall.direct" if collective is Collective.ALLTOALL else "ring.nccl"
            for method in (base, None):
                options = {"chunks": 4} if method == "alltoall.direct" else {}
                schedule = optimize(fabric, collective, ranks, method=method, **options).schedule
                analytic = evaluate(schedule, fabric, size).time_s
                started = time.process_time()
                run = simulate_schedule(schedule, fabric, size, options=SimOptions(slices=4))
                console.print(f"  {label} {state} {method or 'mccl'}: alpha-beta {analytic * 1e3:.3f} ms, flow "
                              f"{run.time_s * 1e3:.3f} ms (flow / alpha-beta {run.time_s / analytic:.3f}; "
                              f"{time.process_time() - started:.1f} s CPU)")


def implied_mfu(model: Fig14Model) -> None:
    """(f) The MFU that the share-derived compute time implies (matrix FLOPs only: a lower bound)."""
    llama_tokens = LLAMA.microbatches * 8192
    llama_flops = 6 * llama_volumes()["params_per_gpu"] * llama_tokens
    # DeepSeek: 37 B activated parameters per token over 61 layers; a stage holds 1/16 of them per token
    deepseek_tokens = DEEPSEEK.microbatches * 4096
    deepseek_flops = 6 * 37e9 / 16 * deepseek_tokens
    for workload, flops, peak, label in ((LLAMA, llama_flops, 989e12, "BF16"),
                                         (DEEPSEEK, deepseek_flops, 1979e12, "FP8")):
        compute = model.step(workload, 1024, "healthy").compute_s
        console.print(f"  {workload.name}: compute {compute:.2f} s per step for {flops:.3g} FLOP per GPU -> "
                      f"MFU {flops / compute / peak:.0%} of an H100's {label} peak")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fig14"))
    parser.add_argument("--repeat", type=int, default=3, help="timed `mccl sim fig14` runs (median)")
    parser.add_argument("--skip-cli", action="store_true", help="do not time the command")
    parser.add_argument("--skip-flow", action="store_true", help="do not run the flow-level cross-check")
    args = parser.parse_args()
    console.print(f"fig14 benchmark, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    if not args.skip_cli:
        wall, cpu = time_cli(args.repeat)
        console.print(f"`mccl sim fig14 --out DIR` (128-2048 GPUs): median of {args.repeat}: {wall:.1f} s wall, "
                      f"{cpu:.1f} s CPU")
    full_table(args.out)
    model = Fig14Model()
    console.print("(a) Llama under Fail2")
    llama_fail2(model)
    console.print("(b) Llama what-ifs")
    llama_what_ifs(model)
    console.print("(c) overlay of a one-host group")
    overlay_choice()
    console.print("(d) concurrency of two EP groups")
    concurrency()
    if not args.skip_flow:
        console.print("(e) alpha-beta against the flow simulator")
        flow_check()
    console.print("(f) the compute time the comm shares imply")
    implied_mfu(model)


if __name__ == "__main__":
    main()
