"""The provider's per-call Python path in CPU, each side alone, without the wait (issue 16: what the code costs,
apart from the wake-ups and the load).

    PYTHONPATH=src:benchmarks python benchmarks/provider_path_cpu.py        # ~10 s

* tenant: a 4 KiB AllReduce and AllGather through the shim (``ProviderCommunicator`` → the client's fast path) on
  shared-memory tensors, with the service's success reply written into the reply pipe before each call — so the
  call never waits: what is measured is the shim's lookups, the request's encoding, ``write``, ``poll``, ``read``
  and the reply's check (the calling thread's ``thread_time``);
* service: the fast path's handling of one repeated request frame (``FastPath._answer``: the cached check, the
  job's state, the reply's encoding) around a job whose collective does nothing.

Medians over ``--calls`` calls (µs).
"""

from __future__ import annotations

import argparse
import itertools
import mmap
import os
import select
import statistics
import sys
import threading
import time


def _tenant(calls: int) -> dict[str, float]:
    import torch

    from mccl.provider import channel
    from mccl.provider.client import Allocation, Joined
    from mccl.provider.replyspin import IdleGate
    from mccl.provider.shim import ProviderCommunicator, Shim

    shim = Shim.__new__(Shim)  # a client without a service: only the fast path's state
    shim.timeout_s, shim.spin_ns, shim.adaptive, shim.warm, shim._spin, shim._cpu = 300.0, 0, True, False, None, None
    shim._gate, shim.followed, shim._lock = IdleGate(), 0, threading.Lock()
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    os.set_blocking(reply_read, False)
    os.set_blocking(request_read, False)
    shim._channel, shim._reader = (request_write, reply_read), channel.FrameReader(reply_read, max_frame=1 << 16)
    shim._poll = select.poll()
    shim._poll.register(reply_read, select.POLLIN)
    shim._requests, shim.trace, shim.trace_cpu, shim._ids = {}, None, False, itertools.count(1)
    shim.allocations, shim._bytes, shim._staging, shim._refs, shim._sent = {}, {}, {}, {}, {}
    shim._tails = {}  # (the client before the eighth session kept its encoded requests there: to measure it alike)
    buffer = mmap.mmap(-1, 1 << 16)
    shim.allocations[1] = Allocation(1, 1 << 16, buffer)
    shim._bytes[1] = torch.frombuffer(buffer, dtype=torch.uint8)
    comm = ProviderCommunicator(shim, Joined(1, 0, 1))
    x = shim.tensor(shim.allocations[1], (1024,), torch.float32)
    out = shim.tensor(shim.allocations[1], (1024,), torch.float32, offset=4096)
    expected = itertools.count(1)
    found = {}
    for name, call in (("all_reduce", lambda: comm.all_reduce(x)),
                       ("all_gather", lambda: comm.all_gather_into_tensor(out, x))):
        samples = []
        for index in range(calls):
            os.write(reply_write, channel.encode_ok(next(expected)))
            start = time.thread_time_ns()
            call()
            samples.append(time.thread_time_ns() - start)
            if index % 64 == 0:
                os.read(request_read, 1 << 20)  # (the requests nobody serves)
        found[f"tenant {name}"] = statistics.median(samples) / 1e3
    return found


def _service(calls: int) -> dict[str, float]:
    from mccl.provider import channel
    from mccl.provider.checks import CollectiveChecks
    from mccl.provider.fastpath import FastPath
    from mccl.provider.memory import Registry

    class NoOpJob:
        size, broken = 1, False

        def run(self, kind: str, tensors: list, reduce: str) -> None:
            return None

    registry = Registry()
    segment = registry.allocate("bench", 1 << 16)
    counted: dict = {}
    counter_lock = threading.Lock()

    def count(name: str, amount: int = 1) -> None:
        with counter_lock:
            counted[name] = counted.get(name, 0) + amount

    checks = CollectiveChecks("bench", registry, {1: NoOpJob()}, count)
    fast = FastPath(1, checks, threading.Lock(), lambda request_id, error: {}, count)
    frames = {"all_reduce": [[segment.alloc_id, 0, 4096]],
              "all_gather": [[segment.alloc_id, 0, 4096], [segment.alloc_id, 8192, 4096]]}
    found = {}
    try:
        for name, refs in frames.items():
            frame = channel.encode_request(5, 1, name, "float32", "sum", refs)[channel.LENGTH.size:]
            samples = []
            for _ in range(calls):
                start = time.thread_time_ns()
                with fast.lock:
                    reply = fast._answer(frame, 0)
                samples.append(time.thread_time_ns() - start)
            if reply != channel.encode_ok(5):
                raise RuntimeError(f"the service refused the benchmark's request: {reply!r}")
            found[f"service {name}"] = statistics.median(samples) / 1e3
    finally:
        fast.stop()
        registry.release_all({segment.alloc_id})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    load = os.getloadavg()[0]
    found = {**_tenant(args.calls), **_service(args.calls)}
    print(f"{time.strftime('%H:%M UTC', time.gmtime())}; load average {load:.1f} → {os.getloadavg()[0]:.1f}; "
          f"median CPU per call, µs, {args.calls} calls, nothing waited for")
    for name, value in found.items():
        print(f"  {name:<22}{value:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
