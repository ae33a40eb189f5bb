"""Benchmark: issue 17's flow-level bar — the AllGather the controller would issue, at 1 GiB, against its bound and the ring.

    nice -n 10 python benchmarks/flow_bar.py --gpus 512 --faults healthy,fail1,fail2,fail3 --cache /tmp/flow_bar
    python benchmarks/flow_bar.py --gpus 128 --faults fail2 --synth-only --cache /tmp/flow_bar

Under a fault at 512 GPUs the choice is the rail trees routed around the hot links (``rail-adapted``,
depth 5, :mod:`mccl.synth.treepack.railadapt`), whose flow-level run takes minutes of CPU; the packings
chosen before (depth 35–59) did not finish in 19 min.

Per HPN fabric (``rail_optimized``: 16 = 1×2×8, 128 = 1×16×8, 512 = 4×16×8) and fault, one row:

* ``chosen``: what ``optimize(topology, "allgather", method="treepack.depth", size_bytes=1 GiB)``
  returns (what the controller issues for a 1 GiB AllGather), its shape, depth, trees per source and
  the CPU seconds of the choice. With ``--cache DIR`` the schedule is pickled there once and read back by
  later runs (a cold choice at 512 GPUs takes minutes; the names carry :data:`CHOICE_VERSION`); a cached schedule is used only if it still passes
  :func:`mccl.schedule.validate` on the fabric (which refuses routes that visit a node twice: the stale
  packings of earlier sessions are regenerated);
* ``bound``: the AllGather cut bound (:func:`mccl.synth.allgather_cut_bound`);
* flow-level algbw at the size (grouped engine, ``SimOptions.executor()``: the executor's slicing, equal
  streams) of the chosen schedule and of the NCCL ring (8 channels) in the same run, CPU seconds of each
  simulation (``time.process_time``: the machine is shared), ``chosen / bound`` and ``chosen / ring``
  (the bar: ≥ 0.95 and > 1);
* α-β algbw (:func:`mccl.sim.evaluate`) of the same chosen schedule and the ring at 16 MiB and 1 GiB (the
  choice is the one for ``--size``; at 16 MiB ``treepack.depth`` may pick another).

Rows print as markdown as they finish and are appended to ``benchmarks/results/flow_bar.csv``.
"""

from __future__ import annotations

import argparse
import csv
import pickle
import time
from pathlib import Path

from mccl.errors import MCCLError
from mccl.schedule import Schedule, validate
from mccl.sim import SimOptions, evaluate, simulate_schedule
from mccl.synth import allgather_cut_bound, optimize
from mccl.synth.ring import nccl_ring
from mccl.topology import Topology, apply_fault, rail_optimized

SHAPES = {16: (1, 2, 8), 64: (1, 8, 8), 128: (1, 16, 8), 512: (4, 16, 8)}
CSV = Path(__file__).resolve().parent / "results" / "flow_bar.csv"
CHOICE_VERSION = "v5"  # in the cache's file names: a choice cached by an older treepack.depth is not reused
COLUMNS = ["gpus", "fault", "size_bytes", "bound_gbs", "shape", "depth", "trees_per_source", "slices", "transfers",
           "choice_cpu_s", "cached", "chosen_ab_16MiB", "ring_ab_16MiB", "chosen_ab_1GiB", "ring_ab_1GiB", "chosen_flow_gbs", "ring_flow_gbs", "chosen_vs_bound", "chosen_vs_ring",
           "ring_vs_bound", "chosen_sim_cpu_s", "ring_sim_cpu_s", "finished_utc"]


def chosen_schedule(topology: Topology, gpus: int, fault: str, size: float, cache: Path | None
                    ) -> tuple[Schedule, float, bool]:
    """The depth-aware choice at ``size``, its CPU seconds (0 when read from the cache) and whether it was cached."""
    path = cache / f"depth-allgather-{CHOICE_VERSION}-{gpus}-{fault}-{int(size)}.pkl" if cache is not None else None
    if path is not None and path.exists():
        with path.open("rb") as handle:
            schedule = pickle.load(handle)
        try:
            validate(schedule, topology)
            return schedule, 0.0, True
        except MCCLError as error:
            print(f"cached {path.name} no longer valid ({error}); regenerating", flush=True)
    started = time.process_time()
    schedule = optimize(topology, "allgather", method="treepack.depth", size_bytes=size).schedule
    cpu = time.process_time() - started
    validate(schedule, topology)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            pickle.dump(schedule, handle)
    return schedule, cpu, False


