"""Benchmark: the tree-packing AllGather at 16–2048 GPUs, healthy and Fail1/2/3 (issue 17, deliverable 4).

    python benchmarks/treepack_table.py --gpus 16,128 --flow-gpus 16        # the cheap rows, flow at 16
    python benchmarks/treepack_table.py --gpus 128 --flow-gpus 128 --faults healthy
    python benchmarks/treepack_table.py --gpus 512 --faults healthy,fail2    # solve + α-β only
    python benchmarks/treepack_table.py --gpus 2048 --no-packing             # hierarchies and ring only
    python benchmarks/treepack_table.py --gpus 128,512 --flow-gpus 128,512 --flow-methods pack,chosen,ring
    python benchmarks/treepack_table.py --gpus 1024 --flat --flow-gpus ""   # one segment: treepack_scale's fabric

Per fabric (HPN ``rail_optimized``: 16 = 1×2×8, 128 = 1×16×8, 512 = 4×16×8, 1024 = 8×16×8, 2048 =
16×16×8; with ``--flat`` one segment, 1×(GPUs/8)×8, the fabric of ``treepack_scale.py``'s time bars, so
that one synthesis serves both) and fault, all in one process, one row each:

* the optimal packing, cold (``optimize(topology, "allgather")``): solve time (CPU,
  ``time.process_time``: the machine is shared), the bound, its steady state, tree depth, route
  length (max / mean links) and whether every route is a simple path (``validate``, which now
  refuses a route that visits a node twice; counted independently here too);
* α-β algbw (:func:`mccl.sim.evaluate`) at 16 MiB and 1 GiB of the packing, the depth-2/3 rail
  hierarchy (:mod:`mccl.synth.treepack.hierarchical`) and the NCCL ring (8 channels), and which of
  packing / rail / host-rail the estimate of :mod:`mccl.synth.treepack.depth` prefers at each size
  (``chosen_<size>``: among those three only);
* with ``--flow-gpus``: flow-level algbw at 1 GiB (``SimOptions.executor()``: the executor's slicing,
  equal streams) of the packing, the rail hierarchy, what ``optimize(..., method="treepack.depth",
  size_bytes=1 GiB)`` returns (``chosen``; its shape in ``depth_choice_1GiB``: the packing, a
  hierarchy, the latency-aware packing or a packing with fewer trees per source) and the ring, each one's ratio to the bound and the packing's and the choice's to the
  ring (the issue's bars: ≥ 0.95 and > 1). A collective alone under equal streams runs on the
  grouped engine (:mod:`mccl.sim.grouped`), which makes 128 and 512 GPUs a matter of minutes;
* Phase 2 (switch removal, with the lower-rate search of :mod:`mccl.synth.treepack.balance`) and
  Phase 3 (tree construction) times from the packing's stats (wall, ``perf_counter``), and their CPU
  times (``phase2_cpu_s``, ``phase3_cpu_s``: the pipeline's functions wrapped, as ``treepack_scale.py``
  does), the max-flows, and the process's peak RSS when the row is done (``rss_mb``: it includes the
  ``validate`` and the α-β evaluations; one row per process gives that row's peak).

Rows print as they finish (markdown) and are appended to ``benchmarks/results/treepack_table_rows.csv``.
"""

from __future__ import annotations

import argparse
import csv
import resource
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import mccl.synth.treepack.pipeline as pipeline
from mccl.schedule import Schedule, validate
from mccl.sim import SimOptions, evaluate, simulate_schedule
from mccl.synth import optimize
from mccl.synth.common import describe_on
from mccl.synth.ring import nccl_ring
from mccl.synth.treepack.depth import estimate
from mccl.synth.treepack.hierarchical import hierarchical_allgather
from mccl.topology import Topology, apply_fault, rail_optimized

MiB = 1 << 20
SIZES = {"16MiB": 16 * MiB, "1GiB": 1024 * MiB}
SHAPES = {16: (1, 2, 8), 128: (1, 16, 8), 512: (4, 16, 8), 1024: (8, 16, 8), 2048: (16, 16, 8)}
# (treepack_table.csv: the first session's rows; treepack_table_flow.csv: before the fabric / CPU / RSS columns)
CSV = Path(__file__).resolve().parent / "results" / "treepack_table_rows.csv"  # with the fabric / phase CPU / RSS columns


