"""How short can a collective be on the emulated fabric while its NIC stays the bottleneck? (issue 15, bar 50 ms)

    PYTHONPATH=src .venv/bin/python benchmarks/collective_floor.py --scale 2000 --ag 64,128,256 --a2a 128,256,512
    PYTHONPATH=src .venv/bin/python benchmarks/collective_floor.py --scale 20 --ag 64 --a2a 128 --nvlink unshaped  # the CPU floor

Detection → first collective on a new version includes the collective in flight: it is ≤ 50 ms only where
a collective lasts well under 50 ms, and the fault must still show (a NIC halved must slow the collective:
degraded ≤ ~0.7 × healthy algbw). Per (scale, collective, size): the healthy schedule (as ``mccl demo``
synthesizes it, ``chunks`` 4) ``--repeats`` times on the healthy fabric, then rank 0 halves its NIC (both
directions, ``tc``) and the same again; per collective the slowest rank's wall time and rank 0's CPU time
(``process_time``: the executor's own cost). ``--scale`` 20 puts the NICs at 20 Gbit/s, far above what
8 ranks on 2 cores can push: that row is the CPU floor. Medians after the first call of each phase.

Writes ``benchmarks/results/collective_floor{tag}.csv``.
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
from mccl.experiments.netemu.fabric import shape_nic
from mccl.experiments.netemu.ranks import run_ranks_in_fabric

RESULTS = Path(__file__).resolve().parent / "results"


def _rank(rank: int, world: int, plan, texts: dict, cases: list[tuple[str, int]], repeats: int,  # noqa: ANN001
          factor: float) -> dict:
    """Per case (kind, bytes) and phase: [(wall s, cpu s)] of ``repeats`` collectives; rank 0 makes the fault."""
    import torch
    import torch.distributed as dist

    from mccl.runtime import init
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    config = DemoConfig()
    topology = parse_topology(config.topology_spec)
    comms = {kind: init(dist.group.WORLD, None, topology=topology, schedules=[loads_schedule(text)], hot_swap=False,
                        name=f"floor-{kind}") for kind, text in texts.items()}
    out: dict = {}
    for phase, level in (("healthy", 1.0), ("degraded", factor)):
        if rank == 0:
            shape_nic(plan, 0, level)
        dist.barrier()
        for kind, size in cases:
            sized = DemoConfig(ag_bytes=size, a2a_bytes=size)
            rows = []
            for index in range(repeats):
                sources = [source_of(kind, sized, world, peer, index, torch) for peer in range(world)]
                output = torch.empty(sources[rank].numel() * (world if kind == "allgather" else 1), dtype=torch.int32)
                dist.barrier()
                start, cpu = time.perf_counter(), time.process_time()
                if kind == "allgather":
                    comms[kind].all_gather_into_tensor(output, sources[rank])
                else:
                    comms[kind].all_to_all_single(output, sources[rank])
                rows.append((time.perf_counter() - start, time.process_time() - cpu))
                if not torch.equal(output, known_answer(kind, sources, rank, world, torch)):
                    raise RuntimeError(f"{kind} {size}: wrong output on rank {rank}")
            out[(kind, size, phase)] = rows
    for comm in comms.values():
        comm.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=2000.0)
    parser.add_argument("--ag", default="64,128,256", help="AllGather input per rank, KiB (comma list; '' none)")
    parser.add_argument("--a2a", default="128,256,512", help="AllToAll send buffer per rank, KiB")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--factor", type=float, default=0.5)
    parser.add_argument("--nvlink", choices=("shaped", "unshaped"), default="shaped")
    parser.add_argument("--chunks", type=int, default=4, help="most chunks per source / block (the demo's: 4)")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason is not None:
        raise SystemExit(f"netemu: {reason}")
    from mccl.schedule import Collective, dumps_schedule
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    config = DemoConfig(scale=args.scale, nvlink=args.nvlink, chunks=args.chunks)
    topology = parse_topology(config.topology_spec)
    cases = [("allgather", int(k) << 10) for k in args.ag.split(",") if k] + \
            [("alltoall", int(k) << 10) for k in args.a2a.split(",") if k]
    kinds = sorted({kind for kind, _ in cases})
    options = synth_options(config.chunks)
    texts = {kind: dumps_schedule(optimize(topology, kind, options=options[Collective(kind)]).schedule) for kind in kinds}
    plan = FabricPlan.from_topology(topology, scale=args.scale, nvlink=args.nvlink)
    started = time.strftime("%H:%M:%S", time.gmtime())
    with EmulatedFabric(plan) as built:
        outputs = run_ranks_in_fabric(_rank, built.plan, texts, cases, args.repeats, args.factor, timeout_s=900)
        nic_mbit = built.plan.ranks[0].nic_up_mbit
    rows = []
    for kind, size in cases:
        row: dict = {"started_utc": started, "scale": args.scale, "chunks": args.chunks, "nic_mbit": nic_mbit, "nvlink": args.nvlink,
                     "collective": kind, "bytes_per_rank": size}
        for phase in ("healthy", "degraded"):
            walls = [max(out[(kind, size, phase)][i][0] for out in outputs) for i in range(args.repeats)][1:]
            cpus = [outputs[0][(kind, size, phase)][i][1] for i in range(args.repeats)][1:]
            row[f"{phase}_ms"] = round(statistics.median(walls) * 1e3, 2)
            row[f"{phase}_cpu_ms"] = round(statistics.median(cpus) * 1e3, 2)
        row["healthy_over_degraded_time"] = round(row["healthy_ms"] / row["degraded_ms"], 3)  # = degraded ÷ healthy algbw
        rows.append(row)
        print(row, flush=True)
    write_csv(RESULTS / f"collective_floor{args.tag}.csv", rows)


if __name__ == "__main__":
    main()
