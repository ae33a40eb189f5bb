"""Benchmark of ``mccl sim fig14`` (issue 11, deliverable 4): the full table, its cost, and a measurement
behind every deviation from the paper's Fail2 peaks (2.85× Llama, 4.99× DeepSeek).

    PYTHONPATH=src .venv/bin/python benchmarks/fig14.py --out benchmarks/results/fig14
    PYTHONPATH=src .venv/bin/python benchmarks/fig14.py --skip-cli   # no timed `mccl sim fig14` runs

Parts:

1. ``mccl sim fig14 --out DIR`` in a fresh interpreter, ``--repeat`` times: wall and CPU seconds
   (children's rusage), median. The bar: ≤ 10 min at 2048 GPUs (the command runs 128–2048).
2. The full table (every model, size, fault) as CSV, and every call of every step.
3. Deviations, each a measurement:
   a. Llama under Fail2 at 1024 — the DP groups of host0 together: NCCL joint vs alone, mccl's
      residual-capacity schedule joint, the host's NIC cut bound, and what the disjoint assumption
      (relays at full capacity, timed alone) would have claimed against that schedule's joint time;
      the cut bound without relays (the synthesizer on the real topology);
   b. the two step definitions (paper's 16K tokens, workloads.md's global batch): shares per call;
   c. the overlay choice: tree packing on one host with the NIC loop through ToR + aggregation
      (healthy), which the one-host overlay leaves out;
   d. concurrency: the two EP groups of a segment under Fail2 (re-optimized + direct) evaluated
      jointly on one fabric against each alone;
   e. α-β against the flow-level simulator (4 slices) for the groups that decide the speedups;
   g. relays on every host instead of the faulted one only (128 GPUs, healthy and Fail2, DP groups jointly);
   f. what the compute time derived from the paper's communication shares implies: the MFU it would
      take to do a step's matrix FLOPs (6 · parameters · tokens per GPU) in it on an H100 (989 TFLOP/s
      dense BF16, 1979 FP8).
"""

from __future__ import annotations

import argparse
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

from mccl.experiments.fig14 import FAULT_STATES, Fig14Model, fig14_training, group_fabric  # noqa: E402
from mccl.experiments.fig14_fabric import fault_hosts  # noqa: E402
from mccl.experiments.fig14_joint import disjoint_claim, joint_times  # noqa: E402
from mccl.experiments.fig14_workloads import DEEPSEEK, LLAMA, STEPS, groups, llama_volumes  # noqa: E402
from mccl.schedule import Collective, link_load  # noqa: E402
from mccl.sim.analytic import evaluate  # noqa: E402
from mccl.sim.engine import simulate_schedule  # noqa: E402
from mccl.sim.inputs import SimOptions  # noqa: E402
from mccl.synth import allgather_cut_bound, optimize  # noqa: E402
from mccl.topology import NodeKind, apply_fault, rail_optimized  # noqa: E402

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
        steps.append({"model": step.workload, "step": step.step, "gpus": step.n_gpus, "fault": step.fault,
                      "compute_s": f"{step.compute_s:.3f}", "nccl_comm_s": f"{step.nccl_comm_s:.3f}",
                      "mccl_comm_s": f"{step.mccl_comm_s:.3f}", "nccl_step_s": f"{step.nccl_step_s:.3f}",
                      "mccl_step_s": f"{step.mccl_step_s:.3f}", "speedup": f"{step.speedup:.4f}"})
        for call in step.calls:
            calls.append({"model": step.workload, "step": step.step, "gpus": step.n_gpus, "fault": step.fault,
                          "call": call.call.name, "joint_groups": call.joint_groups,
                          "count": call.count, "nccl_ms": f"{call.nccl_s * 1e3:.4f}",
                          "mccl_ms": f"{call.mccl_s * 1e3:.4f}", "choice": call.mccl_choice,
                          "faulted_group_nccl_ms": f"{call.faulted_nccl_s * 1e3:.4f}",
                          "faulted_group_reopt_ms": "" if call.faulted_reopt_s is None
                          else f"{call.faulted_reopt_s * 1e3:.4f}"})
    write_csv(out / "fig14_steps.csv", steps)
    write_csv(out / "fig14_calls.csv", calls)
    console.print("| model | step | GPUs | fault | NCCL step (s) | mccl step (s) | speedup |")
    for row in steps:
        console.print(f"| {row['model']} | {row['step']} | {row['gpus']} | {row['fault']} | {row['nccl_step_s']} | "
                      f"{row['mccl_step_s']} | {float(row['speedup']):.3f}x |")
    report.plot(out)


