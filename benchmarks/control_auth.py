"""What authentication costs: telemetry ingest over ZeroMQ with CURVE vs without (issue 13).

4 clients each submit ``--batches`` batches of 512 samples to one service; reported: samples/s
received by the service (median of ``--repeat`` runs per side, sides alternating), CPU seconds of
this process per 10⁶ samples (clients and service share it).

    PYTHONPATH=src python benchmarks/control_auth.py --batches 100 --repeat 3
    PYTHONPATH=/path/to/older/src python benchmarks/control_auth.py --plain-only   # an older service
"""

from __future__ import annotations

import argparse
import statistics
import time

from mccl.control import ControlConfig, ControllerClient, ControllerService, Sample, ScheduleManager
from mccl.synth import optimize
from mccl.topology import rail_optimized


def run(authenticate: bool, batches: int) -> tuple[float, float]:
    topology = rail_optimized(1, 2, 8)
    try:
        service = ControllerService(ScheduleManager(topology, ControlConfig(settle_collectives=0)),
                                    "tcp://127.0.0.1:*", authenticate=authenticate, max_ingest_backlog=1 << 20)
    except TypeError:  # the service before issue 13 (PYTHONPATH=/work/main/src): plain only
        service = ControllerService(ScheduleManager(topology, ControlConfig(settle_collectives=0)),
                                    "tcp://127.0.0.1:*")
    service.manager.register("job", optimize(topology, "allgather").schedule.with_meta(version=1))
    service.start()
    secret = getattr(service, "secret", None)
    clients = [ControllerClient(service.address, "job", rank, send_hwm=1 << 12,
                                **({"secret": secret} if secret is not None else {})) for rank in range(4)]
    samples = [Sample("inter", "job", i % 16, (i + 8) % 16, 10**7, 0.01, time.time(), 5 + i // 272)
               for i in range(512)]
    for client in clients:
        client.telemetry_ready(timeout_s=10.0)
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(batches):
        for client in clients:
            client.submit(samples)
    sent = sum(client.sent_samples for client in clients)
    deadline = time.monotonic() + 60
    while service.stats["samples"] < sent and time.monotonic() < deadline:
        time.sleep(0.002)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    received = service.stats["samples"]
    for client in clients:
        client.close()
    service.stop()
    return received / elapsed, cpu / received * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--plain-only", action="store_true", help="no CURVE side (an older service has none)")
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float]]] = {False: []} if args.plain_only else {False: [], True: []}
    for _ in range(args.repeat):
        for authenticate in results:
            results[authenticate].append(run(authenticate, args.batches))
    for authenticate, rows in results.items():
        print(f"{'CURVE' if authenticate else 'plain'}: {statistics.median(r[0] for r in rows):,.0f} samples/s, "
              f"{statistics.median(r[1] for r in rows):.2f} CPU s per 10^6 samples (runs: "
              + ", ".join(f"{r[0]:,.0f}" for r in rows) + ")")


if __name__ == "__main__":
    main()
