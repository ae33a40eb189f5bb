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

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.runtime.launch import free_port, run_ranks

KIB, MIB = 1 << 10, 1 << 20
SIZES = [4 * KIB, 64 * KIB, 512 * KIB, 8 * MIB]
OPS = ("all_gather", "all_reduce")


def _reps(size: int, quick: bool) -> int:
    base = 200 if size <= 64 * KIB else (100 if size <= MIB else 30)
    return base // 4 if quick else base


def _buffers(op: str, size: int, n: int, empty):
    """(output, input) for nccl-tests' S: AllGather S = output bytes per rank, AllReduce S = the buffer."""
    if op == "all_gather":
        return empty(size // 4), empty(size // 4 // n)
    buffer = empty(size // 4)
    return buffer, buffer


def _run(comm_call, op: str, output, input) -> None:
    if op == "all_gather":
        comm_call["all_gather"](output, input)
    else:
        comm_call["all_reduce"](output)


def _inproc_rank(rank: int, n: int, sizes: list[int], quick: bool, check: bool) -> dict:
    import torch
    import torch.distributed as dist

    import mccl

    comm = mccl.init(hot_swap=False, check=check)
    calls = {"all_gather": comm.all_gather_into_tensor, "all_reduce": comm.all_reduce}
    times: dict = {}
    for op in OPS:
        for size in sizes:
            output, input = _buffers(op, size, n, lambda count: torch.ones(count))
            for _ in range(5):
                _run(calls, op, output, input)
            samples = []
            for _ in range(_reps(size, quick)):
                dist.barrier()
                start = time.perf_counter()
                _run(calls, op, output, input)
                samples.append(time.perf_counter() - start)
            times[(op, size)] = samples
    comm.close()
    return times


def _tenant(host: int, n: int, endpoint: str, secret_hex: str, sizes: list[int], quick: bool, results) -> None:
    import torch

    from mccl.control.auth import JobSecret
    from mccl.provider.keys import tenant_credential
    from mccl.provider.shim import Shim

    torch.set_num_threads(1)
    client = Shim(endpoint, tenant_credential(JobSecret.from_hex(secret_hex), "bench"))
    comm = client.join("bench", list(range(n)))
    calls = {"all_gather": comm.all_gather_into_tensor, "all_reduce": comm.all_reduce}
    flag = client.empty(1)
    times: dict = {}
    for op in OPS:
        for size in sizes:
            output, input = _buffers(op, size, n, client.empty)
            output.fill_(1.0)
            input.fill_(1.0)
            for _ in range(5):
                _run(calls, op, output, input)
            samples = []
            for _ in range(_reps(size, quick)):
                comm.all_reduce(flag)  # the barrier: through the service too
                start = time.perf_counter()
                _run(calls, op, output, input)
                samples.append(time.perf_counter() - start)
            times[(op, size)] = samples
            client.free_tensor(output)
            if input is not output:
                client.free_tensor(input)
    client.close()
    results.put((host, times))


def _echo(secret_hex: str, ready) -> None:
    """The floors: a bare ZeroMQ ROUTER (CURVE, ipc) and a bare pipe pair, each answering every message."""
    import tempfile

    import zmq

    from mccl.control.auth import JobSecret

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    JobSecret.from_hex(secret_hex).make_server(router)
    run_dir = tempfile.mkdtemp(prefix="mccl-bench-echo-")
    router.bind(f"ipc://{run_dir}/echo.sock")
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    pid = os.getpid()
    ready.send((router.getsockopt_string(zmq.LAST_ENDPOINT), f"/proc/{pid}/fd/{request_write}",
                f"/proc/{pid}/fd/{reply_read}"))
    ready.recv()  # the tenant has opened its ends
    os.close(request_write)
    os.close(reply_read)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(request_read, zmq.POLLIN)
    while True:
        found = dict(poller.poll(1000))
        if request_read in found:
            data = os.read(request_read, 4096)
            if not data:
                return
            os.write(reply_write, data)
        if router in found:
            identity, frame = router.recv_multipart()
            router.send_multipart([identity, frame])


def _interleaved_tenant(endpoint: str, secret_hex: str, sizes: list[int], quick: bool, results) -> None:
    """One host: the tenant times, repetition by repetition, the same collective on its own in-process
    communicator (world 1, check off and on), through its service on the fast path and on the session
    socket, and the two bare round trips (ZeroMQ with CURVE, a pipe pair) — all under the same load.
    The fast-path calls are traced: the service's stage timestamps come back in each reply."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import zmq

    from mccl.control.auth import JobSecret
    from mccl.provider.keys import tenant_credential
    from mccl.provider.shim import Shim
    from mccl.runtime.communicator import Communicator
    from mccl.runtime.transport import Transport

    torch.set_num_threads(1)
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=60))
    local = {check: Communicator(Transport(group, backend="gloo"), name=f"local{check}", check=check)
             for check in (False, True)}
    credential = tenant_credential(JobSecret.from_hex(secret_hex), "bench")
    shim = Shim(endpoint, credential)
    shim_socket = Shim(endpoint, credential, fast=False)
    remote, remote_socket = shim.join("single", [0]), shim_socket.join("single-socket", [0])
    context = mp.get_context("spawn")
    mine_end, echo_end = context.Pipe()
    echo = context.Process(target=_echo, args=(secret_hex, echo_end), daemon=True)
    echo.start()
    zmq_endpoint, request_path, reply_path = mine_end.recv()
    dealer = zmq.Context().socket(zmq.DEALER)
    credential.make_client(dealer)
    dealer.connect(zmq_endpoint)
    pipe_out, pipe_in = os.open(request_path, os.O_WRONLY), os.open(reply_path, os.O_RDONLY)
    mine_end.send("opened")
    message = b"x" * 100  # about a collective request's size

    def zmq_round_trip(*_: object) -> None:
        dealer.send(message)
        dealer.recv()

    def pipe_round_trip(*_: object) -> None:
        os.write(pipe_out, message)
        os.read(pipe_in, 4096)

    times: dict = {}
    stages: dict = {}
    for op in OPS:
        for size in sizes:
            mine = _buffers(op, size, 1, lambda count: torch.ones(count))
            shared = _buffers(op, size, 1, shim.empty)
            shared_socket = _buffers(op, size, 1, shim_socket.empty)
            variants = {"inproc": ({"all_gather": local[False].all_gather_into_tensor,
                                    "all_reduce": local[False].all_reduce}, mine),
                        "inproc_check": ({"all_gather": local[True].all_gather_into_tensor,
                                          "all_reduce": local[True].all_reduce}, mine),
                        "provider": ({"all_gather": remote.all_gather_into_tensor, "all_reduce": remote.all_reduce},
                                     shared),
                        "provider_socket": ({"all_gather": remote_socket.all_gather_into_tensor,
                                             "all_reduce": remote_socket.all_reduce}, shared_socket),
                        "zmq_floor": ({"all_gather": zmq_round_trip, "all_reduce": zmq_round_trip}, mine),
                        "pipe_floor": ({"all_gather": pipe_round_trip, "all_reduce": pipe_round_trip}, mine)}
            for calls, (output, input) in variants.values():
                for _ in range(5):
                    _run(calls, op, output, input)
            for _ in range(_reps(size, quick)):
                for variant, (calls, (output, input)) in variants.items():
                    if variant == "provider":
                        shim.trace = []
                    start = time.perf_counter_ns()
                    _run(calls, op, output, input)
                    total = time.perf_counter_ns() - start
                    times.setdefault((variant, op, size), []).append(total / 1e9)
                    if variant == "provider":
                        sent, woke, received, parsed, checked, ran, replied, got = shim.trace[0]
                        shim.trace = None
                        for stage, ns in (("shim", total - (got - sent)), ("to_service", woke - sent),
                                          ("read", received - woke),
                                          ("decode", parsed - received), ("checks", checked - parsed),
                                          ("collective", ran - checked), ("reply", replied - ran),
                                          ("to_tenant", got - replied)):
                            stages.setdefault((op, size, stage), []).append(ns / 1e3)
    os.close(pipe_out)
    os.close(pipe_in)
    dealer.close(linger=0)
    echo.join(timeout=10)
    shim.close()
    shim_socket.close()
    results.put((times, stages))


def _pair_tenant(host: int, n: int, endpoint: str, secret_hex: str, port: int, sizes: list[int], quick: bool,
                 results) -> None:
    """Two hosts, interleaved: this tenant process is rank ``host`` of an in-process gloo job over the
    tenants' own processes (check off and on) *and* of a job in the services; each repetition runs the three
    after an in-process barrier, so all see the same load. The service's stages come back traced."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from mccl.control.auth import JobSecret
    from mccl.provider.keys import tenant_credential
    from mccl.provider.shim import Shim
    from mccl.runtime.communicator import Communicator
    from mccl.runtime.transport import Transport

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, n, host == 0, timedelta(seconds=300))
    group = dist.ProcessGroupGloo(dist.PrefixStore("inproc/", store), host, n, timedelta(seconds=300))
    local = {check: Communicator(Transport(group, backend="gloo"), name=f"local{check}", check=check)
             for check in (False, True)}
    shim = Shim(endpoint, tenant_credential(JobSecret.from_hex(secret_hex), "bench"))
    remote = shim.join("pair", list(range(n)))
    times: dict = {}
    stages: dict = {}
    for op in OPS:
        for size in sizes:
            mine, shared = _buffers(op, size, n, lambda count: torch.ones(count)), _buffers(op, size, n, shim.empty)
            for tensor in shared:
                tensor.fill_(1.0)
            variants = {"inproc": ({"all_gather": local[False].all_gather_into_tensor,
                                    "all_reduce": local[False].all_reduce}, mine),
                        "inproc_check": ({"all_gather": local[True].all_gather_into_tensor,
                                          "all_reduce": local[True].all_reduce}, mine),
                        "provider": ({"all_gather": remote.all_gather_into_tensor, "all_reduce": remote.all_reduce},
                                     shared)}
            for calls, (output, input) in variants.values():
                for _ in range(5):
                    _run(calls, op, output, input)
            for _ in range(_reps(size, quick)):
                for variant, (calls, (output, input)) in variants.items():
                    local[False].barrier()
                    shim.trace = [] if variant == "provider" else None
                    start = time.perf_counter_ns()
                    _run(calls, op, output, input)
                    total = time.perf_counter_ns() - start
                    times.setdefault((variant, op, size), []).append(total / 1e9)
                    if variant == "provider":
                        sent, woke, received, parsed, checked, ran, replied, got = shim.trace[0]
                        for stage, ns in (("shim", total - (got - sent)), ("to_service", woke - sent),
                                          ("read", received - woke), ("decode", parsed - received),
                                          ("checks", checked - parsed), ("collective", ran - checked),
                                          ("reply", replied - ran), ("to_tenant", got - replied)):
                            stages.setdefault((op, size, stage), []).append(ns / 1e3)
                    shim.trace = None
    shim.close()
    for comm in local.values():
        comm.close()
    results.put((host, times, stages))


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


STAGES = ("shim", "to_service", "read", "decode", "checks", "collective", "reply", "to_tenant")


def _interleaved(sizes: list[int], quick: bool) -> tuple[dict, dict]:
    from mccl.control.auth import new_secret
    from mccl.provider.launch import start_services

    secret = new_secret()
    context = mp.get_context("spawn")
    with start_services(1, secret, ["bench"], store_port=free_port()) as services:
        results = context.Queue()
        tenant = context.Process(target=_interleaved_tenant, args=(services.endpoints[0], secret.hex, sizes, quick,
                                                                   results))
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
    args = parser.parse_args()
    if args.single_host:
        return _print_single_host(SIZES, args.quick)
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


def _print_single_host(sizes: list[int], quick: bool) -> int:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    cpu_before = time.process_time()
    times, stages = _interleaved(sizes, quick)
    print(f"1 host, tenant and service processes, interleaved; {started}; load average before {load_before[0]:.1f}, "
          f"after {os.getloadavg()[0]:.1f} (2 cores shared)")
    med = {key: statistics.median(values) * 1e6 for key, values in times.items()}
    print(f"{'op':<11}{'size':>9}{'inproc':>8}{'+check':>8}{'provider':>10}{'added':>7}{'socket':>8}{'added':>7}"
          f"{'zmq rt':>8}{'pipe rt':>8}   (µs, medians)")
    rows = []
    for op in OPS:
        for size in sizes:
            inproc, checked, provider, socket_path, zmq_rt, pipe_rt = (
                med[(variant, op, size)] for variant in ("inproc", "inproc_check", "provider", "provider_socket",
                                                         "zmq_floor", "pipe_floor"))
            row = {"op": op, "size_bytes": size, "inproc_us": inproc, "inproc_check_us": checked,
                   "provider_us": provider, "added_vs_inproc_us": provider - inproc,
                   "added_vs_inproc_check_us": provider - checked, "provider_socket_us": socket_path,
                   "socket_added_vs_inproc_us": socket_path - inproc, "zmq_round_trip_us": zmq_rt,
                   "pipe_round_trip_us": pipe_rt, "reps": len(times[("provider", op, size)])}
            row.update({f"stage_{stage}_us": statistics.median(stages[(op, size, stage)]) for stage in STAGES})
            rows.append(row)
            print(f"{op:<11}{size:>9}{inproc:>8.0f}{checked:>8.0f}{provider:>10.0f}{provider - inproc:>7.0f}"
                  f"{socket_path:>8.0f}{socket_path - inproc:>7.0f}{zmq_rt:>8.0f}{pipe_rt:>8.0f}")
    print("\nfast-path stages, medians (µs): " + ", ".join(STAGES))
    for row in rows:
        print(f"{row['op']:<11}{row['size_bytes']:>9}" + "".join(f"{row[f'stage_{stage}_us']:>11.1f}"
                                                                 for stage in STAGES))
    print(f"(this process's CPU: {time.process_time() - cpu_before:.1f} s)")
    write_csv(Path(__file__).parent / "results" / "provider_single_host.csv", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
