"""Benchmark of the runtime executor on gloo (loopback): nccl-tests-style sweep, telemetry, hot swap.

    .venv/bin/python benchmarks/runtime.py            # 64 KiB .. 64 MiB, 4 and 8 ranks
    .venv/bin/python benchmarks/runtime.py --quick    # 64 KiB, 1 MiB, 16 MiB; fewer repetitions

For each world size one set of processes measures, interleaved repetition by
repetition (so that load from other jobs hits every variant alike): torch's native
gloo ``all_gather_into_tensor`` / ``all_to_all_single``, mccl through the direct API,
mccl through the registered ``"mccl"`` backend (``dist.*`` on an mccl group),
mccl with telemetry on, and a reference written in a few lines of plain Python over
``dist.isend``/``dist.irecv`` (AllGather: the ring the issue quotes, "2.5× native gloo
at 16 MiB"; AllToAll: every send and receive posted at once). A repetition's time is the slowest rank's; figures are
medians; ratios are native time / mccl time from the same run. Sizes are nccl-tests'
S: AllGather output bytes per rank, AllToAll send-buffer bytes per rank; the
"per rank" column is S / ranks (an AllGather's input, an AllToAll's block per peer).

Then: the latency of a tiny collective (per-collective overhead), telemetry accuracy
against a throttled peer (it accepts one message per interval: a known rate), and
hot-swap timings (OOB exchange = the pause of the issuing thread, staging, total).
Writes ``benchmarks/results/runtime.csv`` and prints tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.runtime.launch import run_ranks

KIB, MIB = 1 << 10, 1 << 20
FULL_SIZES = [64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
QUICK_SIZES = [64 * KIB, MIB, 16 * MIB]
VARIANTS = ("native", "mccl_api", "mccl_backend", "mccl_telemetry", "p2p_reference")


def _reps(size: int, quick: bool) -> int:
    base = 80 if size <= MIB else (30 if size <= 16 * MIB else 10)  # sub-ms collectives need many repetitions
    return max(3, base // 2) if quick else base


def _bench_rank(rank: int, n: int, sizes: list[int], quick: bool) -> dict:
    import torch
    import torch.distributed as dist

    import mccl
    import mccl.runtime.backend as mb
    from mccl.runtime import MemorySink, TelemetryConfig
    from mccl.synth.direct import direct_alltoall
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    warnings.filterwarnings("ignore")
    topology = single_switch(n, 100)
    # AllGather: a ring, one chunk per block (on 2 shared cores 2 chunks measured no better at 4 ranks
    # and worse at 8: pipelining needs spare CPU); AllToAll: direct (the gloo exchange driver)
    schedules = [naive_ring(topology, "allgather"), direct_alltoall(topology)]
    api = mccl.init(topology=topology, schedules=schedules, hot_swap=False)
    sink = MemorySink()
    telemetry = mccl.init(topology=topology, schedules=schedules, hot_swap=False, sink=sink,
                          telemetry=TelemetryConfig(threshold_inter=1, threshold_intra=1))
    mb.register()
    group = dist.new_group(list(range(n)), backend="mccl")
    mb.communicator(group).configure(topology=topology, schedules=schedules)
    world = dist.group.WORLD

    def timed(fn) -> float:
        dist.barrier()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    rows = []
    for collective in ("allgather", "alltoall"):
        for size in sizes:
            calls = _calls(collective, size // 4 // n, n, world, api, group, telemetry)
            for fn in calls.values():  # warm-up
                fn()
            times = {variant: [] for variant in VARIANTS}
            for rep in range(_reps(size, quick)):
                order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]  # alternate: no variant always runs first
                for variant in order:
                    times[variant].append(timed(calls[variant]))
            rows.append({"collective": collective, "size": size, "times": times})

    # per-collective overhead: a 16-element (64 B output) AllGather, 200 times
    tiny_x, tiny_out = torch.ones(16 // n or 1), torch.empty((16 // n or 1) * n)
    tiny = {}
    for variant, fn in (("native", lambda: dist.all_gather_into_tensor(tiny_out, tiny_x, group=world)),
                        ("mccl_api", lambda: api.all_gather_into_tensor(tiny_out, tiny_x)),
                        ("mccl_backend", lambda: dist.all_gather_into_tensor(tiny_out, tiny_x, group=group))):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(200):
            fn()
        tiny[variant] = (time.perf_counter() - start) / 200

    swaps = _swap_timings(rank, n, topology, 6 if quick else 12)
    telemetry.flush_telemetry()
    dropped = telemetry.telemetry_dropped
    api.close()
    telemetry.close()
    return {"rows": rows, "tiny": tiny, "swaps": swaps, "samples": len(sink.samples), "dropped": dropped}


def _calls(collective, per_rank, n, world, api, group, telemetry):
    """The four variants of one collective and size, as argument-free callables."""
    from functools import partial

    import torch
    import torch.distributed as dist

    import mccl

    if collective == "allgather":
        x, out = torch.ones(per_rank), torch.empty(per_rank * n)
        return {"native": partial(dist.all_gather_into_tensor, out, x, group=world),
                "mccl_api": partial(mccl.all_gather_into_tensor, out, x, group=api),
                "mccl_backend": partial(dist.all_gather_into_tensor, out, x, group=group),
                "mccl_telemetry": partial(telemetry.all_gather_into_tensor, out, x),
                "p2p_reference": partial(_plain_ring_all_gather, out, x)}
    x, out = torch.ones(per_rank * n), torch.empty(per_rank * n)
    return {"native": partial(dist.all_to_all_single, out, x, group=world),
            "mccl_api": partial(mccl.all_to_all_single, out, x, group=api),
            "mccl_backend": partial(dist.all_to_all_single, out, x, group=group),
            "mccl_telemetry": partial(telemetry.all_to_all_single, out, x),
            "p2p_reference": partial(_plain_all_to_all, out, x)}


def _plain_ring_all_gather(out, x) -> None:
    """The reference: a textbook ring in plain Python point-to-point calls (one block per step)."""
    import torch.distributed as dist

    rank, n, per = dist.get_rank(), dist.get_world_size(), x.numel()
    out[rank * per:(rank + 1) * per].copy_(x)
    for step in range(n - 1):
        send_block, recv_block = (rank - step) % n, (rank - step - 1) % n
        receive = dist.irecv(out[recv_block * per:(recv_block + 1) * per], (rank - 1) % n, tag=step)
        send = dist.isend(out[send_block * per:(send_block + 1) * per], (rank + 1) % n, tag=step)
        receive.wait()
        send.wait()


def _plain_all_to_all(out, x) -> None:
    """The reference: every block's send and receive posted at once, plain Python point-to-point calls."""
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    per = x.numel() // n
    out[rank * per:(rank + 1) * per].copy_(x[rank * per:(rank + 1) * per])
    works = [dist.irecv(out[p * per:(p + 1) * per], p, tag=1) for p in ((rank - d) % n for d in range(1, n))]
    works += [dist.isend(x[p * per:(p + 1) * per], p, tag=1) for p in ((rank + d) % n for d in range(1, n))]
    for work in works:
        work.wait()


