"""Benchmark of the controller: detection latency vs α, drift-test cost vs GPUs, telemetry ingest, live loop.

    .venv/bin/python benchmarks/control.py            # everything, 3 live demo runs
    .venv/bin/python benchmarks/control.py --quick    # fewer trials, sizes up to 256 GPUs, 1 demo run

1. Detection latency vs α (mccl-paper §3.2): the real ScheduleManager on
   rail_optimized(1,2,8) with the tree-packing schedule, fed rounds of telemetry
   (every overlay link once per round) with 5% Gaussian noise on every rate; at
   round 0 gpu0's NIC cable drops to Fail2's 50 Gbit/s (1/8). Reported: rounds until
   the schedule is flagged (median over trials), and false flags in 200 healthy
   rounds before the step (Γ = 0.2).
2. Drift-test cost per schedule at 16–512 GPUs (rail_optimized(S,H,8), NCCL ring
   AllGather, every link used): one-time profile (n_a, K_s, overlay map), and one
   check = measured capacities + Algorithm 1 (median).
3. Telemetry ingest: ScheduleManager.ingest in-process, and end to end over
   ZeroMQ (4 clients pushing 512-sample batches to one service on loopback; received
   and dropped counted by the service and the clients).
4. The live loop (``mccl demo``): detection, synthesis, issue times, algbw ratios.

Writes ``benchmarks/results/control_*.csv`` and ``control_detection.png``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.control import ControlConfig, ControllerClient, ControllerService, Sample, ScheduleManager
from mccl.control.drift import drift_test, measured_capacities, overlay_map, profile
from mccl.synth import optimize
from mccl.synth.ring import nccl_ring
from mccl.topology import rail_optimized

RESULTS = Path(__file__).resolve().parent / "results"
ALPHAS = (0.012, 0.05, 0.1, 0.3, 0.5, 1.0)


def telemetry_round(n: int, seq: int, rng: np.random.Generator, slow: bool, noise: float = 0.05,
                    communicator: str = "job") -> list[Sample]:
    half = n // 2
    out = []
    for i in range(n):
        rate = 10.0 * max(0.05, 1 + noise * rng.standard_normal())
        out.append(Sample("intra", communicator, i, -1, int(rate * 1.25e6), 1e-3, 0.0, seq))
        for j in range(n):
            if (i < half) != (j < half):
                rate = 10.0 * (0.125 if slow and 0 in (i, j) else 1.0) * max(0.05, 1 + noise * rng.standard_normal())
                out.append(Sample("inter", communicator, i, j, int(rate * 1.25e6), 1e-3, 0.0, seq))
    return out


def detection(trials: int) -> list[dict]:
    topology = rail_optimized(1, 2, 8)
    schedule = optimize(topology, "allgather").schedule.with_meta(version=1)
    rows = []
    for alpha in ALPHAS:
        latencies, false_flags = [], []
        for trial in range(trials):
            rng = np.random.default_rng(trial)
            manager = ScheduleManager(topology, ControlConfig(alpha=alpha, gamma=0.2, warmup=5, settle_collectives=0))
            manager.register("job", schedule)
            flags = 0
            for seq in range(1, 201):
                manager.ingest(telemetry_round(16, seq, rng, slow=False))
                if seq > 20:  # after the references settle
                    flags += sum(d.result.flagged for d in manager.check())
            false_flags.append(flags)
            for k in range(1, 2001):
                manager.ingest(telemetry_round(16, 200 + k, rng, slow=True))
                if any(d.result.flagged for d in manager.check()):
                    latencies.append(k)
                    break
        rows.append({"alpha": alpha, "rounds_to_detect_p50": statistics.median(latencies),
                     "rounds_to_detect_max": max(latencies), "false_flags_per_180_rounds": statistics.median(false_flags),
                     "trials": trials})
        print(f"α={alpha:<6} detection after {rows[-1]['rounds_to_detect_p50']:>5} rounds (p50), "
              f"max {rows[-1]['rounds_to_detect_max']}; false flags in 180 healthy rounds: "
              f"{rows[-1]['false_flags_per_180_rounds']}")
    return rows


def drift_cost(quick: bool) -> list[dict]:
    shapes = [(1, 2, 8), (1, 8, 8), (1, 16, 8), (2, 16, 8)] + ([] if quick else [(4, 16, 8)])
    rows = []
    for shape in shapes:
        topology = rail_optimized(*shape)
        schedule = nccl_ring(topology, "allgather")
        start = time.perf_counter()
        cut = profile(schedule, len(topology.links))
        mapping = overlay_map(schedule, topology)
        profile_s = time.perf_counter() - start
        n = schedule.n_ranks
        rng = np.random.default_rng(0)
        inter, intra = rng.uniform(0.5, 1.0, (n, n)), rng.uniform(0.5, 1.0, n)
        times = []
        for _ in range(50 if quick else 200):
            start = time.perf_counter()
            capacities = measured_capacities(mapping, inter, intra, topology.capacities_gbps)
            drift_test(cut, capacities, 0.2)
            times.append(time.perf_counter() - start)
        rows.append({"gpus": n, "links": len(topology.links), "transfers": len(schedule.transfers),
                     "profile_ms": profile_s * 1e3, "check_us_p50": statistics.median(times) * 1e6,
                     "drift_only_us_p50": _drift_only(cut, capacities)})
        print(f"{n:>4} GPUs, {len(topology.links):>5} links, {len(schedule.transfers):>8} transfers: profile "
              f"{rows[-1]['profile_ms']:.1f} ms once, check {rows[-1]['check_us_p50']:.1f} µs "
              f"(Algorithm 1 alone {rows[-1]['drift_only_us_p50']:.1f} µs)")
    return rows


def _drift_only(cut, capacities) -> float:
    times = []
    for _ in range(200):
        start = time.perf_counter()
        drift_test(cut, capacities, 0.2)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def ingest(quick: bool) -> list[dict]:
    topology = rail_optimized(1, 2, 8)
    schedule = optimize(topology, "allgather").schedule.with_meta(version=1)
    rng = np.random.default_rng(0)
    batch = telemetry_round(16, 10, rng, slow=False)  # 272 samples
    manager = ScheduleManager(topology, ControlConfig(settle_collectives=0))
    manager.register("job", schedule)
    rounds = 200 if quick else 1000
    start = time.perf_counter()
    for _ in range(rounds):
        manager.ingest(batch)
    local = rounds * len(batch) / (time.perf_counter() - start)
    print(f"ingest in-process: {local:,.0f} samples/s")
    rows = [{"path": "in-process ScheduleManager.ingest", "samples_per_s": local, "dropped": 0}]
    service = ControllerService(ScheduleManager(topology, ControlConfig(settle_collectives=0)), "tcp://127.0.0.1:*")
    service.manager.register("job", schedule)
    service.start()
    clients = [ControllerClient(service.address, "job", rank, send_hwm=64) for rank in range(4)]
    samples = telemetry_round(16, 10, rng, slow=False) * 2  # 544 samples
    samples = samples[:512]
    time.sleep(0.3)  # connect
    batches = 100 if quick else 400
    start = time.perf_counter()
    for _ in range(batches):
        for client in clients:
            client.submit(samples)
    sent = sum(client.sent_samples for client in clients)
    dropped = sum(client.dropped for client in clients)
    deadline = time.monotonic() + 30
    while service.stats["samples"] < sent and time.monotonic() < deadline:
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    received = service.stats["samples"]
    for client in clients:
        client.close()
    service.stop()
    print(f"ingest over ZeroMQ: {received / elapsed:,.0f} samples/s received ({received} of {sent + dropped} "
          f"offered, {dropped} dropped at the clients)")
    rows.append({"path": "ZeroMQ, 4 clients x 512-sample batches", "samples_per_s": received / elapsed,
                 "dropped": dropped})
    return rows


def live(runs: int) -> list[dict]:
    from mccl.experiments.demo import DemoConfig, run_demo

    rows = []
    for run in range(runs):
        report = run_demo(DemoConfig())
        rows.append({"run": run, "detection_ms": (report.detection_s or float("nan")) * 1e3,
                     "synthesis_ms": (report.synthesis_s or float("nan")) * 1e3,
                     "issued_ms": (report.issued_s or float("nan")) * 1e3,
                     "activated_ms": (report.activated_s or float("nan")) * 1e3,
                     "versions": report.records[-1].version,
                     "healthy_gbs": report.median_algbw("healthy"), "degraded_gbs": report.median_algbw("degraded"),
                     "recovered_gbs": report.median_algbw("recovered"),
                     "oob_ms": statistics.median([s.oob_s for s in report.swaps]) * 1e3 if report.swaps else None,
                     "all_correct": report.all_correct})
        print(rows[-1])
    return rows


def write(name: str, rows: list[dict]) -> None:
    write_csv(RESULTS / f"control_{name}.csv", rows)


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.2))
    axis.plot([r["alpha"] for r in rows], [r["rounds_to_detect_p50"] for r in rows], marker="o")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("EWMA α")
    axis.set_ylabel("telemetry rounds to detect Fail2")
    axis.set_title("Detection latency vs α (Γ = 0.2, 5% noise)")
    figure.tight_layout()
    figure.savefig(RESULTS / "control_detection.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    rows = detection(5 if args.quick else 20)
    write("detection", rows)
    plot(rows)
    write("drift_cost", drift_cost(args.quick))
    write("ingest", ingest(args.quick))
    write("live", live(1 if args.quick else 3))


if __name__ == "__main__":
    main()
