"""Where the provider's added time goes when a session's calls are far apart (issue 16, the 8 MiB AllGather):
the same call through the service and in-process, back to back and after an idle gap, in the same run.

    python benchmarks/provider_gap.py                 # ~40 s quiet; 4 KiB AllReduce and 8 MiB AllGather, gaps 0 / 2 / 30 ms
    python benchmarks/provider_gap.py --blocks 4      # quicker

Why. ``provider.py --single-host`` interleaves every variant, so a variant's threads wait for the others' calls
between two of their own: ~2 ms at 4 KiB, ~30 ms at 8 MiB (seven 4 ms calls). After such a gap the path runs
cold — its caches refilled, its vCPU halted or taken by others — and every stage slows, the pure-CPU ones too.
Here the gap is set directly (a ``time.sleep`` before each call), so the 8 MiB AllGather's added time can be read
against a 4 KiB AllReduce's after the same gap: what grows with the gap is not the buffer's size.

Variants, each on threads of its own (a session each; ``inproc`` a gloo group of its own): ``inproc`` (the
tenant's own world-1 communicator, as ``provider_single.py``), ``provider`` (the shim as shipped), ``sleep``
(every call sleeps for its reply: ``spin_us=0``), ``traced`` (as shipped, wall stamps: the stages). Per block the
variants run in a random order, ``--calls`` calls each after the gap; the figures are medians over blocks of the
per-block medians (``added``: of the per-block difference, with its IQR). Writes
``benchmarks/results/provider_gap.csv``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path

from provider_ranks import KIB, MIB
from provider_single import quartiles
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

CASES = [("all_reduce", 4 * KIB, 0.0), ("all_reduce", 4 * KIB, 0.002), ("all_reduce", 4 * KIB, 0.03),
         ("all_gather", 8 * MIB, 0.0), ("all_gather", 8 * MIB, 0.03)]
VARIANTS = ("inproc", "provider", "sleep", "traced")
STAGES = ("shim", "to_service", "read", "decode", "checks", "reply", "to_tenant")


def tenant(endpoint: str, secret_hex: str, blocks: int, calls: int, results) -> None:
    """The tenant process: every case's blocks; puts (per-block medians, stages, tenant CPU) on ``results``."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from mccl.control.auth import JobSecret
    from mccl.provider.keys import tenant_credential
    from mccl.provider.shim import Shim
    from mccl.runtime.communicator import Communicator
    from mccl.runtime.transport import Transport

    torch.set_num_threads(1)
    local = Communicator(Transport(dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=60)),
                                   backend="gloo"), name="inproc", check=False)
    credential = tenant_credential(JobSecret.from_hex(secret_hex), "bench")
    shims = {"provider": Shim(endpoint, credential), "sleep": Shim(endpoint, credential, spin_us=0.0),
             "traced": Shim(endpoint, credential)}
    comms = {name: shim.join(f"gap-{name}", [0]) for name, shim in shims.items()}
    comms["inproc"] = local
    per_block: dict = {}
    stages: dict = {}
    cpu: dict = {}
    order = list(VARIANTS)
    shuffle = random.Random(16).shuffle
    for op, size, gap in CASES:
        count = size // 4
        buffers = {name: (shim.empty(count), shim.empty(count)) for name, shim in shims.items()}
        buffers["inproc"] = (torch.ones(count), torch.ones(count))
        for output, input in buffers.values():
            output.fill_(1.0)
            input.fill_(1.0)

        for name in VARIANTS:
            for _ in range(5):
                _run(comms[name], op, *buffers[name])
        for _ in range(blocks):
            shuffle(order)
            for name in order:
                walls = []
                for _ in range(calls):
                    time.sleep(gap)
                    traced = shims["traced"] if name == "traced" else None
                    if traced is not None:
                        traced.trace = []
                    thread_cpu, start = time.thread_time_ns(), time.perf_counter_ns()
                    _run(comms[name], op, *buffers[name])
                    total = time.perf_counter_ns() - start
                    cpu.setdefault((name, op, size, gap), []).append((time.thread_time_ns() - thread_cpu) / 1e3)
                    walls.append(total / 1e3)
                    if traced is not None:
                        t = traced.trace[0]
                        traced.trace = None
                        for stage, ns in zip(STAGES, (total - (t.got - t.sent), t.woke - t.sent, t.received - t.woke,
                                                      t.decoded - t.received, t.checked - t.decoded,
                                                      t.replied - t.ran, t.got - t.replied), strict=True):
                            stages.setdefault((op, size, gap, stage), []).append(ns / 1e3)
                per_block.setdefault((name, op, size, gap), []).append(statistics.median(walls))
        for name, shim in shims.items():
            for tensor in buffers[name]:
                shim.free_tensor(tensor)
    notes = {name: (shim._spin.spun, shim._spin.slept, shim._spin.explored) for name, shim in shims.items()
             if shim._spin is not None}
    for shim in shims.values():
        shim.close()
    local.close()
    results.put((per_block, stages, cpu, notes))


