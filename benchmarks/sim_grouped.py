"""Benchmark: the grouped engine against the general flow engine on tree-packing AllGathers (issue 17).

    python benchmarks/sim_grouped.py --shapes 1,2,8:1073741824 1,8,8:67108864
    python benchmarks/sim_grouped.py --shapes 1,16,8:1073741824 --grouped-only

Per HPN shape and size: the optimal packing (``optimize(rail_optimized(...), "allgather")``) simulated with
the executor's model (``SimOptions.executor()``) by both engines (``engine="flows"`` and
``engine="grouped"``), CPU seconds of each (``time.process_time``: the machine is shared), the algbw of
each and their relative difference in completion time (the grouped engine computes the same
max-min rates per hop instead of per flow; the difference is floating-point noise).
"""

from __future__ import annotations

import argparse
import time

from mccl.sim import SimOptions, simulate_schedule
from mccl.synth import optimize
from mccl.topology import rail_optimized


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["1,2,8:1073741824", "1,8,8:67108864"],
                        help="S,H,N:size_bytes entries")
    parser.add_argument("--grouped-only", action="store_true", help="skip the general engine (too slow at 128+)")
    args = parser.parse_args()
    print("| GPUs | size | slices | flows CPU s | grouped CPU s | speedup | algbw flows | algbw grouped | rel. diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for entry in args.shapes:
        shape_text, size_text = entry.split(":")
        shape = tuple(int(value) for value in shape_text.split(","))
        size = float(size_text)
        topology = rail_optimized(*shape)
        schedule = optimize(topology, "allgather").schedule
        runs = {}
        for engine in ("grouped",) if args.grouped_only else ("grouped", "flows"):
            options = SimOptions.executor(keep_chain=False, engine=engine)
            started = time.process_time()
            run = simulate_schedule(schedule, topology, size, options=options)
            runs[engine] = (run, time.process_time() - started)
        slices = SimOptions.executor().slices_for(schedule, size)
        grouped, grouped_cpu = runs["grouped"]
        if "flows" in runs:
            flows, flows_cpu = runs["flows"]
            print(f"| {len(topology.gpus)} | {size:.0f} | {slices} | {flows_cpu:.2f} | {grouped_cpu:.2f} | "
                  f"{flows_cpu / grouped_cpu:.1f}× | {flows.algbw_gbs:.2f} | {grouped.algbw_gbs:.2f} | "
                  f"{abs(grouped.end_s / flows.end_s - 1):.1e} |", flush=True)
        else:
            print(f"| {len(topology.gpus)} | {size:.0f} | {slices} | – | {grouped_cpu:.2f} | – | – | "
                  f"{grouped.algbw_gbs:.2f} | – |", flush=True)


if __name__ == "__main__":
    main()
