"""Benchmark of the provider service: time per collective through the service against in-process mccl.

    .venv/bin/python benchmarks/provider.py              # 2 hosts; 4 KiB .. 8 MiB; AllGather and AllReduce
    .venv/bin/python benchmarks/provider.py --quick      # fewer repetitions
    .venv/bin/python benchmarks/provider.py --single-host --quick   # one host, every variant interleaved, stages
    .venv/bin/python benchmarks/provider.py --interleaved --quick   # 2 hosts, the three variants interleaved, stages

MCCS §5 reports 50–80 µs added per collective (63 % lower algbw at 512 KB AllGather, 9.7 % at 8 MB);
issue 16's bar is ≤ 100 µs added on this machine. Both sides run the same collective on the same
kind of mccl communicator (torch's gloo collectives under mccl's Communicator, loopback, one
process per host):

* ``inproc``: the rank's own process holds the communicator (``check=False``, what ``mccl.init``
  gives) — the tenant-linked library of MCCS's NCCL baseline;
* ``inproc_check``: the same with the pre-flight agreement (``check=True``), which the service always
  runs (:mod:`mccl.provider.jobs` says why);
* ``provider``: a tenant process per host calls the shim; its host's service process runs the
  collective on buffers in shared memory.

``--single-host`` (the bar's command, issue 16: ≤ 100 µs added vs ``inproc``; ~40 s on a quiet machine): one
tenant process alternates, in a new random order every repetition, its own world-1 communicator on private
and on the shared-memory buffers, the same call through its service as shipped (each request spins for its reply
or sleeps, whichever its recent calls measured cheaper), with a fixed spin, with the service thread following the
tenant's CPU, and always sleeping, each on threads of its own, in blocks (``--blocks``, ``--calls``); the figures
are the median over blocks of the per-block difference and its interquartile range, the tenant's CPU per call,
and the stages of two traced copies (wall; per-thread CPU). ``provider_single.py`` says what each variant is and
why; ``--warm-ab`` alternates blocks with and without the service keeping its CPUs warm
(:mod:`mccl.provider.keepwarm`) and prints both; ``--gate-open`` lets every call spin whatever the load;
``--floors`` adds the agreement, the session socket and the bare round trips.

The default (several hosts) and ``--interleaved`` modes:
Added = provider − inproc_check (the service's own cost: the round trip, the reference checks) and
provider − inproc (everything a tenant pays, the agreement included). Each repetition is timed on
every rank after a barrier and the slowest rank's time is kept; figures are medians over
repetitions; the phases alternate (``--rounds``) so that load from other jobs hits both alike. The
service processes' CPU time per collective comes from /proc. Writes
``benchmarks/results/provider.csv``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

from provider_ranks import CPU_STAGES, OPS, SIZES, STAGES, _inproc_rank, _pair_tenant, _tenant, sizes_option  # noqa: E402
from provider_single import BASELINES, OFF, PROVIDERS, added, ratio  # noqa: E402
from provider_single import tenant as single_tenant  # noqa: E402
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.runtime.launch import free_port, run_ranks


def _print_pair(n: int, sizes: list[int], quick: bool) -> int:
    from mccl.control.auth import new_secret
    from mccl.provider.launch import start_services

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    secret = new_secret()
    context = mp.get_context("spawn")
    with start_services(n, secret, ["bench"], store_port=free_port()) as services:
        results, port = context.Queue(), free_port()
        tenants = [context.Process(target=_pair_tenant, args=(host, n, services.endpoints[host], secret.hex, port,
                                                              sizes, quick, results)) for host in range(n)]
        for tenant in tenants:
            tenant.start()
        found = {host: (times, stages) for host, times, stages in (results.get(timeout=1800) for _ in tenants)}
        for tenant in tenants:
            tenant.join(timeout=30)
    per_rank = [found[host][0] for host in range(n)]
    print(f"{n} hosts, interleaved (in-process gloo job of the tenants, the same job in the services); {started}; "
          f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} (2 cores shared)")
    print(f"{'op':<11}{'size':>9}{'inproc':>8}{'+check':>8}{'provider':>10}{'added':>7}{'vs +check':>10}   (µs, "
          "medians of the slowest rank per repetition)")
    rows = []
    for op in OPS:
        for size in sizes:
            inproc, checked, provider = (statistics.median(_slowest(per_rank, (variant, op, size))) * 1e6
                                         for variant in ("inproc", "inproc_check", "provider"))
            row = {"op": op, "size_bytes": size, "inproc_us": inproc, "inproc_check_us": checked,
                   "provider_us": provider, "added_vs_inproc_us": provider - inproc,
                   "added_vs_inproc_check_us": provider - checked, "reps": len(per_rank[0][("provider", op, size)])}
            row.update({f"host0_stage_{stage}_us": statistics.median(found[0][1][(op, size, stage)])
                        for stage in STAGES})
            rows.append(row)
            print(f"{op:<11}{size:>9}{inproc:>8.0f}{checked:>8.0f}{provider:>10.0f}{provider - inproc:>7.0f}"
                  f"{provider - checked:>10.0f}")
    print("\nhost 0's fast-path stages, medians (µs; 'collective' includes the cross-host agreement): "
          + ", ".join(STAGES))
    for row in rows:
        print(f"{row['op']:<11}{row['size_bytes']:>9}" + "".join(f"{row[f'host0_stage_{stage}_us']:>11.1f}"
                                                                 for stage in STAGES))
    write_csv(Path(__file__).parent / "results" / "provider_two_host.csv", rows)
    return 0


def _interleaved(sizes: list[int], blocks: int, scale: float, floors: bool, gate_open: bool = False,
                 ab: str | None = None) -> tuple:
    from mccl.control.auth import new_secret
    from mccl.provider.launch import start_services

    secret = new_secret()
    context = mp.get_context("spawn")
    with start_services(1, secret, ["bench"], store_port=free_port()) as services:
        results = context.Queue()
        tenant = context.Process(target=single_tenant, args=(services.endpoints[0], secret.hex, sizes, blocks, scale,
                                                             floors, results, gate_open, ab))
        tenant.start()
        found = results.get(timeout=1800)
        tenant.join(timeout=30)
    return found


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _provider_round(n: int, sizes: list[int], quick: bool) -> tuple[list[dict], float, int]:
    from mccl.control.auth import new_secret
    from mccl.provider.launch import start_services

    secret = new_secret()
    context = mp.get_context("spawn")
    with start_services(n, secret, ["bench"], store_port=free_port()) as services:
        cpu_before = sum(_cpu_seconds(process.pid) for process in services.processes)
        results = context.Queue()
        tenants = [context.Process(target=_tenant, args=(host, n, services.endpoints[host], secret.hex, sizes, quick,
                                                         results)) for host in range(n)]
        for tenant in tenants:
            tenant.start()
        by_host = dict(results.get(timeout=1800) for _ in tenants)
        for tenant in tenants:
            tenant.join(timeout=30)
        cpu = sum(_cpu_seconds(process.pid) for process in services.processes) - cpu_before
    calls = sum(len(samples) + 5 for samples in by_host[0].values()) * 2  # each timed call has its barrier
    return [by_host[host] for host in range(n)], cpu, calls


def _slowest(per_rank: list[dict], key) -> list[float]:
    return [max(values) for values in zip(*(times[key] for times in per_rank), strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the in-process and provider phases")
    parser.add_argument("--single-host", action="store_true",
                        help="only the one-host measurement: the tenant alternates in-process and provider calls "
                             "repetition by repetition (the added cost under the same load; see _interleaved_tenant)")
    parser.add_argument("--interleaved", action="store_true",
                        help="several hosts, the three variants interleaved repetition by repetition in the same "
                             "tenant processes (see _pair_tenant); the stage breakdown of host 0")
    parser.add_argument("--blocks", type=int, default=None,
                        help="--single-host: blocks of repetitions (default 10, --quick 3); the spread is over blocks")
    parser.add_argument("--calls", type=float, default=None,
                        help="--single-host: repetitions per block as a multiple of the default (100 calls up to "
                             "64 KiB, 50 at 512 KiB, 10 at 8 MiB; --quick 0.5)")
    parser.add_argument("--gate-open", action="store_true",
                        help="--single-host: the reply wait's gate open whatever the load (every call may spin), as "
                             "on an idle machine: how the spin/sleep choice fares where spinning costs")
    parser.add_argument("--warm-ab", action="store_true",
                        help="--single-host: every other block no session keeps the service's CPUs warm "
                             "(mccl.provider.keepwarm); prints both sides (shipped: off since the eighth session, so "
                             "the shipped figures are the cold blocks')")
    parser.add_argument("--direct-ab", action="store_true",
                        help="--single-host: every other block the sessions' one-host jobs run every collective on "
                             "gloo (the path before mccl.provider.direct); prints both sides (shipped: direct)")
    parser.add_argument("--sizes", default=None,
                        help="--single-host: comma-separated sizes in bytes (default 4 KiB, 64 KiB, 512 KiB, 8 MiB)")
    parser.add_argument("--floors", action="store_true",
                        help="--single-host: also the agreement, the session socket and the bare round trips")
    args = parser.parse_args()
    blocks = args.blocks if args.blocks is not None else (3 if args.quick else 10)
    scale = args.calls if args.calls is not None else (0.5 if args.quick else 1.0)
    if blocks < 1 or scale <= 0:
        parser.error("--blocks must be at least 1 and --calls above 0")
    sizes = sizes_option(parser, args.sizes)
    only_single = [flag for flag, given in (("--blocks", args.blocks is not None), ("--calls", args.calls is not None),
                                            ("--gate-open", args.gate_open), ("--warm-ab", args.warm_ab),
                                            ("--direct-ab", args.direct_ab), ("--sizes", args.sizes is not None),
                                            ("--floors", args.floors)) if given]
    if only_single and not args.single_host:  # they would be ignored: a multi-host run nobody asked for
        parser.error(f"{', '.join(only_single)} only with --single-host")
    if args.single_host:
        if (args.warm_ab or args.direct_ab) and blocks < 2:
            parser.error("--warm-ab and --direct-ab need at least 2 blocks")
        if args.warm_ab and args.direct_ab:
            parser.error("one A/B at a time: --warm-ab or --direct-ab")
        ab = "warm" if args.warm_ab else "direct" if args.direct_ab else None
        return _print_single_host(sizes, blocks, scale, args.floors, args.gate_open, ab)
    if args.interleaved:
        return _print_pair(args.hosts, SIZES, args.quick)
    sizes = SIZES
    samples: dict = {}
    service_cpu, service_calls = 0.0, 0
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}: in-process", file=sys.stderr, flush=True)
        for variant, check in (("inproc", False), ("inproc_check", True)):
            per_rank = run_ranks(_inproc_rank, args.hosts, sizes, args.quick, check, timeout_s=1800)
            for key in per_rank[0]:
                samples.setdefault((variant, *key), []).extend(_slowest(per_rank, key))
        print(f"round {round_index + 1}/{args.rounds}: provider", file=sys.stderr, flush=True)
        per_rank, cpu, calls = _provider_round(args.hosts, sizes, args.quick)
        service_cpu, service_calls = service_cpu + cpu, service_calls + calls
        for key in per_rank[0]:
            samples.setdefault(("provider", *key), []).extend(_slowest(per_rank, key))
    rows = []
    print(f"{args.hosts} hosts, gloo on loopback; {started}; load average before {load_before[0]:.1f}, "
          f"after {os.getloadavg()[0]:.1f} (2 cores shared)")
    print(f"{'op':<11}{'size':>9}{'inproc us':>11}{'+check us':>11}{'provider us':>13}{'added us':>10}"
          f"{'added vs inproc':>17}{'algbw ratio':>13}")
    for op in OPS:
        for size in sizes:
            inproc, checked, provider = (statistics.median(samples[(variant, op, size)])
                                         for variant in ("inproc", "inproc_check", "provider"))
            added, added_all = provider - checked, provider - inproc
            rows.append({"op": op, "size_bytes": size, "inproc_us": inproc * 1e6, "inproc_check_us": checked * 1e6,
                         "provider_us": provider * 1e6, "added_us": added * 1e6, "added_vs_inproc_us": added_all * 1e6,
                         "algbw_provider_over_inproc": inproc / provider, "reps": len(samples[("provider", op, size)])})
            print(f"{op:<11}{size:>9}{inproc * 1e6:>11.0f}{checked * 1e6:>11.0f}{provider * 1e6:>13.0f}"
                  f"{added * 1e6:>10.0f}{added_all * 1e6:>17.0f}{inproc / provider:>13.2f}")
    print(f"service CPU per collective (both services, barrier calls included): "
          f"{service_cpu / max(service_calls, 1) * 1e6:.0f} us over {service_calls} calls")
    write_csv(Path(__file__).parent / "results" / "provider.csv", rows)
    return 0


def _print_single_host(sizes: list[int], blocks: int, scale: float, floors: bool, gate_open: bool = False,
                       ab: str | None = None) -> int:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    clock = time.perf_counter()
    times, per_block, stages, notes = _interleaved(sizes, blocks, scale, floors, gate_open, ab)
    print(f"1 host, tenant and service processes, every variant interleaved; {started}; {blocks} blocks; load "
          f"average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} ({notes['cpus']} cores); "
          f"{time.perf_counter() - clock:.0f} s; {'the gate held open (every call may spin); ' if gate_open else ''}calls that spun / slept by choice / took the way not chosen: {notes['spun']}; calls the "
          f"service's thread followed: {notes['followed']}")
    print("added = provider - inproc: median over blocks of the per-block medians' difference [IQR over blocks]; "
          "ratio = the median per-block provider / inproc; cpu = the tenant process's CPU per call (inproc: gloo's "
          "thread included; provider: the service's CPU is in the stages below)")
    print(f"{'op':<11}{'size':>9}{'reps':>6}{'inproc':>8}{'in shm':>8}{'provider':>9}{'added [IQR]':>19}{'vs shm':>8}"
          f"{'vs dir.':>8}"
          f"{'spin':>8}{'follow':>9}{'plain':>7}{'ratio':>7}{'cpu in':>8}{'cpu prov':>9}   (µs)")
    rows = []
    for op in OPS:
        for size in sizes:
            med = {variant: statistics.median(times[(variant, op, size)]) * 1e6
                   for variant in (*BASELINES, *PROVIDERS, "cpu:inproc", "cpu:provider")}
            bar, q1, q3 = added(per_block, "provider", "inproc", op, size)
            row = {"op": op, "size_bytes": size, "reps": len(times[("provider", op, size)]), "blocks": blocks,
                   **{f"{variant}_us": med[variant] for variant in (*BASELINES, *PROVIDERS)},
                   "added_us": bar, "added_q1_us": q1, "added_q3_us": q3,
                   "added_vs_inproc_shm_us": added(per_block, "provider", "inproc_shm", op, size)[0],
                   "added_vs_inproc_direct_us": added(per_block, "provider", "inproc_direct", op, size)[0],
                   **{f"{variant}_added_us": added(per_block, variant, "inproc", op, size)[0]
                      for variant in PROVIDERS[1:]},
                   "ratio_provider_over_inproc": ratio(per_block, "provider", "inproc", op, size),
                   "tenant_cpu_inproc_us": med["cpu:inproc"], "tenant_cpu_provider_us": med["cpu:provider"]}
            for variant in ("inproc_check", "provider_socket", "zmq_floor", "pipe_floor"):
                if (variant, op, size) in times:
                    row[f"{variant}_us"] = statistics.median(times[(variant, op, size)]) * 1e6
            row.update({f"stage_{stage}_us": statistics.median(stages[(op, size, stage)])
                        for stage in STAGES + CPU_STAGES})
            rows.append(row)
            spread = f"{bar:.0f} [{q1:.0f}, {q3:.0f}]"
            print(f"{op:<11}{size:>9}{row['reps']:>6}{med['inproc']:>8.0f}{med['inproc_shm']:>8.0f}"
                  f"{med['provider']:>9.0f}{spread:>19}{row['added_vs_inproc_shm_us']:>8.0f}{row['added_vs_inproc_direct_us']:>8.0f}"
                  f"{row['provider_spin_added_us']:>8.0f}{row['provider_follow_added_us']:>9.0f}"
                  f"{row['provider_plain_added_us']:>7.0f}{row['ratio_provider_over_inproc']:>7.2f}"
                  f"{med['cpu:inproc']:>8.0f}{med['cpu:provider']:>9.0f}")
    if ab is not None:
        _print_ab(rows, per_block, ab)
    if floors:
        print(f"\n{'op':<11}{'size':>9}{'+check':>8}{'socket':>8}{'zmq rt':>8}{'pipe rt':>8}   (µs, medians)")
        for row in rows:
            print(f"{row['op']:<11}{row['size_bytes']:>9}" + "".join(
                f"{row[f'{variant}_us']:>8.0f}" for variant in ("inproc_check", "provider_socket", "zmq_floor",
                                                               "pipe_floor")))
    for title, names in (("fast-path stages, wall", STAGES), ("their CPU (one thread each; provider_ranks.py)",
                                                              CPU_STAGES)):
        print(f"\n{title}, medians (µs): " + ", ".join(names))
        for row in rows:
            print(f"{row['op']:<11}{row['size_bytes']:>9}" + "".join(f"{row[f'stage_{stage}_us']:>11.1f}"
                                                                     for stage in names))
    write_csv(Path(__file__).parent / "results" / "provider_single_host.csv", rows)
    return 0


def _print_ab(rows: list[dict], per_block: dict, ab: str) -> None:
    """The same-run A/B's two sides (``--warm-ab``, ``--direct-ab``), added to ``rows`` under the other side's label."""
    on, off = ab, OFF[ab]
    print(f"\n{ab} A/B (same run, alternate blocks; {on}: the table above; {off}: "
          f"{'keep-warm off, as shipped' if ab == 'warm' else 'every collective on gloo, the path before'}): median "
          "per-block µs, added [IQR], ratio (provider ÷ inproc), and added vs inproc_direct (the same work in-process)")
    print(f"{'op':<11}{'size':>9}{f'inproc {on}':>14}{off:>7}{f'provider {on}':>16}{off:>7}"
          f"{f'added {on}':>18}{f'added {off}':>18}{'ratio':>7}{off:>7}{f'vs dir. {on}':>15}{off:>7}{f'plain {off}':>12}")
    for row in rows:
        op, size = row["op"], row["size_bytes"]
        other = {variant: statistics.median(per_block[(f"{variant}:{off}", op, size)]) * 1e6
                 for variant in ("inproc", "provider")}
        bar, q1, q3 = added(per_block, f"provider:{off}", f"inproc:{off}", op, size)
        row.update({f"inproc_{off}_us": other["inproc"], f"provider_{off}_us": other["provider"],
                    f"added_{off}_us": bar, f"added_{off}_q1_us": q1, f"added_{off}_q3_us": q3,
                    f"ratio_{off}": ratio(per_block, f"provider:{off}", f"inproc:{off}", op, size),
                    f"added_vs_inproc_direct_{off}_us": added(per_block, f"provider:{off}", f"inproc_direct:{off}",
                                                              op, size)[0],
                    f"plain_added_{off}_us": added(per_block, f"provider_plain:{off}", f"inproc:{off}", op, size)[0]})
        spread = f"{row['added_us']:.0f} [{row['added_q1_us']:.0f}, {row['added_q3_us']:.0f}]"
        print(f"{op:<11}{size:>9}{row['inproc_us']:>14.0f}{other['inproc']:>7.0f}{row['provider_us']:>16.0f}"
              f"{other['provider']:>7.0f}{spread:>18}{f'{bar:.0f} [{q1:.0f}, {q3:.0f}]':>18}"
              f"{row['ratio_provider_over_inproc']:>7.2f}{row[f'ratio_{off}']:>7.2f}"
              f"{row['added_vs_inproc_direct_us']:>15.0f}{row[f'added_vs_inproc_direct_{off}_us']:>7.0f}"
              f"{row[f'plain_added_{off}_us']:>12.0f}")


if __name__ == "__main__":
    sys.exit(main())