def loop_count(schedule: Schedule, topology: Topology) -> int:
    """Transfers whose route visits a node twice (independent of the validator's rule): per route length,
    the routes' nodes as rows of a matrix, sorted, a repeat where two neighbours are equal."""
    tail = np.array([topology.node_index[link.src] for link in topology.links])
    head = np.array([topology.node_index[link.dst] for link in topology.links])
    transfers = schedule.transfers
    lengths = transfers.route_lengths
    starts = transfers.route_offsets[:-1]
    loops = 0
    for length in np.unique(lengths[lengths >= 2]).tolist():
        chosen = np.flatnonzero(lengths == length)
        for block in range(0, len(chosen), 1 << 20):  # bounded memory at 2,048 GPUs (42 M transfers)
            first = starts[chosen[block:block + (1 << 20)]]
            links = transfers.route_links[first[:, None] + np.arange(length)]
            nodes = np.sort(np.concatenate([tail[links[:, :1]], head[links]], axis=1), axis=1)
            loops += int(np.count_nonzero((nodes[:, 1:] == nodes[:, :-1]).any(axis=1)))
    return loops


PHASES = (("phase2_cpu_s", "split_switches"), ("phase3_cpu_s", "pack_arborescences"))
phase_cpu: dict[str, float] = {}


def _timed(name: str, function: Callable) -> Callable:
    """``function`` with its CPU time added to ``phase_cpu[name]`` (the pipeline's own phase times are wall)."""
    def wrapper(*args, **kwargs):
        started = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            phase_cpu[name] = phase_cpu.get(name, 0.0) + time.process_time() - started
    return wrapper


for _name, _attribute in PHASES:
    setattr(pipeline, _attribute, _timed(_name, getattr(pipeline, _attribute)))


def flow_algbw(schedule: Schedule, topology: Topology, size: float) -> tuple[float, float]:
    """Flow-level algbw (GB/s) with the executor's model, and the CPU seconds it took."""
    started = time.process_time()
    run = simulate_schedule(schedule, topology, size, options=SimOptions.executor(keep_chain=False))
    return run.algbw_gbs, time.process_time() - started


