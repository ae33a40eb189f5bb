"""Issue 13: does a large ``register`` delay another client's poll? (bar: 100 ms)

Three processes, as in a job: the controller service (its own process, as ``mccl controller``
runs), a polling client (its own process: polls every 10 ms on its own socket and records
each reply's latency), and this process, which registers a ring AllGather schedule of
rail_optimized(S, 8, 8) (S = 6: 384 GPUs, a ~38 MiB file) ``--trials`` times, each a new
version of the same communicator, so every trial does the service's whole work (parse,
validate, activate). Reported: the poll latencies while a registration is in hand (p50,
p99, max over every trial's polls, and the median of the trials' maxima), the same with no
registration (baseline), the registration's wall time and the service process's CPU time
per registration, and the machine's load (``os.getloadavg``) before and after.

    PYTHONPATH=src python benchmarks/harden.py --segments 6 --trials 20 [--nice -10]
    PYTHONPATH=/path/to/older/src python benchmarks/harden.py ...   # the same against an older service
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from pathlib import Path

import zmq

from mccl.control import ControlConfig, ControllerService, ScheduleManager
from mccl.control.auth import as_secret
from mccl.control.protocol import decode, encode
from mccl.schedule import dumps_schedule
from mccl.synth import optimize
from mccl.topology import rail_optimized


def _socket(address: str, secret_hex: str | None) -> zmq.Socket:
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    if secret_hex is not None:
        as_secret(secret_hex).make_client(socket)
    socket.connect(address)
    return socket


def _serve(segments: int, ready, stop, nice: int) -> None:
    """The service process: serve until ``stop``; report (address, secret)."""
    os.nice(nice)
    topology = rail_optimized(segments, 8, 8)
    try:
        service = ControllerService(ScheduleManager(topology, ControlConfig()), "tcp://127.0.0.1:*",
                                    max_message_bytes=256 << 20).start()
    except TypeError:  # the service before issue 13: no limits to set
        service = ControllerService(ScheduleManager(topology, ControlConfig()), "tcp://127.0.0.1:*").start()
    secret = getattr(service, "secret", None)
    ready.put((service.address, None if secret is None else secret.hex))
    stop.wait()
    service.stop()


def _poll(address: str, secret_hex: str | None, stop, out, nice: int) -> None:
    """The polling client's process: (send time, latency) of every poll until ``stop``."""
    os.nice(nice)
    socket = _socket(address, secret_hex)
    polls = []
    while not stop.is_set():
        start = time.perf_counter()
        socket.send(encode("poll", communicator="other", rank=0, have={}))
        if not socket.poll(30_000):
            raise RuntimeError("a poll was not answered in 30 s")
        decode(socket.recv())
        polls.append((time.time(), time.perf_counter() - start))
        if len(polls) == 1:
            out.put("polling")
        time.sleep(0.01)
    out.put(polls)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(segments: int, trials: int, nice: int = 0) -> dict:
    topology = rail_optimized(segments, 8, 8)
    schedule = optimize(topology, "allgather", method="ring.nccl").schedule
    spawn = multiprocessing.get_context("spawn")
    ready, polls_out, stop_service, stop_polls = spawn.Queue(), spawn.Queue(), spawn.Event(), spawn.Event()
    server = spawn.Process(target=_serve, args=(segments, ready, stop_service, nice))  # (it spawns a parser process)
    server.start()
    address, secret_hex = ready.get(timeout=300)
    poller = spawn.Process(target=_poll, args=(address, secret_hex, stop_polls, polls_out, nice),
                           daemon=True)
    poller.start()
    if polls_out.get(timeout=300) != "polling":
        raise RuntimeError("the polling client did not start")
    registrar = _socket(address, secret_hex)
    load_before = os.getloadavg()
    windows, register_s, cpu_s, mib = [], [], [], 0.0
    try:
        time.sleep(3.0)  # the baseline: polls with no registration in hand
        idle_until = time.time()
        for trial in range(trials):
            frame = encode("register", communicator="job",
                           schedule=dumps_schedule(schedule.with_meta(version=trial + 1)))
            mib = len(frame) / 2**20
            cpu_before, start_wall, start = _cpu_s(server.pid), time.time(), time.perf_counter()
            registrar.send(frame)
            if not registrar.poll(600_000):
                raise RuntimeError("the registration was not answered")
            reply = decode(registrar.recv())
            if reply["op"] != "ok" or reply.get("version") != trial + 1:
                raise RuntimeError(f"registration {trial + 1} answered {reply}")
            register_s.append(time.perf_counter() - start)
            cpu_s.append(_cpu_s(server.pid) - cpu_before)
            windows.append((start_wall, time.time()))
            time.sleep(0.2)
        stop_polls.set()
        polls = polls_out.get(timeout=60)
    finally:
        stop_polls.set()
        stop_service.set()
        registrar.close()
        poller.join(timeout=10)
        server.join(timeout=30)
        for process in (poller, server):
            if process.is_alive():
                process.terminate()
    idle = [latency for sent, latency in polls if sent < idle_until]
    per_trial = [[latency for sent, latency in polls if begin <= sent <= end] for begin, end in windows]
    return {"mib": mib, "transfers": len(schedule.transfers), "idle": idle, "per_trial": per_trial,
            "register_s": register_s, "cpu_s": cpu_s, "load": (load_before, os.getloadavg())}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=6)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--nice", type=int, default=0,
                        help="niceness of the service and polling processes (negative needs root): on a shared, "
                             "overloaded machine, -10 approximates a controller that has its CPU share")
    args = parser.parse_args()
    r = run(args.segments, args.trials, args.nice)
    busy = [latency for trial in r["per_trial"] for latency in trial]
    maxima = [max(trial) for trial in r["per_trial"] if trial]
    ms = 1e3
    print(f"{args.trials} registrations of {r['mib']:.1f} MiB ({r['transfers']} transfers); "
          f"service and poller at nice {args.nice}; {os.cpu_count()} CPUs, load average {r['load'][0][0]:.1f} before, {r['load'][1][0]:.1f} after")
    print(f"register: median {statistics.median(r['register_s']):.2f} s wall, "
          f"{statistics.median(r['cpu_s']):.2f} s CPU of the service process")
    print(f"polls during registrations: n={len(busy)} p50 {_quantile(busy, 0.5) * ms:.1f} ms, "
          f"p99 {_quantile(busy, 0.99) * ms:.1f} ms, max {max(busy) * ms:.1f} ms; per-trial max: median "
          f"{statistics.median(maxima) * ms:.1f} ms, worst {max(maxima) * ms:.1f} ms; "
          f"trials with a poll > 100 ms: {sum(m > 0.1 for m in maxima)}/{len(maxima)}")
    print("per-trial max (ms, in order): " + " ".join(f"{m * ms:.0f}" for m in maxima))
    print(f"polls with nothing in hand: n={len(r['idle'])} p50 {_quantile(r['idle'], 0.5) * ms:.2f} ms, "
          f"p99 {_quantile(r['idle'], 0.99) * ms:.1f} ms, max {max(r['idle']) * ms:.1f} ms")


if __name__ == "__main__":  # the processes are spawned: guard the entry point
    main()
