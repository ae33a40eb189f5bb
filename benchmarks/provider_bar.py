"""Issue 16's bar, measured so that a run can be repeated: the provider service's added time per collective.

    PYTHONPATH=src:benchmarks python benchmarks/provider_bar.py              # 3 runs, ~25 s each at load 5
    PYTHONPATH=src:benchmarks python benchmarks/provider_bar.py --runs 1 --blocks 8   # a quick look

What the bar is measured as. *Per collective*: one synchronous collective call of a tenant, from the call to its
return (the tenant has the result), through its host's service (the shim as shipped) — minus the same call on the
tenant's own in-process world-1 mccl communicator (what ``mccl.init`` gives a rank; ``provider_single.py`` says why
that is like for like; since the tenth session its gloo transport runs world-1 collectives as the copies they are,
:mod:`mccl.runtime.single`, as the service's direct path does). *The gap*: each call follows ``--gap-us`` (default 1000 µs) of the tenant's thread
computing (a busy loop: a training step's compute between two collectives keeps its CPU busy, it does not idle),
the same before either variant's call; ``--gap-kind sleep`` idles instead, as ``provider_gap.py``.

Why it repeats where ``provider.py --single-host`` did not. That benchmark interleaves eight variants, so a
variant's threads wait for seven other calls between two of theirs (~2 ms at 4 KiB, ~30 ms at 8 MiB) and the added
time moved with those gaps (``provider_gap.py``: 112 µs back to back, 395 after 30 ms, same call). Here only the
two compared calls alternate (in a random order per pair), each after the same stated gap; ``--pairs`` pairs per
size per block, the sizes in a new random order every block, many short blocks, the figure the median over blocks of
the per-block difference of medians (and its IQR over blocks), and ``--runs`` runs, each with a fresh service and
tenant, so the spread between runs is printed, not guessed.

The second figure, CPU per call (less load-dependent than wall time): the tenant process's CPU across the call
(every thread: gloo's worker for the in-process call), plus, for the provider, the service process's CPU
(every thread's ``schedstat`` over the size's pairs in a block, divided by its calls) — ``cpu added`` is the
difference; the keep-warm process's CPU per call is shown apart (it ticks by time, not by call).

The same-run A/B (``--ab``): blocks alternate two settings of the service, so both are read under the same load
and the table shows both. ``direct`` (default): the job's collectives run directly in the service's thread
(``mccl.provider.direct``, shipped) against all on gloo (the path before it); ``warm``: keep-warm
(``mccl.provider.keepwarm``) on against off (shipped); ``poll``: the service's thread polls for the next
request after each reply (``ServiceConfig.poll_us``, shipped) against sleeping at once; ``none``: every block as
shipped.

A third call alternates with the two: ``inproc_direct``, the tenant's own process doing what the direct path does
(the copy, or nothing for AllReduce) — the in-process side of the same work, so ``added vs direct`` is the
service's own cost (round trip, checks), where ``added`` is against mccl's in-process call, the bar's baseline
(the same copy behind mccl's Communicator: its sequence, hold and call log).

Writes ``benchmarks/results/provider_bar<tag>.csv`` (``--tag``; one row per run and size, and the runs' summary rows).
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

from provider_ranks import OPS, _buffers, _calls, _run, sizes_option
from provider_single import quartiles
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

SIDES = {"direct": ("direct", "gloo"), "warm": ("warm", "cold"), "poll": ("poll", "sleep"), "none": ("shipped",)}
"""Each ``--ab``'s two sides: blocks alternate between them (the first is the one switched on)."""


def _direct_calls() -> dict:
    """The in-process side of the direct path's work (``mccl.provider.direct``): the copy, or nothing (AllReduce)."""
    return {"all_gather": lambda output, source: output.copy_(source), "all_reduce": lambda tensor: None}