def measure(gpus: int, fault: str, flow: tuple[str, ...], with_packing: bool = True,
            flat: bool = False) -> dict[str, object]:
    """One row (module docstring); ``with_packing=False``: hierarchies and ring only (a size the packing
    cannot reach in the time at hand); ``flat``: one segment of GPUs/8 hosts."""
    shape = (1, gpus // 8, 8) if flat else SHAPES[gpus]
    topology = rail_optimized(*shape)
    if fault != "healthy":
        topology = apply_fault(topology, fault)
    row: dict[str, object] = {"gpus": gpus, "fabric": "x".join(map(str, shape)), "fault": fault}
    candidates: dict[str, Schedule] = {}
    if with_packing:
        phase_cpu.clear()
        started = time.process_time()
        packing = optimize(topology, "allgather")
        solve_cpu = time.process_time() - started
        row.update({name: round(value, 2) for name, value in phase_cpu.items()})
        row["max_flows"] = int(packing.schedule.meta.stat("max_flows", 0.0))
        started = time.process_time()
        validate(packing.schedule, topology)
        validate_cpu = time.process_time() - started
        schedule = candidates["packing"] = packing.schedule
        lengths = schedule.transfers.route_lengths
        row.update({
            "solve_cpu_s": round(solve_cpu, 2), "validate_cpu_s": round(validate_cpu, 2),
            "bound_gbs": round(packing.bound_gbs or 0.0, 2), "steady_gbs": round(packing.achieved_gbs, 2),
            "depth": int(schedule.meta.stat("max_depth")), "route_max": int(lengths.max()),
            "route_mean": round(float(lengths.mean()), 3), "loop_transfers": loop_count(schedule, topology),
            "transfers": len(lengths), "phase2_s": round(float(schedule.meta.stat("phase2_s", 0.0)), 2),
            "phase3_s": round(float(schedule.meta.stat("phase3_s", 0.0)), 2)})
    rail = candidates["rail"] = describe_on(hierarchical_allgather(topology, topology.gpus, "rail"), topology)
    validate(rail, topology)
    if gpus <= 512:  # 8 chunks per source: 33 M transfers at 2048 GPUs, more memory than this machine spares
        candidates["host-rail"] = describe_on(hierarchical_allgather(topology, topology.gpus, "host-rail"), topology)
        validate(candidates["host-rail"], topology)
    ring = nccl_ring(topology, "allgather")
    row.update({"rail_depth": rail.transfers.n_steps, "rail_steady_gbs": round(rail.meta.achieved_gbs, 2)})
    for label, size in SIZES.items():
        for name, candidate in (("pack", candidates.get("packing")), ("rail", rail), ("ring", ring)):
            if candidate is not None:
                row[f"{name}_ab_{label}"] = round(evaluate(candidate, topology, size).algbw_gbs, 2)
        estimates = {name: estimate(candidate, topology, size).time_s for name, candidate in candidates.items()}
        row[f"chosen_{label}"] = min(estimates, key=estimates.__getitem__)
    if flow:
        size = SIZES["1GiB"]
        chosen = None
        if "chosen" in flow:  # what optimize(method="treepack.depth", size_bytes=1 GiB) returns
            started = time.process_time()
            picked = optimize(topology, "allgather", method="treepack.depth", size_bytes=size).schedule
            row["depth_choice_1GiB"] = dict(picked.meta.inputs)["shape"]
            row["depth_choice_cpu_s"] = round(time.process_time() - started, 1)
            validate(picked, topology)
            named = {"packing": candidates.get("packing"), "rail": rail, "host-rail": candidates.get("host-rail")}
            chosen = named.get(str(row["depth_choice_1GiB"])) or picked  # simulated once if it is one of those
        done: dict[int, tuple[float, float]] = {}
        for name, candidate in (("pack", candidates.get("packing")), ("rail", rail), ("chosen", chosen),
                                ("ring", ring)):
            if name not in flow or candidate is None:
                continue
            if id(candidate) not in done:  # the choice is one of the others: simulated once
                done[id(candidate)] = flow_algbw(candidate, topology, size)
            gbs, cpu = done[id(candidate)]
            row[f"{name}_flow_1GiB"] = round(gbs, 2)
            row[f"{name}_flow_cpu_s"] = round(cpu, 1)
            if with_packing:
                row[f"{name}_flow_vs_bound"] = round(gbs / float(row["bound_gbs"]), 4)
        for name in ("pack", "chosen"):
            if name in flow and "ring" in flow and f"{name}_flow_1GiB" in row:
                row[f"{name}_flow_vs_ring"] = round(float(row[f"{name}_flow_1GiB"]) / float(row["ring_flow_1GiB"]), 3)
    row["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return row


COLUMNS = ["gpus", "fabric", "fault", "solve_cpu_s", "phase2_cpu_s", "phase3_cpu_s", "max_flows", "rss_mb", "validate_cpu_s", "bound_gbs", "steady_gbs", "depth", "route_max",
           "route_mean", "loop_transfers", "transfers", "phase2_s", "phase3_s", "rail_depth", "rail_steady_gbs",
           *[f"{name}_ab_{label}" for label in SIZES for name in ("pack", "rail", "ring")],
           *[f"chosen_{label}" for label in SIZES], "depth_choice_1GiB", "depth_choice_cpu_s",
           "pack_flow_1GiB", "rail_flow_1GiB", "chosen_flow_1GiB", "ring_flow_1GiB", "pack_flow_vs_bound",
           "rail_flow_vs_bound", "chosen_flow_vs_bound", "ring_flow_vs_bound", "pack_flow_vs_ring",
           "chosen_flow_vs_ring", "pack_flow_cpu_s", "rail_flow_cpu_s", "chosen_flow_cpu_s", "ring_flow_cpu_s",
           "finished_utc"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="16,128", help="comma-separated, of 16, 128, 512, 2048")
    parser.add_argument("--faults", default="healthy,fail1,fail2,fail3")
    parser.add_argument("--flow-gpus", default="16", help="sizes that also get the flow-level simulation ('' for none)")
    parser.add_argument("--flow-methods", default="pack,rail,chosen,ring",
                        help="which schedules the flow level simulates (of pack, rail, chosen, ring)")
    parser.add_argument("--no-packing", action="store_true", help="hierarchies and ring only (no packing columns)")
    parser.add_argument("--flat", action="store_true", help="one segment of GPUs/8 hosts (treepack_scale.py's fabric)")
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args()
    sizes = [int(value) for value in args.gpus.split(",")]
    unknown = [value for value in sizes if value not in SHAPES]
    if unknown:
        parser.error(f"--gpus: no HPN shape for {unknown}; choose from {sorted(SHAPES)}")
    flow_sizes = {int(value) for value in args.flow_gpus.split(",") if value}
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    fresh = not args.csv.exists()
    print("| " + " | ".join(COLUMNS) + " |", flush=True)
    for gpus in sizes:
        for fault in args.faults.split(","):
            flow = tuple(args.flow_methods.split(",")) if gpus in flow_sizes else ()
            row = measure(gpus, fault, flow, with_packing=not args.no_packing, flat=args.flat)
            row["finished_utc"] = time.strftime("%H:%M:%S", time.gmtime())
            print("| " + " | ".join(str(row.get(column, "")) for column in COLUMNS) + " |", flush=True)
            with args.csv.open("a", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=COLUMNS)
                if fresh:
                    writer.writeheader()
                    fresh = False
                writer.writerow({column: row.get(column, "") for column in COLUMNS})


if __name__ == "__main__":
    main()
