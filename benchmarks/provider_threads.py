"""Where a provider call's cost goes, thread by thread: CPU, context switches and page faults per call, the same
collective through the service and in-process (issue 16: the 8 MiB AllGather's excess).

    PYTHONPATH=src:benchmarks python benchmarks/provider_threads.py                      # 8 MiB AllGather, 4 KiB AllReduce
    PYTHONPATH=src:benchmarks python benchmarks/provider_threads.py --cases all_gather:524288 --calls 400

Each case runs ``--calls`` calls of each variant (``inproc``: the tenant's own world-1 communicator;
``provider``: the shim as shipped; ``provider_gloo``: the same on a session whose job runs every collective on gloo,
the path before ``mccl.provider.direct``), in alternating stretches of ``--stretch`` calls (so load hits all alike),
each call after ``--gap-us`` of the tenant computing, as ``provider_bar.py``. Per call, from ``/proc``: every
thread's CPU (``schedstat``) and voluntary context switches (a thread that slept and was woken: the wake-ups),
grouped by role — the tenant's calling thread (its ``thread_time`` across the calls only), the service's
fast-path thread, each
process's gloo threads, the rest — and each process's minor page faults; and each role's time spent runnable but
waiting for a CPU (``schedstat``'s run delay: what load costs a woken thread; the calling thread's includes its
gaps). The provider's added CPU is the tenant's and the service's together minus the in-process call's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

from provider_bar import _gap
from provider_ranks import _buffers, _calls, _run


def _threads(pid: int) -> dict[int, tuple[str, int, int, int]]:
    """tid -> (name, CPU ns, voluntary context switches, ns runnable but waiting for a CPU) of every thread of
    ``pid``."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            base = f"/proc/{pid}/task/{tid}"
            name = Path(f"{base}/comm").read_text().strip()
            cpu, waited = (int(field) for field in Path(f"{base}/schedstat").read_text().split()[:2])
            switches = next(int(line.split()[1]) for line in Path(f"{base}/status").read_text().splitlines()
                            if line.startswith("voluntary_ctxt_switches"))
        except (OSError, ValueError, StopIteration):
            continue
        found[int(tid)] = (name, cpu, switches, waited)
    return found


def _faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])  # minflt


def _role(pid: int, tid: int, name: str, caller: int, fast: set[int]) -> str:
    if tid == caller:
        return "calling thread"
    if name.startswith(("pt_gloo", "gloo")):
        return "gloo threads"
    return "fast-path thread" if tid in fast else "other threads"