def llama_fail2(model: Fig14Model) -> None:
    """(a) Llama's DP groups under Fail2 at 1024: joint and alone, relays at the residual and at full capacity."""
    healthy, faulted = model.fabric(1024, "healthy"), model.fabric(1024, "Fail2")
    hosts = fault_hosts(healthy, faulted)
    every = groups(LLAMA, "dp", 1024)
    touching = [g for g in every if any(faulted.node(gpu).host in hosts for gpu in g)]
    for call in LLAMA.calls[2:]:
        ring_h = model.evaluation(model.schedule(group_fabric(healthy, every[0]), every[0], call.collective,
                                                 "ring.nccl"), group_fabric(healthy, every[0]), call.size_bytes)
        joint = joint_times(model, faulted, touching, call, hosts, "ring.nccl")
        started = time.process_time()
        alone, naive = disjoint_claim(model, faulted, touching, call, hosts, "ring.nccl")
        cpu = time.process_time() - started
        host_caps = [link.gbps for link in faulted.links if link.src in {f"gpu{i}" for i in range(8)}
                     and faulted.node(link.dst).kind is NodeKind.TOR]
        nic_bound = ring_h.bandwidth_time_s * 8 * 400 / sum(host_caps)
        plain = allgather_cut_bound(group_fabric(faulted, every[0]), every[0]).algbw_gbs
        relay = allgather_cut_bound(group_fabric(faulted, every[0], hosts), every[0]).algbw_gbs
        console.print(f"  {call.short} {call.size_bytes / 1e9:.2f} GB, {len(touching)} DP groups on host0: healthy ring "
                      f"{ring_h.time_s:.4f} s; NCCL joint {joint.nccl_s:.4f} s (alone, max {joint.nccl_disjoint_s:.4f}); "
                      f"mccl joint {joint.mccl_s:.4f} s = {joint.mccl_s / ring_h.time_s:.3f}x healthy (residual sized "
                      f"for T = {joint.target_s:.4f} s); host0 NIC cut bound {nic_bound:.4f} s "
                      f"({nic_bound / ring_h.bandwidth_time_s:.3f}x)")
        console.print(f"    disjoint assumption: relays at full capacity, alone {alone:.4f} s "
                      f"({alone / ring_h.time_s:.3f}x healthy) — that schedule next to the 7 rings: {naive:.4f} s "
                      f"({naive / ring_h.time_s:.3f}x) [{cpu:.1f} s CPU]; group cut bound without relays "
                      f"{plain:.2f} GB/s, with {relay:.2f} GB/s")


def step_definitions(model: Fig14Model) -> None:
    """(b) Both step definitions at 1024: per-call shares of healthy NCCL comm and the Fail2/Fail3 speedups."""
    for workload in (LLAMA, DEEPSEEK):
        for kind in STEPS:
            calls = model.comm(workload, 1024, "healthy", kind)
            total = sum(c.count * c.nccl_s for c in calls)
            shares = ", ".join(f"{c.call.short} {c.count} x {c.nccl_s * 1e3:.2f} ms = {c.count * c.nccl_s / total:.1%}"
                               for c in calls)
            speedups = ", ".join(f"{fault} {model.step(workload, 1024, fault, kind).speedup:.3f}x"
                                 for fault in FAULT_STATES[1:])
            console.print(f"  {workload.short} {kind}: {shares}; {speedups}")


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
    """(f) The MFU that the share-derived compute time implies (matrix FLOPs only: a lower bound), per step."""
    # DeepSeek: 37 B activated parameters per token over 61 layers; a stage holds 1/16 of them per token
    per_token = {LLAMA.name: 6 * llama_volumes()["params_per_gpu"], DEEPSEEK.name: 6 * 37e9 / 16}
    for workload, peak, label in ((LLAMA, 989e12, "BF16"), (DEEPSEEK, 1979e12, "FP8")):
        for kind in STEPS:
            flops = per_token[workload.name] * workload.step_microbatches(kind) * workload.sequence
            compute = model.step(workload, 1024, "healthy", kind).compute_s
            console.print(f"  {workload.name} {kind}: compute {compute:.3f} s per step for {flops:.3g} FLOP per GPU -> "
                          f"MFU {flops / compute / peak:.0%} of an H100's {label} peak")


def all_host_relays() -> None:
    """(g) Relays on all 16 hosts against on the faulted host only: the 8 DP groups of 128 GPUs, jointly."""
    model = Fig14Model()
    every = groups(LLAMA, "dp", 128)
    everywhere = frozenset(f"host{h}" for h in range(16))
    for fault in ("healthy", "Fail2"):
        fabric = model.fabric(128, fault)
        only = fault_hosts(model.fabric(128, "healthy"), fabric)
        for call in LLAMA.calls[2:]:
            wide = joint_times(model, fabric, every, call, everywhere, "ring.nccl")
            narrow = "-" if not only else f"{joint_times(model, fabric, every, call, only, 'ring.nccl').mccl_s:.4f} s"
            console.print(f"  {fault} {call.short}: NCCL {wide.nccl_s:.4f} s, mccl with relays on every host "
                          f"{wide.mccl_s:.4f} s ({wide.choice}), on the faulted host only {narrow}")


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
    console.print("(a) Llama's DP groups under Fail2 at 1024, together")
    llama_fail2(model)
    console.print("(b) the two step definitions")
    step_definitions(model)
    console.print("(c) overlay of a one-host group")
    overlay_choice()
    console.print("(d) concurrency of two EP groups")
    concurrency()
    if not args.skip_flow:
        console.print("(e) alpha-beta against the flow simulator")
        flow_check()
    console.print("(g) relays on every host")
    all_host_relays()
    console.print("(f) the compute time the comm shares imply")
    implied_mfu(model)


if __name__ == "__main__":
    main()
