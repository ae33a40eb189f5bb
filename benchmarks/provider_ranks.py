"""The processes of ``benchmarks/provider.py``: in-process ranks, tenants of the provider service, the echo
server of the bare round trips. Spawned by the driver (``provider.py``), so they live in a module of their own.

Stages (``STAGES``) of a traced fast-path call, from the stamps the service returns
(:mod:`mccl.provider.channel`, :class:`~mccl.provider.client.FastTrace`): *shim* = the tenant's own work,
*to_service* = the request's trip until the service's fast-path thread has read it (since the fifth session
the thread blocks in ``read``: the read is in this stage), *read* = until it holds the session's lock,
*decode* (or the cached request's look-up), *checks* (the references; the job's state when cached),
*collective*, *reply* (its encoding), *to_tenant* = the reply's trip until the tenant has it.

CPU stages (``CPU_STAGES``, µs of one thread's CPU, ``time.thread_time_ns``: under load the wall stages are
mostly waiting for a core, these are what the path costs): *cpu_shim* = the tenant's calling thread outside
the trip, *cpu_trip* = the tenant's thread from encoding the request to having the reply (encode, write,
poll, read, decode), then the service's fast-path thread: *cpu_decode*, *cpu_checks*, *cpu_collective*
(that thread only: gloo's worker threads are not in it), *cpu_reply*.
"""

from __future__ import annotations

import os
import random
import time

KIB, MIB = 1 << 10, 1 << 20
SIZES = [4 * KIB, 64 * KIB, 512 * KIB, 8 * MIB]
OPS = ("all_gather", "all_reduce")


def sizes_option(parser, text: str | None) -> list[int]:
    """``--sizes`` (comma-separated byte counts, multiples of 16; None: :data:`SIZES`), or a usage error."""
    try:
        sizes = SIZES if text is None else [int(size) for size in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(size < 16 or size % 16 for size in sizes):
        parser.error("--sizes takes byte counts, multiples of 16, comma-separated")
    return sizes
STAGES = ("shim", "to_service", "read", "decode", "checks", "collective", "reply", "to_tenant")
CPU_STAGES = ("cpu_shim", "cpu_trip", "cpu_decode", "cpu_checks", "cpu_collective", "cpu_reply")

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


def _calls(comm) -> dict:
    """The two benchmarked calls of a communicator (in-process mccl or the shim's)."""
    return {"all_gather": comm.all_gather_into_tensor, "all_reduce": comm.all_reduce}


def _compared(local: dict, remote, mine, shared) -> dict:
    """The three variants every interleaved run compares: in-process (agreement off, on) and the provider."""
    return {"inproc": (_calls(local[False]), mine), "inproc_check": (_calls(local[True]), mine),
            "provider": (_calls(remote), shared)}


def _add_stages(stages: dict, key: tuple, total_ns: int, cpu_ns: int, trace) -> None:
    """Append one traced call's stage times (µs) under ``(*key, stage)`` (module docstring): the wall stages,
    or with CPU stamps in ``trace`` (a :class:`~mccl.provider.client.FastTrace`) the CPU stages; ``cpu_ns``:
    the calling thread's CPU for the whole call."""
    t = trace
    if not t.got_cpu:
        for stage, ns in zip(STAGES, (total_ns - (t.got - t.sent), t.woke - t.sent, t.received - t.woke,
                                      t.decoded - t.received, t.checked - t.decoded, t.ran - t.checked,
                                      t.replied - t.ran, t.got - t.replied), strict=True):
            stages.setdefault((*key, stage), []).append(ns / 1e3)
        return
    tenant_trip = t.got_cpu - t.sent_cpu
    for stage, ns in zip(CPU_STAGES, (cpu_ns - tenant_trip, tenant_trip, t.decoded_cpu - t.received_cpu,
                                      t.checked_cpu - t.decoded_cpu, t.ran_cpu - t.checked_cpu,
                                      t.replied_cpu - t.ran_cpu), strict=True):
        stages.setdefault((*key, stage), []).append(ns / 1e3)


def _interleave(variants: dict, shim, op: str, size: int, reps: int, times: dict, stages: dict,
                before=None) -> None:
    """Five warm-up calls of every variant, then ``reps`` repetitions of each in turn, in a random order
    (``before`` ahead of each call: a barrier across hosts), so all see the same load. The stages come from
    traced calls: of ``provider_traced`` (wall stamps) and ``provider_cpu`` (CPU stamps too, ~2 µs each: a
    system call) where the variants include them — then ``provider``, the bar's figure, is untraced, as a
    tenant's call is — else of ``provider`` itself."""
    for calls, (output, input) in variants.values():
        for _ in range(5):
            _run(calls, op, output, input)
    order = list(variants.items())
    traced = {"provider_traced", "provider_cpu"} if "provider_traced" in variants else {"provider"}
    shuffle = random.Random(size).shuffle  # (the same orders on every host: a barrier must pair the same calls)
    for _ in range(reps):
        # a new order each repetition: what ran just before decides whether the service's thread and caches are
        # warm (a provider call right after another provider call measured ~90 µs faster), so no variant may
        # always follow the same one
        shuffle(order)
        for variant, (calls, (output, input)) in order:
            if before is not None:
                before()
            shim.trace = [] if variant in traced else None
            shim.trace_cpu = variant == "provider_cpu"
            cpu, thread_cpu = time.process_time_ns(), time.thread_time_ns()
            start = time.perf_counter_ns()
            _run(calls, op, output, input)
            total = time.perf_counter_ns() - start
            thread_cpu = time.thread_time_ns() - thread_cpu
            times.setdefault((variant, op, size), []).append(total / 1e9)
            times.setdefault((f"cpu:{variant}", op, size), []).append((time.process_time_ns() - cpu) / 1e9)
            if shim.trace:
                _add_stages(stages, (op, size), total, thread_cpu, shim.trace[0])
            shim.trace, shim.trace_cpu = None, False


def _inproc_rank(rank: int, n: int, sizes: list[int], quick: bool, check: bool) -> dict:
    import torch
    import torch.distributed as dist

    import mccl

    comm = mccl.init(hot_swap=False, check=check)
    calls = _calls(comm)
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
    calls = _calls(comm)
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
            variants = _compared(local, remote, mine, shared)
            _interleave(variants, shim, op, size, _reps(size, quick), times, stages, local[False].barrier)
    shim.close()
    for comm in local.values():
        comm.close()
    results.put((host, times, stages))

