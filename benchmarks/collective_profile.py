"""Where a collective's CPU goes on 8 ranks of the emulated fabric, telemetry on as in the loop (issue 15, bar 50 ms).

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/collective_profile.py --kind allgather --kib 64 --scale 10000

``benchmarks/collective_floor.py`` found 22–33 ms of CPU floor per collective at 8 ranks on 2 cores. Here each rank
runs ``--repeats`` collectives (the demo's schedule, its telemetry config, a sink that keeps the samples), after
``--warmup``; per rank: the process's CPU per collective (``process_time``: every thread — main, telemetry
waiters, gloo's), the main thread's alone (``thread_time``), and wall; rank 0 under ``cProfile`` (main thread)
when ``--profile``, its top functions by own time written to ``benchmarks/results/collective_profile{tag}.txt``.
Medians; CSV ``benchmarks/results/collective_profile{tag}.csv``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.experiments.demo import DemoConfig, synth_options
from mccl.experiments.demo_ranks import known_answer, source_of
from mccl.experiments.netemu import EmulatedFabric, FabricPlan, unsupported_reason
from mccl.experiments.netemu.ranks import run_ranks_in_fabric

RESULTS = Path(__file__).resolve().parent / "results"


def _rank(rank: int, world: int, plan, text: str, kind: str, size: int, repeats: int, warmup: int,  # noqa: ANN001
          telemetry: bool, profile: bool) -> dict:
    import cProfile
    import io
    import pstats

    import torch
    import torch.distributed as dist

    from mccl.runtime import MemorySink, TelemetryConfig, init
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    topology = parse_topology(DemoConfig().topology_spec)
    sink = MemorySink() if telemetry else None
    comm = init(dist.group.WORLD, None, topology=topology, schedules=[loads_schedule(text)], hot_swap=False,
                name=f"profile-{kind}", sink=sink, telemetry=TelemetryConfig(flush_interval_s=0.02) if telemetry else None)
    sized = DemoConfig(ag_bytes=size, a2a_bytes=size)
    rows = []
    profiler = cProfile.Profile() if profile and rank == 0 else None
    for index in range(warmup + repeats):
        sources = [source_of(kind, sized, world, peer, index, torch) for peer in range(world)]
        output = torch.empty(sources[rank].numel() * (world if kind == "allgather" else 1), dtype=torch.int32)
        dist.barrier()
        if profiler is not None and index == warmup:
            profiler.enable()
        start, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
        if kind == "allgather":
            comm.all_gather_into_tensor(output, sources[rank])
        else:
            comm.all_to_all_single(output, sources[rank])
        row = (time.perf_counter() - start, time.process_time() - cpu, time.thread_time() - main)
        if index >= warmup:
            rows.append(row)
        if not torch.equal(output, known_answer(kind, sources, rank, world, torch)):
            raise RuntimeError(f"{kind} {size}: wrong output on rank {rank}")
    text_out = ""
    if profiler is not None:
        profiler.disable()
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(25)
        text_out = stream.getvalue()
    comm.close()
    return {"rows": rows, "profile": text_out, "samples": len(sink.samples) if sink is not None else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("allgather", "alltoall"), default="allgather")
    parser.add_argument("--kib", type=int, default=64)
    parser.add_argument("--scale", type=float, default=10000.0)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--telemetry", choices=("on", "off"), default="on")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason is not None:
        raise SystemExit(f"netemu: {reason}")
    from mccl.schedule import Collective, dumps_schedule
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    config = DemoConfig(scale=args.scale, chunks=args.chunks)
    topology = parse_topology(config.topology_spec)
    text = dumps_schedule(optimize(topology, args.kind, options=synth_options(config.chunks)[Collective(args.kind)]).schedule)
    plan = FabricPlan.from_topology(topology, scale=args.scale, nvlink=config.nvlink)
    started = time.strftime("%H:%M:%S", time.gmtime())
    with EmulatedFabric(plan) as built:
        outputs = run_ranks_in_fabric(_rank, built.plan, text, args.kind, args.kib << 10, args.repeats, args.warmup,
                                      args.telemetry == "on", args.profile, timeout_s=600)
    walls = [max(out["rows"][i][0] for out in outputs) for i in range(args.repeats)]
    cpu_all = [sum(out["rows"][i][1] for out in outputs) for i in range(args.repeats)]
    main_all = [sum(out["rows"][i][2] for out in outputs) for i in range(args.repeats)]
    row = {"started_utc": started, "kind": args.kind, "kib": args.kib, "scale": args.scale, "chunks": args.chunks,
           "telemetry": args.telemetry, "wall_ms": round(statistics.median(walls) * 1e3, 2),
           "cpu_ms_all_ranks": round(statistics.median(cpu_all) * 1e3, 2),
           "main_thread_cpu_ms_all_ranks": round(statistics.median(main_all) * 1e3, 2),
           "rank0_cpu_ms": round(statistics.median(r[1] for r in outputs[0]["rows"]) * 1e3, 2),
           "rank0_main_cpu_ms": round(statistics.median(r[2] for r in outputs[0]["rows"]) * 1e3, 2),
           "samples_rank0": outputs[0]["samples"]}
    print(row, flush=True)
    write_csv(RESULTS / f"collective_profile{args.tag}.csv", [row])
    if args.profile:
        (RESULTS / f"collective_profile{args.tag}.txt").write_text(outputs[0]["profile"])
        print(outputs[0]["profile"])


if __name__ == "__main__":
    main()
