"""Benchmark: the tree-packing AllGather against the NCCL ring, flow-simulated as the executor runs it.

    python benchmarks/healthy_gap.py                          # 2x8 and 8x8 HPN, healthy and Fail2, 16 MiB and 1 GiB
    python benchmarks/healthy_gap.py --shapes 1,2,8 --sizes 1073741824

For each fabric (``rail_optimized(S,H,N)``), fault (healthy, Fail2) and size: the tree packing
(default and ``latency_aware`` trees), the NCCL-style ring, and the fabric's AllGather bound (the
packing's fractional optimum), all simulated in the same run with ``SimOptions.executor()`` — the
executor's slicing (:mod:`mccl.schedule.slicing`) and its equal, independent streams (see
``mccl.sim.compiled``). Reports algbw, the ratio to the ring and to the bound, tree depth, the slices
per chunk the executor uses at that size, and the CPU seconds of each simulation (the machine may be
shared: CPU time, not wall). Writes ``benchmarks/results/healthy_gap.csv``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.schedule import Schedule
from mccl.sim import SimOptions, simulate_schedule
from mccl.synth.ring import nccl_ring
from mccl.synth.treepack import synthesize
from mccl.topology import Topology, apply_fault, rail_optimized

MiB = 1 << 20


def _simulate(schedule: Schedule, topology: Topology, size: float) -> tuple[float, int, float]:
    options = SimOptions.executor(keep_chain=False)
    start = time.process_time()
    run = simulate_schedule(schedule, topology, size, options=options)
    return run.algbw_gbs, options.slices_for(schedule, size), time.process_time() - start


def measure(shape: tuple[int, int, int], fault: str, sizes: list[float]) -> list[dict[str, object]]:
    base = rail_optimized(*shape)
    topology = base if fault == "healthy" else apply_fault(base, fault)
    default = synthesize(topology)
    shallow = synthesize(topology, latency_aware=True)
    ring = nccl_ring(topology, "allgather")
    bound = default.schedule.meta.throughput_bound_gbs
    rows = []
    for size in sizes:
        ring_gbs, ring_slices, ring_cpu = _simulate(ring, topology, size)
        row: dict[str, object] = {"fabric": f"rail_optimized{shape}", "gpus": len(topology.gpus), "fault": fault,
                                  "size_mib": size / MiB, "bound_gbs": round(bound, 2),
                                  "ring_gbs": round(ring_gbs, 2), "ring_slices": ring_slices,
                                  "ring_cpu_s": round(ring_cpu, 2)}
        for label, result in (("tree", default), ("tree_la", shallow)):
            gbs, slices, cpu = _simulate(result.schedule, topology, size)
            row.update({f"{label}_gbs": round(gbs, 2), f"{label}_vs_ring": round(gbs / ring_gbs, 4),
                        f"{label}_vs_bound": round(gbs / bound, 4), f"{label}_planned_gbs": round(result.achieved_gbs, 2),
                        f"{label}_depth": int(result.schedule.meta.stat("max_depth")), f"{label}_slices": slices,
                        f"{label}_cpu_s": round(cpu, 2)})
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1,2,8", "1,8,8"])
    parser.add_argument("--faults", nargs="+", default=["healthy", "Fail2"])
    parser.add_argument("--sizes", nargs="+", type=float, default=[16 * MiB, 1024 * MiB])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "healthy_gap.csv")
    args = parser.parse_args()
    rows = []
    for shape in args.shapes:
        for fault in args.faults:
            rows += measure(tuple(int(x) for x in shape.split(",")), fault, args.sizes)  # type: ignore[arg-type]
    write_csv(args.out, rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
