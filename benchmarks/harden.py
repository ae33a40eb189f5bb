"""Issue 13: does a large ``register`` delay another client's poll? (bar: 100 ms)

The service runs on its own thread (as ``mccl controller`` does); one client registers a
ring AllGather schedule of ``--gpus`` GPUs (rail_optimized(S, 8, 8): 384 GPUs is a ~38 MiB
file), another polls every 10 ms on its own socket and records each reply's latency.
Reported: the poll latencies while the registration is in hand (median, p99, max, count),
the same with no registration (baseline), and how long the registration took.

    PYTHONPATH=src python benchmarks/harden.py --segments 6 --repeat 3
    PYTHONPATH=/path/to/older/src python benchmarks/harden.py ...   # the same against an older service
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import zmq

from mccl.control import ControlConfig, ControllerService, ScheduleManager
from mccl.control.protocol import decode, encode
from mccl.schedule import dumps_schedule
from mccl.synth import optimize
from mccl.topology import rail_optimized


def _socket(service: ControllerService) -> zmq.Socket:
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    if getattr(service, "secret", None) is not None:  # main before issue 13 had no authentication
        service.secret.make_client(socket)
    socket.connect(service.address)
    return socket


def _poll_latencies(service: ControllerService, until: threading.Event, seconds: float | None) -> list[float]:
    socket = _socket(service)
    latencies = []
    stop_at = None if seconds is None else time.monotonic() + seconds
    try:
        while not until.is_set() and (stop_at is None or time.monotonic() < stop_at):
            start = time.perf_counter()
            socket.send(encode("poll", communicator="other", rank=0, have={}))
            if not socket.poll(30_000):
                raise RuntimeError("a poll was not answered in 30 s")
            decode(socket.recv())
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
    finally:
        socket.close()
    return latencies


def run(segments: int) -> dict:
    topology = rail_optimized(segments, 8, 8)
    schedule = optimize(topology, "allgather", method="ring.nccl").schedule.with_meta(version=1)
    frame = encode("register", communicator="job", schedule=dumps_schedule(schedule))
    try:
        service = ControllerService(ScheduleManager(topology, ControlConfig()), "tcp://127.0.0.1:*",
                                    max_message_bytes=256 << 20).start()
    except TypeError:  # the service before issue 13 (PYTHONPATH=/work/main/src): no limits to set
        service = ControllerService(ScheduleManager(topology, ControlConfig()), "tcp://127.0.0.1:*").start()
    try:
        idle = _poll_latencies(service, threading.Event(), 1.0)
        done = threading.Event()
        result: dict = {}
        polls: list[float] = []
        poller = threading.Thread(target=lambda: polls.extend(_poll_latencies(service, done, None)))
        registrar = _socket(service)
        poller.start()
        time.sleep(0.2)
        start = time.perf_counter()
        registrar.send(frame)
        if not registrar.poll(600_000):
            raise RuntimeError("the registration was not answered")
        result["reply"] = decode(registrar.recv())["op"]
        result["register_s"] = time.perf_counter() - start
        done.set()
        poller.join()
        registrar.close()
    finally:
        service.stop()
    return {"mib": len(frame) / 2**20, "transfers": len(schedule.transfers), "idle": idle, "busy": polls, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.repeat):
        r = run(args.segments)
        busy = sorted(r["busy"])
        p99 = busy[min(len(busy) - 1, int(0.99 * len(busy)))]
        print(f"register {r['mib']:.1f} MiB ({r['transfers']} transfers): {r['reply']} in {r['register_s']:.2f} s; "
              f"polls meanwhile: n={len(busy)} median {statistics.median(busy) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
              f"max {busy[-1] * 1e3:.1f} ms; idle: median {statistics.median(r['idle']) * 1e3:.2f} ms, "
              f"max {max(r['idle']) * 1e3:.1f} ms")


if __name__ == "__main__":  # the service's helper process is spawned: guard the entry point
    main()
