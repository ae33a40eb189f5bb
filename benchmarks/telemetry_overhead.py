"""Telemetry overhead where the CPU is the bottleneck: gloo on loopback, telemetry on vs off, same run.

    PYTHONPATH=src .venv/bin/python benchmarks/telemetry_overhead.py              # 4 ranks, 9 calls per mode
    PYTHONPATH=src .venv/bin/python benchmarks/telemetry_overhead.py --repeats 15 --ranks 8
    PYTHONPATH=src .venv/bin/python benchmarks/telemetry_overhead.py --driver eager   # the meters alone

The emulated fabric's figures (``benchmarks/netemu_telemetry.py``, ``on_over_off``) are NIC-bound. Here nothing
but the CPU limits a collective, so the eager driver a metered communicator runs costs what it costs against
one gloo alltoallv (AllToAll; an unmetered one-step plan would also take it). The schedules: the loop's
synthesizer (``mccl demo``'s chunk counts) on ``rail_optimized(1, 2, ranks/2)``; AllGather 256 KiB and AllToAll
512 KiB per rank as in the loop. Per call: the slowest rank's wall time and the ranks' CPU time
(``time.process_time``, summed — meaningful on a loaded machine where wall time is not); metered and
unmetered calls alternate, which goes first alternating too. Reported: medians and on ÷ off. Writes
``benchmarks/results/telemetry_overhead<tag>.csv``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.runtime.launch import run_ranks

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("allgather", "alltoall")


def _rank(rank: int, world: int, texts: dict, topology_spec: str, elements: dict, repeats: int,
          driver: str | None = None) -> dict:
    import torch
    import torch.distributed as dist

    from mccl.runtime import MemorySink, TelemetryConfig, executor, init
    from mccl.runtime.plan import build_plan
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    topology = parse_topology(topology_spec)
    out: dict = {}
    for name, text in texts.items():
        schedule = loads_schedule(text)
        comms = {True: init(dist.group.WORLD, None, topology=topology, schedules=[schedule], hot_swap=False,
                            name=f"{name}-on", sink=MemorySink(), telemetry=TelemetryConfig(), driver=driver),
                 False: init(dist.group.WORLD, None, topology=topology, schedules=[schedule], hot_swap=False,
                             name=f"{name}-off", driver=driver)}
        plan = build_plan(schedule, rank)
        drivers = {on: driver or executor.default_driver(comms[on].transport, plan, metered=on) for on in comms}
        source = torch.arange(elements[name], dtype=torch.int32) + rank
        output = torch.empty(elements[name] * (world if name == "allgather" else 1), dtype=torch.int32)
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for index in range(repeats):
            for on in ((True, False) if index % 2 else (False, True)):
                dist.barrier()
                start, cpu = time.perf_counter(), time.process_time()
                if name == "allgather":
                    comms[on].all_gather_into_tensor(output, source)
                else:
                    comms[on].all_to_all_single(output, source)
                times[on].append((time.perf_counter() - start, time.process_time() - cpu))
        for comm in comms.values():
            comm.close()
        out[name] = {"times": times, "drivers": drivers}
    return out


def measure(ranks: int, repeats: int, driver: str | None = None) -> list[dict]:
    from mccl.experiments.netemu.demo import NetemuConfig, _synth_options
    from mccl.schedule import Collective, dumps_schedule
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    config = NetemuConfig()
    spec = f"rail_optimized(1,2,{ranks // 2})"
    topology = parse_topology(spec)
    options = _synth_options(config.chunks)
    texts = {kind: dumps_schedule(optimize(topology, kind, options=options[Collective(kind)]).schedule) for kind in KINDS}
    elements = {"allgather": config.ag_bytes // 4, "alltoall": (config.a2a_bytes // 4 // ranks) * ranks}
    outputs = run_ranks(_rank, ranks, texts, spec, elements, repeats, driver, timeout_s=900)
    rows = []
    for name in KINDS:
        medians = {}
        for on in (True, False):
            calls = range(1, repeats)  # the first call of each is a warm-up
            wall = [max(out[name]["times"][on][i][0] for out in outputs) for i in calls]
            cpu = [sum(out[name]["times"][on][i][1] for out in outputs) for i in calls]
            medians[on] = (statistics.median(wall), statistics.median(cpu))
        rows.append({"ranks": ranks, "collective": name, "driver_on": outputs[0][name]["drivers"][True],
                     "driver_off": outputs[0][name]["drivers"][False],
                     "wall_on_s": round(medians[True][0], 4), "wall_off_s": round(medians[False][0], 4),
                     "wall_on_over_off": round(medians[True][0] / medians[False][0], 3),
                     "cpu_on_s": round(medians[True][1], 4), "cpu_off_s": round(medians[False][1], 4),
                     "cpu_on_over_off": round(medians[True][1] / medians[False][1], 3)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4, help="an even number: two hosts")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tag", default="")
    parser.add_argument("--driver", default=None,
                        help="both communicators' driver (eager: the meters' cost alone, without the driver change)")
    args = parser.parse_args()
    rows = measure(args.ranks, args.repeats, args.driver)
    for row in rows:
        print(row)
    write_csv(RESULTS / f"telemetry_overhead{args.tag}.csv", rows)


if __name__ == "__main__":
    main()
