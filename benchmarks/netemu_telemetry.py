"""Telemetry accuracy and overhead on the kernel-emulated fabric: receive-side samples against the shaped
rate, and the collective's time with telemetry on ÷ off (needs root).

    PYTHONPATH=src .venv/bin/python benchmarks/netemu_telemetry.py --cases loop          # the bar: the four errors
    PYTHONPATH=src .venv/bin/python benchmarks/netemu_telemetry.py --cases loop --runs 1 --fault-factors 0.5 --dump
    PYTHONPATH=src .venv/bin/python benchmarks/netemu_telemetry.py --cases loop --gso 65536   # the kernel's GSO

The bar's command (the first) builds the fabric of ``mccl demo`` ``--runs`` times (3) for each of
``--fault-factors`` (1: healthy, 0.5: rank 0's NIC halved) and prints, per fabric state and collective, the
median telemetry error over every call of every run (and each run's median), and telemetry on ÷ off.

Two cases, the fabric of :mod:`mccl.experiments.netemu` (NICs 400 Gbit/s / ``--scale``, 20 Mbit/s by default):

* ``pair`` (the paper's §5 set-up, one saturated path): ``rail_optimized(1,2,1)``, 2 ranks, a ring AllGather of
  1 MiB per rank in 8 chunks through mccl; every NIC busy both ways.
* ``loop``: the 8 ranks and healthy schedules of ``mccl demo`` (AllGather, AllToAll), as in the loop. A fault
  factor below 1 scales rank 0's NIC (both directions) before the ranks start — the loop's fault, with the
  schedules still the healthy ones.
* ``resynth`` (run it with ``--fault-factors 0.5``): the loop's healthy AllGather and the AllGather
  re-synthesized for rank 0's NIC at the fault factor (what the controller swaps in), side by side on the
  degraded fabric — with ``--dump``, every rank's trace of both, for the executor-vs-model split (sixth session).

Per collective, rank 0's inter-host samples (it measures the paths *into* it: ``Sample(rank=sender,
peer=0)``): the rate over the union of their windows, ÷ the shaped goodput of rank 0's NIC (its downlink;
1448/1514 of the configured rate) − 1 — the "telemetry error"; and the union ÷ the collective's time
(the fraction of the collective the telemetry saw the path busy) next to the NIC-busy fraction measured by
the kernel (the downlink's htb byte counter ÷ (shaped rate × the slowest rank's time)). Medians over the
calls after the first.

Overhead: every rank runs each schedule on two communicators, one metered and one not, alternating which
goes first; per call the slowest rank's time; ``on_over_off`` = median on ÷ median off. Both use the
runtime's driver choice (``--driver`` forces one): a metered communicator runs eager where an unmetered one
would take one gloo alltoallv (AllToAll, one-step plans), and that difference is part of the overhead.

``--gso BYTES``: every NIC's ``gso_max_size`` instead of the fabric's (one MSS, 1448:
``mccl.experiments.netemu.fabric.NIC_GSO_MAX_SIZE``); 65536 is the kernel's default, under which the NICs pass
TCP's 64 KiB super-packets whole — data arrives in lumps of 64 KiB every 27 ms at 20 Mbit/s (the A/B of the
fifth session). ``--dump``: every rank's calls, samples and receive/send trace (``time.perf_counter``, one
clock on the emulated fabric), each NIC window's arrivals, counter base and sampler readings as they closed,
and every thread's CPU seconds by name, as JSON. ``--slice-bytes``: the executor's slice size on every rank.
CPU on/off: Σ over ranks of each call's ``process_time`` (every thread of the rank), medians, metered ÷
unmetered — the overhead's cost in CPU, which a loaded machine turns into time.
Writes ``benchmarks/results/netemu_telemetry<tag>.csv``.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from netemu_common import htb_sent_bytes, timed_collective  # noqa: E402  (benchmarks/ is on sys.path)
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.experiments.netemu import EmulatedFabric, FabricPlan, unsupported_reason
from mccl.experiments.netemu.demo import NetemuConfig, _synth_options
from mccl.experiments.netemu.ranks import run_ranks_in_fabric
from mccl.experiments.netemu.shaping import GOODPUT
from mccl.runtime.telemetry import TelemetryConfig

KINDS = ("allgather", "alltoall")
RESULTS = Path(__file__).resolve().parent / "results"


def _traced(metered, trace: list) -> None:  # noqa: ANN001  (a Communicator)
    """Record the metered communicator's receive posts/completions and sends (``time.perf_counter``: one
    clock for every rank of the emulated fabric, so the ranks' traces line up)."""
    import time as clock

    meters, transport = metered._meters, metered.transport
    posted, completed, post = meters.posted, meters.completed, transport.post

    counter = meters._counter

    def traced_posted(peer: int, nbytes: int, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        trace.append(("r", peer, nbytes, clock.perf_counter(), None, meters.seq,
                      counter() if counter is not None else None))
        posted(peer, nbytes, *args, **kwargs)

    def traced_completed(peer: int, nbytes: int, at: float | None = None, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        trace.append(("c", peer, nbytes, clock.perf_counter(), at, meters.seq, kwargs.get("counted")))
        completed(peer, nbytes, at, *args, **kwargs)

    def traced_post(op):  # noqa: ANN001, ANN202
        if op.is_send:
            trace.append(("s", op.peer, op.tensor.numel() * op.tensor.element_size(), clock.perf_counter(), None,
                          meters.seq, None))
        return post(op)

    close = meters._close

    def traced_close(window, port: int) -> None:  # noqa: ANN001  (a telemetry._Window)
        trace.append(("w", port, [(a.peer, a.nbytes, a.at, a.counted, a.noticed) for a in window.arrivals],
                      clock.perf_counter(), window.base, meters.seq, list(window.readings)))
        close(window, port)

    meters.posted, meters.completed, transport.post = traced_posted, traced_completed, traced_post
    meters._close = traced_close


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads so far, by name (``/proc/self/task/<tid>/stat``: utime + stime;
    threads of the same name summed, those Python does not know — gloo's, torch's — as ``native``)."""
    import os
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    names = {thread.native_id: thread.name.rstrip("0123456789").rstrip("-_") for thread in threading.enumerate()}
    cpu: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "native")
        cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return cpu


def _rank(rank: int, world: int, plan: FabricPlan, texts: dict, topology_spec: str, elements: dict,
          repeats: int, driver: str | None, trace: bool = False, telemetry: dict | None = None,
          slice_bytes: float | None = None) -> dict:
    """Every schedule ``repeats`` times with telemetry on (into a MemorySink) and off, alternating which goes
    first; rank 0 reads its downlink counter around the metered calls."""
    import functools

    import torch
    import torch.distributed as dist

    from mccl.runtime import MemorySink, TelemetryConfig, init
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    topology = parse_topology(topology_spec)
    downlink = functools.partial(htb_sent_bytes, plan.switch_ns, f"n{rank}") if rank == 0 else None
    out: dict = {}
    for name, text in texts.items():
        kind = loads_schedule(text).collective.value
        sink = MemorySink()
        metered = init(dist.group.WORLD, None, topology=topology, schedules=[loads_schedule(text)], hot_swap=False,
                       name=f"{name}-tel", sink=sink, driver=driver,
                       telemetry=TelemetryConfig(**{"flush_interval_s": 0.02, **(telemetry or {})}))
        plain = init(dist.group.WORLD, None, topology=topology, schedules=[loads_schedule(text)], hot_swap=False,
                     name=f"{name}-off", driver=driver)
        if slice_bytes:  # the executor's pipelining grain, the same on every rank (mccl.schedule.slicing)
            metered.slice_bytes = plain.slice_bytes = slice_bytes
        events: list = []
        if trace:
            _traced(metered, events)
        calls, off, off_cpu = [], [], []
        source = torch.arange(elements[kind], dtype=torch.int32) + rank
        output = torch.empty(elements[kind] * (world if kind == "allgather" else 1), dtype=torch.int32)
        for index in range(repeats):
            for on in ((True, False) if index % 2 else (False, True)):
                cpu = time.process_time()  # this rank's process, every thread (waiters, sampler, telemetry)
                if on:
                    seconds, nbytes = timed_collective(metered, kind, output, source, downlink)
                    calls.append((metered.history[-1][0], seconds, nbytes, time.process_time() - cpu))
                else:
                    off.append(timed_collective(plain, kind, output, source)[0])
                    off_cpu.append(time.process_time() - cpu)
        metered.flush_telemetry()
        threads = _thread_cpu()
        samples = [(s.kind, s.rank, s.peer, s.bytes, s.seconds, s.end_time, s.seq) for s in sink.samples]
        metered.close()
        plain.close()
        out[name] = {"calls": calls, "off": off, "off_cpu": off_cpu, "samples": samples, "trace": events,
                     "threads": threads}
    return out


def _union(windows: list[tuple[float, float]]) -> float:
    windows = sorted(windows)
    total, start, end = 0.0, *windows[0]
    for s, e in windows[1:]:
        if s > end:
            total, start, end = total + end - start, s, e
        else:
            end = max(end, e)
    return total + end - start


def nic_scaled(topology, rank: int, factor: float):  # noqa: ANN001, ANN201  (a Topology)
    """``topology`` with GPU ``rank``'s NIC links (both directions) scaled by ``factor``: what the controller
    measures after the loop's fault, and what ``benchmarks/netemu.py`` re-synthesizes for."""
    gpu = topology.gpus[rank]
    return topology.with_capacities(
        [link.gbps * (factor if gpu in (link.src, link.dst) and "tor" in (link.src + link.dst) else 1.0)
         for link in topology.links], name=f"{topology.name}+{gpu} NIC x{factor:g}")


def measure(case: str, scale: float, repeats: int, driver: str | None = None, dump: bool = False,
            gso: int | None = None, fault_factor: float | None = None, telemetry: dict | None = None,
            slice_bytes: float | None = None) -> list[dict]:
    from mccl.schedule import Collective, dumps_schedule
    from mccl.synth import optimize
    from mccl.synth.ring import naive_ring
    from mccl.topology import parse_topology

    if case == "pair":
        spec = "rail_optimized(1,2,1)"
        topology = parse_topology(spec)
        texts = {"allgather": dumps_schedule(naive_ring(topology, "allgather", chunks=8))}
        elements = {"allgather": (1 << 20) // 4}
    else:
        config = NetemuConfig(scale=scale)
        spec = config.topology_spec
        topology = parse_topology(spec)
        options = _synth_options(config.chunks)
        texts = {kind: dumps_schedule(optimize(topology, kind, options=options[Collective(kind)]).schedule)
                 for kind in KINDS}
        elements = {"allgather": config.ag_bytes // 4, "alltoall": (config.a2a_bytes // 4 // 8) * 8}
        if case == "resynth":  # the AllGather healthy and re-synthesized for rank 0's NIC at the fault factor
            degraded = nic_scaled(topology, config.fault_rank, fault_factor or config.fault_factor)
            texts = {"allgather": texts["allgather"], "allgather-resynth": dumps_schedule(
                optimize(degraded, "allgather", options=options[Collective.ALLGATHER]).schedule)}
    plan = FabricPlan.from_topology(topology, scale=scale, nvlink="shaped")
    with EmulatedFabric(plan) as built:
        if fault_factor is not None:
            built.scale_nic(0, fault_factor)
        if gso is not None:  # the NICs' largest TCP segment (module docstring)
            for port in built.plan.ranks:
                subprocess.run(["ip", "-n", port.namespace, "link", "set", "dev", "eth0", "gso_max_size", str(gso)],
                               check=True)
        outputs = run_ranks_in_fabric(_rank, built.plan, texts, spec, elements, repeats, driver, dump, telemetry,
                                      slice_bytes, timeout_s=600)
        down_mbit = built.nic_mbit(0)[1]
    goodput_mbit = down_mbit * GOODPUT
    if dump:
        import json

        (RESULTS / f"netemu_telemetry_{case}_dump.json").write_text(json.dumps(outputs))
    rows = []
    for name in texts:
        calls = outputs[0][name]["calls"]
        samples = [s for s in outputs[0][name]["samples"] if s[0] == "inter" and s[2] == 0 and s[4] > 0]
        errors, seen, busy, per_sample = [], [], [], []
        for index, (seq, _, nbytes, *_) in enumerate(calls):
            slowest = max(out[name]["calls"][index][1] for out in outputs)
            mine = [s for s in samples if s[6] == seq]
            per_sample += [s[3] * 8 / s[4] / 1e6 / goodput_mbit - 1 for s in mine] if index else []
            if index == 0 or not mine:
                continue
            union = _union([(s[5] - s[4], s[5]) for s in mine])
            errors.append(sum(s[3] for s in mine) * 8 / union / 1e6 / goodput_mbit - 1)
            seen.append(union / slowest)
            busy.append(nbytes * 8 / slowest / (down_mbit * 1e6))
        on = [max(out[name]["calls"][i][1] for out in outputs) for i in range(1, len(calls))]
        off = [max(out[name]["off"][i] for out in outputs) for i in range(1, len(calls))]
        cpu_on = [sum(out[name]["calls"][i][3] for out in outputs) for i in range(1, len(calls))]  # Σ ranks
        cpu_off = [sum(out[name]["off_cpu"][i] for out in outputs) for i in range(1, len(calls))]
        rows.append({"case": case, "driver": driver or "default", "gso": gso, "fault_factor": fault_factor,
                     "slice_bytes": slice_bytes,
                     "telemetry": ",".join(f"{k}={v}" for k, v in (telemetry or {}).items()),
                     "collective": name,
                     "nic_mbit": down_mbit, "calls_with_samples": len(errors),
                     "telemetry_err_median": round(statistics.median(errors), 4) if errors else None,
                     "telemetry_errors": [round(e, 4) for e in errors],
                     "telemetry_err_min": round(min(errors), 4) if errors else None,
                     "telemetry_err_max": round(max(errors), 4) if errors else None,
                     "per_sample_err_median": round(statistics.median(per_sample), 4) if per_sample else None,
                     "windows_over_time": round(statistics.median(seen), 3) if seen else None,
                     "nic_busy": round(statistics.median(busy), 3) if busy else None,
                     "on_s": round(statistics.median(on), 4), "off_s": round(statistics.median(off), 4),
                     "on_over_off": round(statistics.median(on) / statistics.median(off), 3),
                     "cpu_on_s": round(statistics.median(cpu_on), 4), "cpu_off_s": round(statistics.median(cpu_off), 4),
                     "cpu_on_over_off": round(statistics.median(cpu_on) / statistics.median(cpu_off), 3)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="pair,loop")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--scale", type=float, default=NetemuConfig.scale)
    parser.add_argument("--tag", default="")
    parser.add_argument("--driver", default=None, help="the executor's driver (default: the runtime's choice)")
    parser.add_argument("--dump", action="store_true",
                        help="also write every rank's calls, samples and receive/send trace as JSON")
    parser.add_argument("--fault-factors", default="1,0.5",
                        help="rank 0's NIC scaled by each before the ranks start (1: healthy; the schedules stay healthy)")
    parser.add_argument("--runs", type=int, default=3, help="fabrics built per fault factor")
    parser.add_argument("--telemetry", default="",
                        help="TelemetryConfig fields of the metered communicators, e.g. arrival_waiters=0,nic_counter=0")
    parser.add_argument("--slice-bytes", type=int, default=None,
                        help="the executor's slice size on every rank (default: mccl.schedule.slicing.SLICE_BYTES)")
    parser.add_argument("--gso", type=int, default=None,
                        help="set every NIC's gso_max_size to this many bytes (default: the fabric's, one MSS)")
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason:
        sys.exit(f"netemu_telemetry: {reason}")
    if args.slice_bytes is not None and args.slice_bytes < 1024:
        parser.error(f"--slice-bytes must be at least 1024, got {args.slice_bytes}")
    if args.runs < 1 or args.repeats < 2:
        parser.error("--runs must be at least 1 and --repeats at least 2 (the first call is a warm-up)")
    try:
        factors = [float(f) for f in args.fault_factors.split(",")]
    except ValueError:
        parser.error(f"--fault-factors takes a comma list of numbers, got {args.fault_factors!r}")
    telemetry = {}
    for item in filter(None, args.telemetry.split(",")):
        key, _, value = item.partition("=")
        if not hasattr(TelemetryConfig(), key.strip()):
            parser.error(f"--telemetry: TelemetryConfig has no field {key.strip()!r}")
        try:
            telemetry[key.strip()] = type(getattr(TelemetryConfig(), key.strip()))(float(value))
        except ValueError:
            parser.error(f"--telemetry: {key.strip()}={value!r} is not a number")
    if not all(0 < f <= 1 for f in factors):
        parser.error(f"--fault-factors must lie in (0, 1], got {args.fault_factors}")
    rows = []
    for case in args.cases.split(","):
        for factor in factors:
            for run in range(args.runs):
                started = time.perf_counter()
                got = measure(case, args.scale, args.repeats, args.driver, args.dump, args.gso,
                              None if factor == 1 else factor, telemetry, args.slice_bytes)
                rows += [{**row, "run": run} for row in got]
                print(f"[{case}, NIC x{factor:g}, run {run + 1}/{args.runs}: {time.perf_counter() - started:.0f} s] "
                      + ", ".join(f"{r['collective']} {r['telemetry_err_median']}" for r in got), flush=True)
    for row in rows:
        print(row)
    print(summary(rows))
    write_csv(RESULTS / f"netemu_telemetry{args.tag}.csv", rows)


def summary(rows: list[dict]) -> str:
    """One line per (case, fault factor, collective): the median error over every call of every run, each
    run's median, and telemetry on ÷ off (median over the runs)."""
    lines = ["case  NIC  collective  error (median of all calls)  per run  on/off  CPU on/off"]
    keys = dict.fromkeys((r["case"], r["fault_factor"], r["collective"]) for r in rows)
    for case, factor, collective in keys:
        mine = [r for r in rows if (r["case"], r["fault_factor"], r["collective"]) == (case, factor, collective)]
        errors = [e for r in mine for e in r["telemetry_errors"]]
        per_run = ", ".join(f"{r['telemetry_err_median']:+.2%}" for r in mine if r["telemetry_err_median"] is not None)
        overall = f"{statistics.median(errors):+.2%}" if errors else "none"
        ratio = statistics.median(r["on_over_off"] for r in mine)
        cpu = statistics.median(r["cpu_on_over_off"] for r in mine)
        lines.append(f"{case}  x{factor or 1:g}  {collective}  {overall}  [{per_run}]  {ratio:.3f}  {cpu:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