def tenant(endpoint: str, secret_hex: str, service_pid: int, cases: list[tuple[str, int]], calls: int, stretch: int,
           gap_ns: int, results) -> None:
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
    before = set(_threads(service_pid))
    shim = Shim(endpoint, tenant_credential(JobSecret.from_hex(secret_hex), "bench"))
    remote = shim.join("threads", [0])
    gloo_shim = Shim(endpoint, tenant_credential(JobSecret.from_hex(secret_hex), "bench"))
    gloo_shim.direct(False)
    remote_gloo = gloo_shim.join("threads-gloo", [0])
    me = os.getpid()
    caller = me  # (the main thread's tid is the pid)
    found: dict = {}
    for op, size in cases:
        variants = {"inproc": (_calls(local), _buffers(op, size, 1, lambda count: torch.ones(count))),
                    "provider": (_calls(remote), _buffers(op, size, 1, shim.empty)),
                    "provider_gloo": (_calls(remote_gloo), _buffers(op, size, 1, gloo_shim.empty))}
        for made, buffers in variants.values():
            for tensor in buffers:
                tensor.fill_(1.0)
            for _ in range(5):
                _run(made, op, *buffers)
        fast = set(_threads(service_pid)) - before  # the session's threads (its socket's is idle between requests)
        for done in range(0, calls, stretch):
            for name, (made, buffers) in variants.items():
                count = min(stretch, calls - done)
                start = {pid: (_threads(pid), _faults(pid)) for pid in (me, service_pid)}
                calling = 0  # the calling thread's CPU in the calls only (not the gap, not these /proc reads)
                for _ in range(count):
                    _gap(gap_ns, True)
                    cpu_start = time.thread_time_ns()
                    _run(made, op, *buffers)
                    calling += time.thread_time_ns() - cpu_start
                for pid, (threads, faults) in start.items():
                    after = _threads(pid)
                    key = (name, op, size, "tenant" if pid == me else "service")
                    row = found.setdefault(key, {"calls": 0, "faults": 0})
                    row["calls"] += count
                    row["faults"] += _faults(pid) - faults
                    for tid, (thread, cpu, switches, waited) in after.items():
                        was = threads.get(tid, (thread, 0, 0, 0))
                        role = _role(pid, tid, thread, caller if pid == me else -1, fast)
                        cpu_ns = calling if role == "calling thread" else cpu - was[1]
                        row[(role, "cpu")] = row.get((role, "cpu"), 0) + cpu_ns
                        row[(role, "switches")] = row.get((role, "switches"), 0) + switches - was[2]
                        row[(role, "waited")] = row.get((role, "waited"), 0) + waited - was[3]
    gloo_shim.close()
    shim.close()
    local.close()
    results.put(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="all_gather:8388608,all_reduce:4096", help="op:bytes, comma-separated")
    parser.add_argument("--calls", type=int, default=200, help="calls of each variant per case")
    parser.add_argument("--stretch", type=int, default=10, help="calls of one variant before the other's")
    parser.add_argument("--gap-us", type=float, default=1000.0, help="the tenant's compute before each call (µs)")
    args = parser.parse_args()
    try:
        cases = [(op, int(size)) for op, size in (case.split(":") for case in args.cases.split(","))]
    except ValueError:
        cases = []
    if not cases or any(op not in ("all_gather", "all_reduce") or size < 16 or size % 16 for op, size in cases):
        parser.error("--cases takes all_gather:<bytes> or all_reduce:<bytes> (multiples of 16), comma-separated")
    if args.calls < 1 or args.stretch < 1 or args.gap_us < 0:
        parser.error("--calls and --stretch must be at least 1, --gap-us ≥ 0")
    from mccl.control.auth import new_secret
    from mccl.provider.launch import start_services
    from mccl.runtime.launch import free_port

    started, load = time.strftime("%H:%M UTC", time.gmtime()), os.getloadavg()[0]
    secret = new_secret()
    context = mp.get_context("spawn")
    with start_services(1, secret, ["bench"], store_port=free_port()) as services:
        results = context.Queue()
        process = context.Process(target=tenant, args=(services.endpoints[0], secret.hex, services.processes[0].pid,
                                                       cases, args.calls, args.stretch, int(args.gap_us * 1e3),
                                                       results))
        process.start()
        found = results.get(timeout=1800)
        process.join(timeout=30)
    print(f"{started}; load average {load:.1f} → {os.getloadavg()[0]:.1f}; {args.calls} calls per variant, gap "
          f"{args.gap_us:g} µs compute; per call: CPU µs / voluntary context switches / µs runnable waiting for a "
          "CPU, minor faults per process")
    roles = ("calling thread", "fast-path thread", "gloo threads", "other threads")
    for op, size in cases:
        totals = {}
        for name in ("inproc", "provider", "provider_gloo"):
            parts, total = [], 0.0
            for side in ("tenant", "service"):
                row = found[(name, op, size, side)]
                calls = row["calls"]
                shown = [f"{role} {row.get((role, 'cpu'), 0) / calls / 1e3:.0f} / "
                         f"{row.get((role, 'switches'), 0) / calls:.1f} / {row.get((role, 'waited'), 0) / calls / 1e3:.0f}"
                         for role in roles
                         if abs(row.get((role, "cpu"), 0)) / calls > 500 or row.get((role, "switches"), 0) / calls > 0.05]
                total += sum(row.get((role, "cpu"), 0) for role in roles) / calls / 1e3
                parts.append(f"{side}: " + ", ".join(shown) + f"; faults {row['faults'] / calls:.1f}")
            totals[name] = total
            print(f"{op} {size} {name:<9} CPU {total:.0f} µs — " + " | ".join(parts))
        print(f"{op} {size} provider − inproc: {totals['provider'] - totals['inproc']:.0f} µs CPU per call "
              f"(provider_gloo − inproc: {totals['provider_gloo'] - totals['inproc']:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