def _run(comm, op: str, output, input) -> None:
    if op == "all_gather":
        comm.all_gather_into_tensor(output, input)
    else:
        comm.all_reduce(output)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=10, help="calls of each variant per block")
    args = parser.parse_args()
    if args.blocks < 1 or args.calls < 1:
        parser.error("--blocks and --calls must be at least 1")
    from mccl.control.auth import new_secret
    from mccl.provider.launch import start_services
    from mccl.runtime.launch import free_port

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    secret = new_secret()
    context = mp.get_context("spawn")
    with start_services(1, secret, ["bench"], store_port=free_port()) as services:
        results = context.Queue()
        process = context.Process(target=tenant, args=(services.endpoints[0], secret.hex, args.blocks, args.calls,
                                                       results))
        process.start()
        per_block, stages, cpu, notes = results.get(timeout=1800)
        process.join(timeout=30)
    print(f"1 host; {started}; {args.blocks} blocks × {args.calls} calls; load average before {load_before[0]:.1f}, "
          f"after {os.getloadavg()[0]:.1f}; calls spun / slept / took the way not chosen: {notes}")
    print(f"{'op':<11}{'size':>9}{'gap ms':>7}{'inproc':>8}{'provider':>9}{'added [IQR]':>18}{'sleep':>7}{'ratio':>7}"
          f"{'cpu in':>8}{'cpu prov':>9}  " + "".join(f"{stage:>11}" for stage in STAGES) + "   (µs)")
    rows = []
    for op, size, gap in CASES:
        blocks = {name: per_block[(name, op, size, gap)] for name in VARIANTS}
        differences = [p - i for p, i in zip(blocks["provider"], blocks["inproc"], strict=True)]
        q1, q3 = quartiles(differences)
        row = {"op": op, "size_bytes": size, "gap_ms": gap * 1e3,
               **{f"{name}_us": statistics.median(blocks[name]) for name in VARIANTS},
               "added_us": statistics.median(differences), "added_q1_us": q1, "added_q3_us": q3,
               "sleep_added_us": statistics.median(s - i for s, i in zip(blocks["sleep"], blocks["inproc"],
                                                                         strict=True)),
               "ratio_provider_over_inproc": statistics.median(p / i for p, i in zip(blocks["provider"],
                                                                                    blocks["inproc"], strict=True)),
               "tenant_cpu_inproc_us": statistics.median(cpu[("inproc", op, size, gap)]),
               "tenant_cpu_provider_us": statistics.median(cpu[("provider", op, size, gap)]),
               **{f"stage_{stage}_us": statistics.median(stages[(op, size, gap, stage)]) for stage in STAGES}}
        rows.append(row)
        spread = f"{row['added_us']:.0f} [{q1:.0f}, {q3:.0f}]"
        print(f"{op:<11}{size:>9}{gap * 1e3:>7.0f}{row['inproc_us']:>8.0f}{row['provider_us']:>9.0f}{spread:>18}"
              f"{row['sleep_added_us']:>7.0f}{row['ratio_provider_over_inproc']:>7.2f}"
              f"{row['tenant_cpu_inproc_us']:>8.0f}{row['tenant_cpu_provider_us']:>9.0f}  "
              + "".join(f"{row[f'stage_{stage}_us']:>11.1f}" for stage in STAGES))
    print("cpu = the tenant's calling thread (in-process: the communicator's path, gloo's worker not included); "
          "stages of the traced copy: the service's collective and the tenant's wait are left out")
    write_csv(Path(__file__).parent / "results" / "provider_gap.csv", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
