"""Benchmark: the tree-packing AllGather against the NCCL ring, flow-simulated as the executor runs it.

    python benchmarks/healthy_gap.py                          # 2x8 and 8x8 HPN, healthy and Fail2, 16 MiB and 1 GiB
    python benchmarks/healthy_gap.py --shapes 1,2,8 --sizes 1073741824
    python benchmarks/healthy_gap.py --shapes 1,8,8 --faults healthy --methods depth   # 64 GPUs: depth + guard

``--methods`` picks the tree schedules (default all): ``tree`` (the default packing), ``tree_la``
(``latency_aware`` trees), ``depth`` (``treepack.depth`` at each size: the packing, its shallow variant,
the depth-2/3 hierarchies and packings of ≤ 4/2/1 trees per source, whichever its estimate says is
fastest). For ``depth`` also the never-worse guard's choice between it and the ring
(:func:`mccl.control.guard.choose`, the manager's tolerance): with the guard's α-β default
(``guard_ab``) and with a flow-simulation predictor (``guard_sim``, the figures of this run) — what
the controller would run on the healthy fabric, against the ring.

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

from mccl.control.guard import alpha_beta_seconds, choose
from mccl.schedule import Schedule
from mccl.sim import SimOptions, simulate_schedule
from mccl.synth import optimize
from mccl.synth.options import DepthOptions
from mccl.synth.ring import nccl_ring
from mccl.synth.treepack import synthesize
from mccl.topology import Topology, apply_fault, rail_optimized

MiB = 1 << 20


def _simulate(schedule: Schedule, topology: Topology, size: float) -> tuple[float, int, float]:
    options = SimOptions.executor(keep_chain=False)
    start = time.process_time()
    run = simulate_schedule(schedule, topology, size, options=options)
    return run.algbw_gbs, options.slices_for(schedule, size), time.process_time() - start


GUARD_TOLERANCE = 0.01  # ControlConfig.guard_tolerance's default


def _depth(topology: Topology, size: float, ring: Schedule, ring_s: float, ring_gbs: float) -> dict[str, object]:
    """``treepack.depth`` at ``size``, simulated, and the guard's choice between it and the ring."""
    cpu = time.process_time()
    chosen = optimize(topology, "allgather", method="treepack.depth", options=DepthOptions(size_bytes=size))
    choice_cpu = time.process_time() - cpu
    gbs, slices, sim_cpu = _simulate(chosen.schedule, topology, size)
    shape = dict(chosen.schedule.meta.inputs).get("shape", "?")
    row: dict[str, object] = {"depth_shape": shape, "depth_gbs": round(gbs, 2), "depth_vs_ring": round(gbs / ring_gbs, 4),
                              "depth_depth": int(chosen.schedule.meta.stat("depth") or 0), "depth_slices": slices,
                              "depth_choice_cpu_s": round(choice_cpu, 2), "depth_cpu_s": round(sim_cpu, 2)}
    simulated = {"candidate": size / gbs / 1e9, "baseline": ring_s}
    alpha_beta = {"candidate": alpha_beta_seconds(chosen.schedule, topology, size),
                  "baseline": alpha_beta_seconds(ring, topology, size)}
    for label, predicted in (("guard_ab", alpha_beta), ("guard_sim", simulated)):
        pick = choose(predicted, GUARD_TOLERANCE)
        runs = gbs if pick == "candidate" else ring_gbs
        row.update({label: "depth" if pick == "candidate" else "ring", f"{label}_gbs": round(runs, 2),
                    f"{label}_vs_ring": round(runs / ring_gbs, 4)})
    return row


def measure(shape: tuple[int, int, int], fault: str, sizes: list[float],
            methods: tuple[str, ...] = ("tree", "tree_la", "depth")) -> list[dict[str, object]]:
    base = rail_optimized(*shape)
    topology = base if fault == "healthy" else apply_fault(base, fault)
    packings = {label: synthesize(topology, latency_aware=label == "tree_la") for label in ("tree", "tree_la")
                if label in methods}
    ring = nccl_ring(topology, "allgather")
    default = packings.get("tree") or synthesize(topology)
    bound = default.schedule.meta.throughput_bound_gbs
    rows = []
    for size in sizes:
        ring_gbs, ring_slices, ring_cpu = _simulate(ring, topology, size)
        row: dict[str, object] = {"fabric": f"rail_optimized{shape}", "gpus": len(topology.gpus), "fault": fault,
                                  "size_mib": size / MiB, "bound_gbs": round(bound, 2),
                                  "ring_gbs": round(ring_gbs, 2), "ring_slices": ring_slices,
                                  "ring_cpu_s": round(ring_cpu, 2)}
        for label, result in packings.items():
            gbs, slices, cpu = _simulate(result.schedule, topology, size)
            row.update({f"{label}_gbs": round(gbs, 2), f"{label}_vs_ring": round(gbs / ring_gbs, 4),
                        f"{label}_vs_bound": round(gbs / bound, 4), f"{label}_planned_gbs": round(result.achieved_gbs, 2),
                        f"{label}_depth": int(result.schedule.meta.stat("max_depth")), f"{label}_slices": slices,
                        f"{label}_cpu_s": round(cpu, 2)})
        if "depth" in methods:
            row.update(_depth(topology, size, ring, size / ring_gbs / 1e9, ring_gbs))
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1,2,8", "1,8,8"])
    parser.add_argument("--faults", nargs="+", default=["healthy", "Fail2"])
    parser.add_argument("--sizes", nargs="+", type=float, default=[16 * MiB, 1024 * MiB])
    parser.add_argument("--methods", default="tree,tree_la,depth", help="tree schedules: tree, tree_la, depth")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "healthy_gap.csv")
    args = parser.parse_args()
    methods = tuple(args.methods.split(","))
    rows = []
    for shape in args.shapes:
        for fault in args.faults:
            rows += measure(tuple(int(x) for x in shape.split(",")), fault, args.sizes, methods)  # type: ignore[arg-type]
    write_csv(args.out, rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