def flow(schedule: Schedule, topology: Topology, size: float) -> tuple[float, float]:
    """Flow-level algbw (GB/s) with the executor's model, and the CPU seconds it took."""
    started = time.process_time()
    run = simulate_schedule(schedule, topology, size, options=SimOptions.executor(keep_chain=False))
    return run.algbw_gbs, time.process_time() - started


def measure(gpus: int, fault: str, size: float, cache: Path | None, synth_only: bool) -> dict[str, object]:
    """One row (module docstring)."""
    topology = rail_optimized(*SHAPES[gpus])
    if fault != "healthy":
        topology = apply_fault(topology, fault)
    schedule, choice_cpu, cached = chosen_schedule(topology, gpus, fault, size, cache)
    bound = allgather_cut_bound(topology).algbw_gbs
    row: dict[str, object] = {
        "gpus": gpus, "fault": fault, "size_bytes": int(size), "bound_gbs": round(bound, 2),
        "shape": dict(schedule.meta.inputs).get("shape", ""), "depth": schedule.transfers.n_steps,
        "trees_per_source": round(len(schedule.chunks.fraction) / gpus, 2),
        "slices": SimOptions.executor().slices_for(schedule, size), "transfers": len(schedule.transfers.sender),
        "choice_cpu_s": round(choice_cpu, 1), "cached": cached}
    ring = nccl_ring(topology, "allgather")
    for label, ab_size in (("16MiB", 16 * 2**20), ("1GiB", 2**30)):
        row[f"chosen_ab_{label}"] = round(evaluate(schedule, topology, ab_size).algbw_gbs, 2)
        row[f"ring_ab_{label}"] = round(evaluate(ring, topology, ab_size).algbw_gbs, 2)
    if synth_only:
        return row
    chosen_gbs, chosen_cpu = flow(schedule, topology, size)
    ring_gbs, ring_cpu = flow(ring, topology, size)
    row.update({"chosen_flow_gbs": round(chosen_gbs, 2), "ring_flow_gbs": round(ring_gbs, 2),
                "chosen_vs_bound": round(chosen_gbs / bound, 4), "chosen_vs_ring": round(chosen_gbs / ring_gbs, 3),
                "ring_vs_bound": round(ring_gbs / bound, 4), "chosen_sim_cpu_s": round(chosen_cpu, 1),
                "ring_sim_cpu_s": round(ring_cpu, 1)})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="512", help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--faults", default="healthy,fail1,fail2,fail3")
    parser.add_argument("--size", type=float, default=float(1 << 30), help="bytes (default 1 GiB)")
    parser.add_argument("--cache", type=Path, default=None, help="directory for the chosen schedules (pickles)")
    parser.add_argument("--synth-only", action="store_true", help="only build (and cache) the choices")
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args()
    sizes = [int(value) for value in args.gpus.split(",")]
    unknown = [value for value in sizes if value not in SHAPES]
    if unknown:
        parser.error(f"--gpus: no HPN shape for {unknown}; choose from {sorted(SHAPES)}")
    print("| " + " | ".join(COLUMNS) + " |", flush=True)
    for gpus in sizes:
        for fault in args.faults.split(","):
            row = measure(gpus, fault, args.size, args.cache, args.synth_only)
            row["finished_utc"] = time.strftime("%H:%M:%S", time.gmtime())
            print("| " + " | ".join(str(row.get(column, "")) for column in COLUMNS) + " |", flush=True)
            if args.synth_only:
                continue
            args.csv.parent.mkdir(parents=True, exist_ok=True)
            fresh = not args.csv.exists()
            with args.csv.open("a", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=COLUMNS)
                if fresh:
                    writer.writeheader()
                writer.writerow({column: row.get(column, "") for column in COLUMNS})


if __name__ == "__main__":
    main()