def _swap_timings(rank, n, topology, count):
    import torch

    import mccl
    from mccl.synth.ring import naive_ring

    comm = mccl.init(topology=topology, schedules=[naive_ring(topology, "allgather")])
    x, out = torch.ones(1024), torch.empty(1024 * n)
    for version in range(1, count + 1):
        comm.stage(naive_ring(topology, "allgather", chunks=1 + version % 3).with_meta(version=version))
        for _ in range(25):  # collectives keep flowing during the swap (same count on every rank)
            comm.all_gather_into_tensor(out, x)
        deadline = time.monotonic() + 30
        while len(comm.swaps) < version and time.monotonic() < deadline:
            time.sleep(0.001)
    records = list(comm.swaps)
    comm.close()
    return [(r.oob_s, r.stage_s, r.ready_s, r.total_s) for r in records]


def _accuracy_rank(rank: int, n: int, message: int, interval_s: float, count: int) -> dict:
    """Rank 0 sends ``count`` messages at once to rank 1, which accepts one per interval."""
    import torch
    import torch.distributed as dist

    from mccl.runtime import MemorySink
    from mccl.runtime.telemetry import Meters, TelemetryBuffer, TelemetryConfig

    config = TelemetryConfig(threshold_inter=2)
    sink = MemorySink()
    buffer = TelemetryBuffer(sink, config)
    meters = Meters("accuracy", rank, [False] * n, buffer, config)
    world = dist.group.WORLD
    tensors = [torch.ones(message // 4) for _ in range(count)]
    results = []
    for _ in range(3):
        dist.barrier()
        if rank == 0:
            works = []
            for tensor in tensors:
                meters.posted(1, message)
                works.append(world.send([tensor], 1, 7))
            for work in works:
                work.wait()
                meters.completed(1, message)
        elif rank == 1:
            start = time.perf_counter()
            for i, tensor in enumerate(tensors):
                delay = start + (i + 1) * interval_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                world.recv([tensor], 0, 7).wait()
        dist.barrier()
        buffer.flush()
        if rank == 0:
            results.append(sink.samples[-1].bytes / sink.samples[-1].seconds)
    buffer.close()
    return {"measured_Bps": results, "known_Bps": message / interval_s}


def _meter_cost_s(pairs: int = 200_000) -> float:
    """CPU cost of one posted()+completed() pair of the telemetry meters, in seconds (no processes)."""
    from mccl.runtime import MemorySink
    from mccl.runtime.telemetry import Meters, TelemetryBuffer, TelemetryConfig

    config = TelemetryConfig(threshold_inter=1, capacity=1 << 30)
    buffer = TelemetryBuffer(MemorySink(), config)
    meters = Meters("cost", 0, [False, False], buffer, config)
    start = time.perf_counter()
    for _ in range(pairs):
        meters.posted(1, 4096)
        meters.completed(1, 4096)
    elapsed = (time.perf_counter() - start) / pairs
    buffer.close()
    return elapsed


def _python_work_us(n: int = 8, calls: int = 2000) -> dict[str, float]:
    """The executor's Python work per call before it issues anything (buffers + regions), in µs, in-process."""
    import torch

    from mccl.runtime import executor
    from mccl.runtime.plan import build_plan
    from mccl.synth.direct import direct_alltoall
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    topology = single_switch(n, 100)
    result = {}
    for name, schedule in (("allgather ring", naive_ring(topology, "allgather")),
                           ("alltoall direct", direct_alltoall(topology))):
        plan = build_plan(schedule, 3)
        cache: dict = {}
        per_rank = 4096
        inp = torch.ones(per_rank * (n if name.startswith("alltoall") else 1))
        out = torch.empty(per_rank * n)
        start = time.perf_counter()
        for _ in range(calls):
            if name.startswith("alltoall"):
                buffers = executor.all_to_all_buffers(plan, out, inp, None, None, cache=cache)
            else:
                buffers = executor.all_gather_buffers(plan, out, inp)
            executor.regions(plan, buffers, cache)
        result[name] = (time.perf_counter() - start) / calls * 1e6
    return result


def _median_of_max(per_rank_times: list[list[float]]) -> float:
    return statistics.median(max(values) for values in zip(*per_rank_times, strict=True))


def _plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({row["ranks"] for row in table})
    figure, axes = plt.subplots(len(ranks), 2, figsize=(10, 3.2 * len(ranks)), squeeze=False)
    for i, n in enumerate(ranks):
        for j, collective in enumerate(("allgather", "alltoall")):
            rows = [row for row in table if row["ranks"] == n and row["collective"] == collective]
            sizes = [row["size_bytes"] for row in rows]
            for variant in VARIANTS:
                algbw = [row["size_bytes"] / row[f"{variant}_ms"] / 1e6 for row in rows]
                axes[i][j].plot(sizes, algbw, marker="o", label=variant)
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_title(f"{collective}, {n} ranks (gloo loopback)")
            axes[i][j].set_xlabel("size S (bytes)")
            axes[i][j].set_ylabel("algbw (GB/s)")
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 sizes, fewer repetitions")
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--sizes", help="comma-separated sizes S with K or M suffix, e.g. 1M,16M,64M "
                        "(default: 64K..64M, or 64K,1M,16M with --quick)")
    parser.add_argument("--csv", type=Path, default=Path(__file__).parent / "results" / "runtime.csv")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.sizes:
        sizes = [int(text[:-1]) * {"K": KIB, "M": MIB}[text[-1].upper()] for text in args.sizes.split(",")]
    table = []
    for n in args.ranks:
        results = run_ranks(_bench_rank, n, sizes, args.quick, timeout_s=1500)
        print(f"\n== {n} ranks (gloo, loopback; medians of the slowest rank per repetition) ==")
        print(f"{'collective':10s} {'size S':>9s} {'per rank':>9s} {'native ms':>10s} {'api ms':>9s} {'backend ms':>10s} "
              f"{'telem ms':>9s} {'p2p ref ms':>10s} {'api algbw GB/s':>14s} {'api/native':>10s} {'backend/nat':>11s} "
              f"{'ref/native':>10s} {'telem ovh':>9s}")
        for index, row in enumerate(results[0]["rows"]):
            med = {v: _median_of_max([r["rows"][index]["times"][v] for r in results]) for v in VARIANTS}
            size = row["size"]
            ratio_api = med["native"] / med["mccl_api"]
            ratio_backend = med["native"] / med["mccl_backend"]
            ratio_reference = med["native"] / med["p2p_reference"]
            overhead = med["mccl_telemetry"] / med["mccl_api"] - 1
            print(f"{row['collective']:10s} {size // KIB:>6d}KiB {size // n // KIB:>6d}KiB {med['native'] * 1e3:10.2f} "
                  f"{med['mccl_api'] * 1e3:9.2f} {med['mccl_backend'] * 1e3:10.2f} {med['mccl_telemetry'] * 1e3:9.2f} "
                  f"{med['p2p_reference'] * 1e3:10.2f} {size / med['mccl_api'] / 1e9:14.3f} "
                  f"{ratio_api:10.2f} {ratio_backend:11.2f} {ratio_reference:10.2f} {overhead * 100:8.1f}%")
            table.append({"ranks": n, "collective": row["collective"], "size_bytes": size,
                          **{f"{v}_ms": round(med[v] * 1e3, 4) for v in VARIANTS},
                          "api_vs_native": round(ratio_api, 3), "backend_vs_native": round(ratio_backend, 3),
                          "reference_vs_native": round(ratio_reference, 3),
                          "telemetry_overhead": round(overhead, 4)})
        tiny = {v: statistics.median(r["tiny"][v] for r in results) for v in results[0]["tiny"]}
        print(f"tiny AllGather (64 B): native {tiny['native'] * 1e6:.0f} µs, mccl api {tiny['mccl_api'] * 1e6:.0f} µs, "
              f"backend {tiny['mccl_backend'] * 1e6:.0f} µs -> mccl adds {(tiny['mccl_api'] - tiny['native']) * 1e6:.0f} µs"
              f" (api), backend dispatch {(tiny['mccl_backend'] - tiny['mccl_api']) * 1e6:.0f} µs")
        swaps = [s for r in results for s in r["swaps"]]
        oob = statistics.median(s[0] for s in swaps)
        stage = statistics.median(s[1] for s in swaps)
        own = statistics.median(s[0] + s[1] for s in swaps)
        total = statistics.median(s[3] for s in swaps)
        print(f"hot swap ({len(swaps)} rank-swaps): OOB exchange p50 {oob * 1e3:.2f} ms (max {max(s[0] for s in swaps) * 1e3:.2f}),"
              f" staging p50 {stage * 1e3:.2f} ms, staging+OOB p50 {own * 1e3:.2f} ms, total incl. waiting for all "
              f"ranks p50 {total * 1e3:.2f} ms")
        print(f"telemetry samples {sum(r['samples'] for r in results)}, dropped {sum(r['dropped'] for r in results)}")
    work = _python_work_us()
    print("\nexecutor Python work per call before issuing (8 ranks, in-process): "
          + ", ".join(f"{name} {value:.0f} µs" for name, value in work.items()))
    cost = _meter_cost_s()
    print(f"\ntelemetry CPU cost: {cost * 1e6:.2f} µs per transfer (window bookkeeping + sample); a 16 MiB ring "
          f"AllGather at 8 ranks does 7 sends per rank -> {7 * cost * 1e6:.1f} µs per collective")
    accuracy = run_ranks(_accuracy_rank, 2, 4 * MIB, 0.02, 40, timeout_s=300)[0]
    errors = [abs(m / accuracy["known_Bps"] - 1) for m in accuracy["measured_Bps"]]
    print(f"\ntelemetry accuracy vs a throttled peer ({accuracy['known_Bps'] / 1e6:.0f} MB/s known): "
          f"measured {[round(m / 1e6, 1) for m in accuracy['measured_Bps']]} MB/s, error max {max(errors) * 100:.2f}%")
    write_csv(args.csv, table)
    _plot(table, args.csv.with_suffix(".png"))
    print(f"wrote {args.csv} and {args.csv.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