def process_cpu_ns(pid: int) -> int:
    """CPU time of every thread of process ``pid`` so far (ns; ``schedstat``: no tick rounding), 0 once gone."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as handle:
                total += int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # (a thread that ended meanwhile)
    return total


def process_faults(pid: int) -> int:
    """Page faults (minor + major) of process ``pid`` so far, every thread (``/proc/<pid>/stat``), 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[7]) + int(fields[9])


def _children(pid: int) -> list[int]:
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found += [int(child) for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return found


def _gap(gap_ns: int, busy: bool) -> None:
    if not busy:
        time.sleep(gap_ns / 1e9)
        return
    end = time.perf_counter_ns() + gap_ns
    while time.perf_counter_ns() < end:  # the tenant's compute between two collectives
        pass


def tenant(endpoint: str, secret_hex: str, service_pid: int, sizes: list[int], blocks: int, pairs: int,
           gap_ns: int, busy: bool, ab: str, seed: int, results) -> None:
    """The tenant process: ``blocks`` blocks of ``pairs`` (in-process, provider) pairs per size; puts
    (per-block medians, CPU per call, notes) on ``results``."""
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
    shim = Shim(endpoint, tenant_credential(JobSecret.from_hex(secret_hex), "bench"))
    remote = shim.join("bar", [0])
    warmers = [pid for pid in _children(service_pid)]  # the keep-warm process (none when it is off)
    cases = []
    for op in OPS:
        for size in sizes:
            mine = _buffers(op, size, 1, lambda count: torch.ones(count))
            shared = _buffers(op, size, 1, shim.empty)
            for tensor in shared:
                tensor.fill_(1.0)
            variants = {"inproc": (_calls(local), mine), "provider": (_calls(remote), shared),
                        "inproc_direct": (_direct_calls(), mine)}
            for calls, buffers in variants.values():
                for _ in range(5):
                    _run(calls, op, *buffers)
            cases.append((op, size, variants))
    rng = random.Random(seed)
    per_block: dict = {}  # (side, variant, op, size) -> [per-block median wall, s]
    cpu: dict = {}  # (side, variant | "service" | "keepwarm", op, size) -> [per-block CPU per call, ns]
    for index in range(blocks):
        sides = SIDES[ab]
        side = sides[index % len(sides)]
        if ab == "warm":
            shim.keep_warm(side == "warm")
            if side == "cold":
                time.sleep(0.15)  # (past keepwarm.ACTIVE_NS: its threads have stopped ticking)
        elif ab == "direct":
            shim.direct(side == "direct")
        elif ab == "poll":
            shim.poll(side == "poll")
        rng.shuffle(cases)
        for op, size, variants in cases:
            walls: dict = {name: [] for name in variants}
            tenant_cpu: dict = {name: [] for name in variants}
            service_before, warm_before = process_cpu_ns(service_pid), sum(map(process_cpu_ns, warmers))
            faults_before = process_faults(service_pid)
            for _ in range(pairs):
                order = list(variants.items())
                rng.shuffle(order)
                for name, (calls, buffers) in order:
                    _gap(gap_ns, busy)
                    cpu_start, start = time.process_time_ns(), time.perf_counter_ns()
                    _run(calls, op, *buffers)
                    walls[name].append(time.perf_counter_ns() - start)
                    tenant_cpu[name].append(time.process_time_ns() - cpu_start)
            service = (process_cpu_ns(service_pid) - service_before) / pairs
            cpu.setdefault((side, "faults", op, size), []).append((process_faults(service_pid) - faults_before) / pairs)
            warming = (sum(map(process_cpu_ns, warmers)) - warm_before) / pairs
            for name in variants:
                per_block.setdefault((side, name, op, size), []).append(statistics.median(walls[name]) / 1e9)
                cpu.setdefault((side, name, op, size), []).append(statistics.median(tenant_cpu[name]))
            cpu.setdefault((side, "service", op, size), []).append(service)
            cpu.setdefault((side, "keepwarm", op, size), []).append(warming)
    notes = {"spun": (shim._spin.spun, shim._spin.slept, shim._spin.explored) if shim._spin is not None else None,
             "keepwarm": bool(warmers)}
    shim.close()
    local.close()
    results.put((per_block, cpu, notes))


def one_run(sizes: list[int], blocks: int, pairs: int, gap_ns: int, busy: bool, ab: str, seed: int) -> tuple:
    from mccl.control.auth import new_secret
    from mccl.provider.launch import start_services
    from mccl.runtime.launch import free_port

    secret = new_secret()
    context = mp.get_context("spawn")
    with start_services(1, secret, ["bench"], store_port=free_port()) as services:
        results = context.Queue()
        process = context.Process(target=tenant, args=(services.endpoints[0], secret.hex, services.processes[0].pid,
                                                       sizes, blocks, pairs, gap_ns, busy, ab, seed, results))
        process.start()
        found = results.get(timeout=1800)
        process.join(timeout=30)
    return found


def summarize(per_block: dict, cpu: dict, side: str, op: str, size: int) -> dict:
    """One run's figures for one size and side (µs)."""
    inproc, provider = per_block[(side, "inproc", op, size)], per_block[(side, "provider", op, size)]
    differences = [(p - i) * 1e6 for p, i in zip(provider, inproc, strict=True)]
    q1, q3 = quartiles(differences)
    floor = per_block[(side, "inproc_direct", op, size)]
    over_floor = [(p - f) * 1e6 for p, f in zip(provider, floor, strict=True)]
    cpu_in = statistics.median(cpu[(side, "inproc", op, size)]) / 1e3
    cpu_prov = statistics.median(t + s for t, s in zip(cpu[(side, "provider", op, size)],
                                                        cpu[(side, "service", op, size)], strict=True)) / 1e3
    cpu_added = statistics.median(t + s - i for t, s, i in zip(cpu[(side, "provider", op, size)],
                                                                cpu[(side, "service", op, size)],
                                                                cpu[(side, "inproc", op, size)], strict=True)) / 1e3
    return {"inproc_us": statistics.median(inproc) * 1e6, "provider_us": statistics.median(provider) * 1e6,
            "added_us": statistics.median(differences), "added_q1_us": q1, "added_q3_us": q3, "blocks": len(inproc),
            "ratio": statistics.median(p / i for p, i in zip(provider, inproc, strict=True)),
            "inproc_direct_us": statistics.median(floor) * 1e6, "added_vs_direct_us": statistics.median(over_floor),
            "cpu_inproc_us": cpu_in, "cpu_provider_us": cpu_prov, "cpu_added_us": cpu_added,
            "cpu_keepwarm_us": statistics.median(cpu[(side, "keepwarm", op, size)]) / 1e3,
            "service_faults": statistics.median(cpu[(side, "faults", op, size)])}


def _spread(row: dict) -> str:
    return f"{row['added_us']:.0f} [{row['added_q1_us']:.0f}, {row['added_q3_us']:.0f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs, each with a fresh service and tenant")
    parser.add_argument("--blocks", type=int, default=16, help="blocks per run (alternately warm and cold)")
    parser.add_argument("--pairs", type=int, default=8, help="(in-process, provider) pairs per size per block")
    parser.add_argument("--gap-us", type=float, default=1000.0, help="the tenant's gap before every call (µs)")
    parser.add_argument("--gap-kind", choices=("compute", "sleep"), default="compute",
                        help="compute: the tenant's thread busy through the gap (a training step); sleep: idle")
    parser.add_argument("--ab", choices=tuple(SIDES), default="direct",
                        help="the same-run A/B, blocks alternating: direct = the direct path against all on gloo "
                             "(default); warm = keep-warm on against off; poll = the service's thread polling for "
                             "the next request against sleeping at once; none = every block as shipped")
    parser.add_argument("--sizes", default=None, help="comma-separated sizes in bytes (default 4 KiB .. 8 MiB)")
    parser.add_argument("--tag", default="", help="written to results/provider_bar<tag>.csv (a run without one "
                                                   "overwrites the last untagged run's rows)")
    args = parser.parse_args()
    sizes = sizes_option(parser, args.sizes)
    sides = SIDES[args.ab]
    if args.runs < 1 or args.pairs < 1 or args.blocks < len(sides) or args.gap_us < 0:
        parser.error("--runs and --pairs must be at least 1, --blocks at least 2 (1 with --ab none), --gap-us ≥ 0")
    rows = []
    for run in range(args.runs):
        started, load_before, clock = time.strftime("%H:%M:%S UTC", time.gmtime()), os.getloadavg()[0], time.time()
        per_block, cpu, notes = one_run(sizes, args.blocks, args.pairs, int(args.gap_us * 1e3),
                                        args.gap_kind == "compute", args.ab, seed=run)
        print(f"run {run + 1}/{args.runs}: {started}, {time.time() - clock:.0f} s, load average {load_before:.1f} → "
              f"{os.getloadavg()[0]:.1f}; {args.blocks} blocks × {args.pairs} pairs per size, gap {args.gap_us:g} µs "
              f"{args.gap_kind}; calls spun / slept by choice / explored: {notes['spun']}; keep-warm process: "
              f"{'found' if notes['keepwarm'] else 'none'}", flush=True)
        for op in OPS:
            for size in sizes:
                for side in sides:
                    rows.append({"run": run + 1, "started": started, "load_before": load_before, "op": op,
                                 "size_bytes": size, "side": side, "gap_us": args.gap_us, "gap_kind": args.gap_kind,
                                 **summarize(per_block, cpu, side, op, size)})
    print("\nadded = provider − in-process per collective (µs): per run, the median over blocks of the per-block "
          "difference of medians [IQR over blocks]; over runs: the median of the runs' medians (min..max); cpu = "
          "CPU per call, tenant + service (µs, median over blocks and runs); keep-warm: its process's CPU per call; "
          "ratio: provider ÷ in-process, per block, median; vs direct: provider − inproc_direct, the same work in the "
          "tenant's own process (median of the runs' medians); faults: the service process's page faults per call")
    header = f"{'op':<11}{'size':>9}{'side':>6}" + "".join(f"{f'run {run + 1}':>19}" for run in range(args.runs))
    print(header + f"{'over runs':>20}{'inproc':>8}{'ratio':>7}{'vs direct':>10}{'cpu in':>8}{'cpu prov':>9}"
                   f"{'cpu add':>8}{'kw cpu':>7}{'faults':>7}")
    summary = []
    for op in OPS:
        for size in sizes:
            for side in sides:
                mine = [row for row in rows if (row["op"], row["size_bytes"], row["side"]) == (op, size, side)]
                medians = [row["added_us"] for row in mine]
                over = statistics.median(medians)
                line = f"{op:<11}{size:>9}{side:>6}" + "".join(f"{_spread(row):>19}" for row in mine)
                figures = {key: statistics.median(row[key] for row in mine)
                           for key in ("inproc_us", "ratio", "inproc_direct_us", "added_vs_direct_us", "cpu_inproc_us",
                                       "cpu_provider_us", "cpu_added_us", "cpu_keepwarm_us", "service_faults")}
                print(line + f"{f'{over:.0f} ({min(medians):.0f}..{max(medians):.0f})':>20}{figures['inproc_us']:>8.0f}"
                      f"{figures['ratio']:>7.2f}{figures['added_vs_direct_us']:>10.0f}"
                      f"{figures['cpu_inproc_us']:>8.0f}{figures['cpu_provider_us']:>9.0f}{figures['cpu_added_us']:>8.0f}"
                      f"{figures['cpu_keepwarm_us']:>7.0f}{figures['service_faults']:>7.0f}")
                summary.append({"run": "all", "op": op, "size_bytes": size, "side": side, "gap_us": args.gap_us,
                                "gap_kind": args.gap_kind, "added_us": over, "added_min_us": min(medians),
                                "added_max_us": max(medians), **figures})
    write_csv(Path(__file__).parent / "results" / f"provider_bar{args.tag}.csv", rows + summary,
              columns=list(rows[0]) + ["added_min_us", "added_max_us"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
