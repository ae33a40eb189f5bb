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

Modes at scale (each runs only what it names; the default / ``--quick`` run above is unchanged):

    .venv/bin/python benchmarks/control.py --manager-warm --sizes 64,128,256,512
    .venv/bin/python benchmarks/control.py --controller-cpu --cpu-sizes 8,512 [--large-repeats 3]
    .venv/bin/python benchmarks/control.py --ingest-scale --ingest-gpus 512

5. ``--manager-warm``: AllToAll through the real ScheduleManager, fed the telemetry the runtime would
   emit for the active schedule's overlay links (:class:`FabricTelemetry`) on a fabric that goes
   healthy (registered schedule, version 1, no warm state) → Fail2 → healthy → Fail2; each
   re-synthesis (the manager's "synthesized" event, and its CPU) against a cold ``optimize`` on the
   same measured capacities, with the warm path the stats report (routes, restarted, repaired).
6. ``--controller-cpu``: CPU per flagged collective (ingest + check + warm synthesis + dispatch) for
   AllGather and AllToAll, the same chain started from a registered synthesis result.
7. ``--ingest-scale``: ``ScheduleManager.ingest`` for one 512-GPU AllToAll's telemetry per call.

Writes ``benchmarks/results/control_*.csv`` and ``control_detection.png``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import statistics
import time
from pathlib import Path

import numpy as np
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.control import ControlConfig, ControllerClient, ControllerService, Sample, ScheduleManager
from mccl.control.drift import drift_test, measured_capacities, overlay_map, profile
from mccl.control.prepared import prepare_update
from mccl.schedule import dumps_schedule, loads_schedule, schedule_binary_text
from mccl.synth import optimize
from mccl.synth.ring import nccl_ring
from mccl.topology import Topology, fail2, rail_optimized

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
    clients = [ControllerClient(service.address, "job", rank, send_hwm=64, secret=service.secret) for rank in range(4)]
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
    """The pacer demo (``mccl demo --fabric pacer``): detection and the reaction path per run."""
    from mccl.experiments.demo import DemoConfig, run_demo

    rows = []
    for run in range(runs):
        report = run_demo(DemoConfig.pacer())
        reaction = report.reaction("allgather")
        ms = {key: float("nan") if value is None else value * 1e3 for key, value in reaction.items()}.get

        rows.append({"run": run, "detection_ms": ms("detect_s"), "synthesis_ms": ms("synth_s"),
                     "issued_ms": ms("issue_s"), "activated_ms": ms("activation_s"),
                     "first_collective_ms": ms("detect_to_first_s"), "versions": report.records[-1].version,
                     "healthy_gbs": report.median_algbw("allgather", "healthy"),
                     "degraded_gbs": report.median_algbw("allgather", "degraded"),
                     "recovered_gbs": report.median_algbw("allgather", "recovered"),
                     "oob_ms": statistics.median([s.oob_s for s in report.swaps]) * 1e3 if report.swaps else None,
                     "all_correct": report.all_correct})
        print(rows[-1])
    return rows


# ---- the manager at scale: warm re-synthesis chains, CPU per flagged collective, ingest at 512 GPUs ----
def fabric_size_error(gpus: int) -> str | None:
    """Why ``fabric(gpus)`` has no shape for ``gpus`` (None when it has one): 8, or 8 per host on 2–32 hosts, or
    whole segments of 32 hosts."""
    hosts = gpus // 8
    if gpus == 8 or (gpus % 8 == 0 and hosts >= 2 and (hosts <= 32 or hosts % 32 == 0)):
        return None
    return f"no fabric for {gpus} GPUs: 8, or a multiple of 8 on 2–32 hosts, or of 256 beyond"


def fabric(gpus: int) -> Topology:
    """rail_optimized with 8 GPUs per host, one segment of up to 32 hosts (as benchmarks/synth_alltoall.py):
    8 GPUs = (1,2,4), 64 = (1,8,8), 128 = (1,16,8), 256 = (1,32,8), 512 = (2,32,8)."""
    if gpus == 8:
        return rail_optimized(1, 2, 4)
    hosts = gpus // 8
    return rail_optimized(1, hosts, 8) if hosts <= 32 else rail_optimized(hosts // 32, 32, 8)


class FabricTelemetry:
    """The samples the runtime emits for one schedule on a fabric whose true capacities are ``truth``.

    Per collective: one ``inter`` sample per rank pair across hosts that the schedule's transfers use,
    one per-peer ``intra`` sample per same-host pair it uses (the contract of :class:`mccl.telemetry.Sample`;
    the overlay links of :func:`mccl.control.drift.overlay_map`, the rank's aggregate left out). An overlay
    link delivers ``rate_gbps`` × the slowest ratio true/nominal capacity over the links its transfers
    cross (a path runs at its slowest link), times 1 + ``noise``·N(0, 1)."""

    def __init__(self, topology: Topology, schedule, communicator: str = "job", rate_gbps: float = 10.0,
                 noise: float = 0.0, seed: int = 0) -> None:
        self.nominal = topology.capacities_gbps
        self.communicator = communicator
        self.rate = rate_gbps
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        mapping = overlay_map(schedule, topology)
        n = mapping.n_ranks
        counts = np.diff(mapping.offsets)
        self.overlays = np.flatnonzero(counts[:n * n] > 0)  # rank pairs; not the aggregate injections
        self.owner = np.repeat(np.arange(len(counts)), counts)  # overlay of every (overlay, link) entry
        self.entry_links = mapping.links
        self.host = np.array([topology.node(gpu).host or "" for gpu in schedule.ranks])
        self.ranks = (self.overlays // n).tolist()
        self.peers = (self.overlays % n).tolist()
        self.kinds = np.where(self.host[self.overlays // n] == self.host[self.overlays % n], "intra", "inter").tolist()
        self.factors = np.ones(len(self.overlays))

    @classmethod
    def probe(cls, topology: Topology, schedule, communicator: str = "job") -> FabricTelemetry:
        """The start-up probe (mccl-paper §3.1): every rank pair, across hosts and on one host, so every
        overlay link a later version may use has its reference from the healthy fabric."""
        telemetry = cls(topology, schedule, communicator)
        hosts = telemetry.host
        n = len(hosts)
        i, j = np.nonzero(~np.eye(n, dtype=bool))
        telemetry.overlays = i * n + j
        telemetry.kinds = np.where(hosts[i] == hosts[j], "intra", "inter").tolist()
        telemetry.ranks = i.tolist()
        telemetry.peers = j.tolist()
        telemetry.factors = np.ones(len(telemetry.overlays))
        return telemetry

    def set_truth(self, truth: Topology) -> None:
        ratio = truth.capacities_gbps[self.entry_links] / self.nominal[self.entry_links]
        worst = np.ones(int(self.owner.max()) + 1 if len(self.owner) else 0)
        np.minimum.at(worst, self.owner, ratio)
        self.factors = worst[self.overlays]

    def round(self, seq: int, seconds: float = 0.01) -> list[Sample]:
        rates = self.rate * self.factors
        if self.noise:
            rates = rates * np.maximum(0.05, 1 + self.noise * self.rng.standard_normal(len(rates)))
        nbytes = (rates * (1e9 / 8 * seconds)).astype(np.int64).tolist()
        comm = self.communicator
        return [Sample(kind, comm, rank, peer, b, seconds, 0.0, seq)
                for kind, rank, peer, b in zip(self.kinds, self.ranks, self.peers, nbytes, strict=True)]


class _Recorder:
    """``optimize`` as the manager's synthesizer, recording what each call got and cost."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, measured, collective, ranks, *, previous=None, method=None, options=None):
        wall, cpu = time.perf_counter(), time.process_time()
        result = optimize(measured, collective, ranks, previous=previous, method=method, options=options)
        self.calls.append({"topology": measured, "ranks": ranks, "previous": type(previous).__name__,
                           "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "result": result})
        return result


def _warm_path(result) -> str:
    warm = getattr(result.stats, "warm", None)
    if warm is not None:  # AllToAll
        return "repaired" if warm.repaired else "restarted" if warm.restarted else (
            "routes" if warm.warm_columns else "cold")
    repair = getattr(result.stats, "warm_repair", None)  # tree packing
    return "repaired" if repair else "warm" if repair is not None else "?"


class Chain:
    """The real ScheduleManager on ``topology`` running ``collective``: a registered healthy schedule
    (version 1), then the fabric's truth changes phase by phase; each phase feeds telemetry of the
    active schedule until the manager is allowed to judge it, and one step re-synthesizes.

    α = 1 (no smoothing, no noise): the first degraded collective moves the measured topology all the
    way, so every re-synthesis sees exactly Fail2's 50 Gbit/s or the healthy fabric."""

    def __init__(self, topology: Topology, collective: str, registered, result=None) -> None:
        self.topology = topology
        self.recorder = _Recorder()
        self.manager = ScheduleManager(topology, ControlConfig(alpha=1.0, gamma=0.2, warmup=1, settle_collectives=1),
                                       synthesize=self.recorder)
        self.collective = collective
        self.allow_unflagged = False  # controller_cpu sets it: a phase the drift test does not flag is skipped
        self.manager.register("job", registered, result=result)
        self.telemetry = FabricTelemetry.probe(topology, registered)
        self.version = 1
        self.seq = 0
        self.feed(topology, 2)  # seq 1 ignored (start-up), seq 2 learns the references of every overlay link
        self.telemetry = FabricTelemetry(topology, registered)

    def feed(self, truth: Topology, rounds: int) -> float:
        """Telemetry of ``rounds`` collectives; returns the CPU seconds of the last round's ingest."""
        self.telemetry.set_truth(truth)
        cpu = 0.0
        for _ in range(rounds):
            self.seq += 1
            batch = self.telemetry.round(self.seq)
            start = time.process_time()
            self.manager.ingest(batch)
            cpu = time.process_time() - start
        return cpu

    def phase(self, truth: Topology) -> dict:
        """The fabric becomes ``truth``: one collective of telemetry (the one before has been judged
        already), then the step that flags it, times per stage (CPU), the issued version."""
        self.feed(truth, 1)  # the collective the active version must have run before it is judged
        self.telemetry.set_truth(truth)
        self.seq += 1
        batch = self.telemetry.round(self.seq)
        calls = len(self.recorder.calls)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        self.manager.ingest(batch)
        cpu1 = time.process_time()
        decisions = [d for d in self.manager.check() if d.result.flagged]
        cpu2 = time.process_time()
        issued = [self.manager.reoptimize(d) for d in decisions]
        cpu3, wall3 = time.process_time(), time.perf_counter()
        if not decisions and self.allow_unflagged:
            return None  # e.g. a repair of a link the active schedule barely loads: unobservable
        if len(decisions) != 1 or issued[0] is None or len(self.recorder.calls) != calls + 1:
            raise RuntimeError(f"expected one flagged schedule re-synthesized and issued, got {len(decisions)} "
                               f"flagged, events {[e.kind for e in self.manager.events[-4:]]}")
        call = self.recorder.calls[-1]
        cpu4 = time.process_time()
        self.manager.latest("job", self.collective)  # the ranks' first fetch encodes the schedule text
        text_cpu = time.process_time() - cpu4
        synthesized = [e for e in self.manager.events if e.kind == "synthesized"][-1]
        result = self.manager.active_result("job", self.collective)
        self.version = result.schedule.meta.version
        self.telemetry = FabricTelemetry(self.topology, result.schedule)
        return {"samples_per_collective": len(batch), "ingest_cpu_s": cpu1 - cpu0, "check_cpu_s": cpu2 - cpu1,
                "synth_cpu_s": call["cpu"], "synth_wall_s": call["wall"], "event_s": synthesized.value,
                "dispatch_cpu_s": cpu3 - cpu2 - call["cpu"], "total_cpu_s": cpu3 - cpu0, "total_wall_s": wall3 - wall0,
                "text_cpu_s": text_cpu,
                "previous": call["previous"], "path": _warm_path(call["result"]), "version": self.version,
                "achieved_gbs": result.achieved_gbs, "bound_gbs": result.bound_gbs, "digest": schedule_digest(result.schedule),
                "measured": call["topology"], "result": call["result"]}


def schedule_digest(schedule) -> str:
    """SHA-1 of a schedule's chunk and transfer columns (outside the timings): the same digest before and
    after a change that must not change results means the very same schedule was issued."""
    digest = hashlib.sha1()
    for array in (schedule.chunks.source, schedule.chunks.destination, schedule.chunks.fraction,
                  schedule.transfers.chunk, schedule.transfers.sender, schedule.transfers.receiver,
                  schedule.transfers.step, schedule.transfers.op, schedule.transfers.route_offsets,
                  schedule.transfers.route_links):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def _cold(measured: Topology, collective: str) -> dict:
    """A cold ``optimize`` on the same measured capacities."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = optimize(measured, collective)
    return {"cold_wall_s": time.perf_counter() - wall, "cold_cpu_s": time.process_time() - cpu,
            "cold_gbs": result.achieved_gbs, "cold_bound_gbs": result.bound_gbs}


PHASES = (("Fail2", True), ("healthy", False), ("Fail2", True))
STEP_NAMES = ("v1 -> Fail2 v2", "v2 -> healthy v3", "v3 -> Fail2 v4")


def _warm_up() -> None:
    """First calls in a process pay for imports and compilation (numba's cache loads included); keep them
    out of the timings: a long-lived controller has made and dispatched warm updates before."""
    topology = rail_optimized(1, 2, 8)
    for collective in ("alltoall", "allgather"):
        previous = optimize(topology, collective)
        update = optimize(fail2(topology), collective, previous=previous)
        prepare_update(previous.schedule, update, topology)


def manager_warm(sizes: list[int], repeats: int) -> list[dict]:
    """AllToAll through the manager: registered healthy (v1) → Fail2 → healthy → Fail2 (see module docstring);
    each re-synthesis against a cold ``optimize`` on the same measured capacities, right after it."""
    _warm_up()
    rows = []
    print(f"{'GPUs':>5} {'step':>17} {'previous':>16} {'path':>9} {'event s':>8} {'warm CPU':>8} "
          f"{'cold s':>7} {'cold CPU':>8} {'cold/event':>10} {'cold/warm CPU':>13} {'GB/s':>6} {'cold GB/s':>9} "
          f"{'reps':>4}", flush=True)
    for gpus in sizes:
        topology = fabric(gpus)
        faulty = fail2(topology)
        registered = optimize(topology, "alltoall").schedule.with_meta(version=1)
        runs: list[list[dict]] = [[] for _ in PHASES]
        for _ in range(repeats if gpus < 512 else 1):
            chain = Chain(topology, "alltoall", registered)
            for index, (_, is_faulty) in enumerate(PHASES):
                step = chain.phase(faulty if is_faulty else topology)
                measured = step.pop("measured")
                step.pop("result")
                runs[index].append({**step, **_cold(measured, "alltoall")})
        for label, steps in zip(STEP_NAMES, runs, strict=True):
            row = {"gpus": gpus, "step": label, "repeats": len(steps), "previous": steps[-1]["previous"],
                   "paths": "/".join(sorted({s["path"] for s in steps}))}
            for key in ("event_s", "synth_wall_s", "synth_cpu_s", "total_cpu_s", "cold_wall_s", "cold_cpu_s",
                        "achieved_gbs", "cold_gbs", "cold_bound_gbs"):
                row[key] = statistics.median(s[key] for s in steps)
            row["cold_over_event"] = statistics.median(s["cold_wall_s"] / s["event_s"] for s in steps)
            row["cold_over_warm_cpu"] = statistics.median(s["cold_cpu_s"] / s["synth_cpu_s"] for s in steps)
            rows.append(row)
            print(f"{gpus:>5} {label:>17} {row['previous']:>16} {row['paths']:>9} {row['event_s']:>8.3f} "
                  f"{row['synth_cpu_s']:>8.3f} {row['cold_wall_s']:>7.3f} {row['cold_cpu_s']:>8.3f} "
                  f"{row['cold_over_event']:>9.1f}x {row['cold_over_warm_cpu']:>12.1f}x {row['achieved_gbs']:>6.2f} "
                  f"{row['cold_gbs']:>9.2f} {len(steps):>4}", flush=True)
    return rows


def source_fingerprint() -> str:
    """SHA-1 (12 hex digits) of the imported mccl's ``synth``, ``schedule`` and ``topology`` sources: what
    a cold synthesis depends on. Why: a cached healthy result made by other code is not what this code
    would register — a pickle made before the cold lowering grouped transfers by chunk gave the first
    AllGather Fail2 step at 512 GPUs 73 % new transfers and 2.2 s instead of ~5 % (2026-12-01, sixth
    session), silently. So the cache file names the code that made it."""
    import mccl

    root = Path(mccl.__file__).resolve().parent
    digest = hashlib.sha1()
    for package in ("synth", "schedule", "topology"):
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _healthy_result(topology: Topology, collective: str, gpus: int, cache: Path | None):
    """The cold healthy synthesis the chain starts from (not measured); with ``cache``, pickled there
    once and read back by later runs of the same code (:func:`source_fingerprint` in the name; a cold
    512-GPU tree packing is 13–70 s CPU)."""
    path = cache / f"healthy-{collective}-{gpus}-{source_fingerprint()}.pkl" if cache is not None else None
    if path is not None and path.exists():
        with path.open("rb") as handle:
            return pickle.load(handle)
    result = optimize(topology, collective)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            pickle.dump(result, handle)
    return result


def controller_cpu(sizes: list[int], collectives: list[str], repeats: int, cache: Path | None = None,
                   large_repeats: int = 1, json_rows: bool = False) -> list[dict]:
    """CPU per flagged collective: ingest of its samples (EWMA) + check (measured capacities, Algorithm 1)
    + warm synthesis + dispatch (validation, overlay map, cut profile, schedule text). The healthy
    schedule is registered with its synthesis result (as if the controller had made it), so every step
    of the chain healthy → Fail2 → healthy → Fail2 is warm from solver state (the steady state)."""
    _warm_up()
    rows = []
    print(f"{'GPUs':>5} {'collective':>10} {'step':>10} {'path':>9} {'samples':>8} {'ingest ms':>9} {'check ms':>8} "
          f"{'synth ms':>9} {'dispatch ms':>11} {'total CPU ms':>12} {'wall ms':>8} {'text ms':>8}", flush=True)
    for gpus in sizes:
        topology = fabric(gpus)
        faulty = fail2(topology)
        for collective in collectives:
            synthesized = _healthy_result(topology, collective, gpus, cache).with_version(1)
            per_step: dict[str, list[dict]] = {}
            for _ in range(repeats if gpus <= 64 else large_repeats):
                chain = Chain(topology, collective, synthesized.schedule, result=synthesized)
                chain.allow_unflagged = True
                for index, (name, is_faulty) in enumerate(PHASES):
                    step = chain.phase(faulty if is_faulty else topology)
                    if step is None:
                        print(f"{gpus:>5} {collective:>10} {index + 1}:{name:<8} not flagged (no re-synthesis)", flush=True)
                        continue
                    step.pop("measured")
                    step.pop("result")
                    per_step.setdefault(f"{index + 1}:{name}", []).append(step)
            for label, steps in per_step.items():
                row = {"gpus": gpus, "collective": collective, "step": label, "repeats": len(steps),
                       "path": steps[-1]["path"], "samples_per_collective": steps[-1]["samples_per_collective"]}
                for key in ("ingest_cpu_s", "check_cpu_s", "synth_cpu_s", "dispatch_cpu_s", "total_cpu_s",
                            "total_wall_s", "text_cpu_s"):
                    row[key] = statistics.median(s[key] for s in steps)
                row["total_cpu_s_each"] = " ".join(f"{s['total_cpu_s']:.4f}" for s in steps)
                for key in ("achieved_gbs", "bound_gbs", "digest"):  # every chain issues the same schedule
                    row[key] = "/".join(sorted({str(s[key]) for s in steps}))
                rows.append(row)
                if json_rows:  # for controller_ab.py, which runs chains in fresh interpreters
                    print("ROW " + json.dumps(row), flush=True)
                print(f"{gpus:>5} {collective:>10} {label:>10} {row['path']:>9} {row['samples_per_collective']:>8} "
                      f"{row['ingest_cpu_s'] * 1e3:>9.2f} {row['check_cpu_s'] * 1e3:>8.2f} "
                      f"{row['synth_cpu_s'] * 1e3:>9.2f} {row['dispatch_cpu_s'] * 1e3:>11.2f} "
                      f"{row['total_cpu_s'] * 1e3:>12.2f} {row['total_wall_s'] * 1e3:>8.2f} "
                      f"{row['text_cpu_s'] * 1e3:>8.1f}", flush=True)
    return rows


def ingest_scale(gpus: int, rounds: int) -> list[dict]:
    """``ScheduleManager.ingest`` for a job of ``gpus`` ranks: one AllToAll's telemetry per round."""
    topology = fabric(gpus)
    schedule = optimize(topology, "alltoall").schedule.with_meta(version=1)
    telemetry = FabricTelemetry(topology, schedule, noise=0.05)
    manager = ScheduleManager(topology, ControlConfig(settle_collectives=0))
    manager.register("job", schedule)
    rows = []
    for seq in range(1, rounds + 1):
        batch = telemetry.round(seq)
        wall, cpu = time.perf_counter(), time.process_time()
        taken = manager.ingest(batch)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rows.append({"gpus": gpus, "round": seq, "samples": len(batch), "taken": taken,
                     "samples_per_s_wall": len(batch) / wall, "samples_per_s_cpu": len(batch) / cpu})
    print(f"ingest, {gpus}-GPU AllToAll job ({rows[0]['samples']:,} samples per collective, {rounds} collectives): "
          f"{statistics.median(r['samples_per_s_wall'] for r in rows):,.0f} samples/s wall, "
          f"{statistics.median(r['samples_per_s_cpu'] for r in rows):,.0f} per CPU second (medians)")
    return rows


def serialize_cost(gpus: int, collectives: list[str], repeats: int, cache: Path | None) -> list[dict]:
    """The schedule the ranks fetch, encoded and decoded: the JSON file against the binary one in its
    text form (what the controller serves with ``schedule_format="binary"``), same schedule, same run;
    CPU seconds, medians of ``repeats``."""
    topology = fabric(gpus)
    rows = []
    for collective in collectives:
        schedule = _healthy_result(topology, collective, gpus, cache).schedule
        row: dict = {"gpus": gpus, "collective": collective, "transfers": len(schedule.transfers),
                     "route_hops": len(schedule.transfers.route_links), "repeats": repeats}
        for name, encode in (("json", dumps_schedule), ("binary", schedule_binary_text)):
            encodes, decodes = [], []
            for _ in range(repeats):
                cpu = time.process_time()
                text = encode(schedule)
                encodes.append(time.process_time() - cpu)
                cpu = time.process_time()
                back = loads_schedule(text)
                decodes.append(time.process_time() - cpu)
            if back.transfers != schedule.transfers:
                raise RuntimeError(f"{name} round trip changed the schedule")
            row[f"{name}_bytes"] = len(text)
            row[f"{name}_encode_cpu_s"] = statistics.median(encodes)
            row[f"{name}_decode_cpu_s"] = statistics.median(decodes)
            del text, back
        row["encode_ratio"] = row["json_encode_cpu_s"] / row["binary_encode_cpu_s"]
        row["decode_ratio"] = row["json_decode_cpu_s"] / row["binary_decode_cpu_s"]
        rows.append(row)
        print(f"{gpus} GPUs {collective}: {row['transfers']:,} transfers; JSON {row['json_bytes'] / 2**20:.1f} MiB, "
              f"encode {row['json_encode_cpu_s']:.3f} s, decode {row['json_decode_cpu_s']:.3f} s; binary (text form) "
              f"{row['binary_bytes'] / 2**20:.1f} MiB, encode {row['binary_encode_cpu_s']:.3f} s, decode "
              f"{row['binary_decode_cpu_s']:.3f} s; encode {row['encode_ratio']:.1f}x, decode {row['decode_ratio']:.1f}x "
              f"cheaper", flush=True)
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
    parser.add_argument("--manager-warm", action="store_true",
                        help="only mode 5: AllToAll warm re-synthesis through the manager vs cold (--sizes)")
    parser.add_argument("--controller-cpu", action="store_true",
                        help="only mode 6: controller CPU per flagged collective (--cpu-sizes, --collectives)")
    parser.add_argument("--ingest-scale", action="store_true",
                        help="only mode 7: ScheduleManager.ingest for a 512-GPU AllToAll job (--ingest-gpus)")
    parser.add_argument("--sizes", default="64,128,256,512", help="GPUs for --manager-warm")
    parser.add_argument("--warm-repeats", type=int, default=3, help="chains per size for --manager-warm "
                        "below 512 GPUs (one at 512)")
    parser.add_argument("--cpu-sizes", default="8,512", help="GPUs for --controller-cpu")
    parser.add_argument("--collectives", default="allgather,alltoall", help="for --controller-cpu")
    parser.add_argument("--repeats", type=int, default=9, help="chains per collective for --controller-cpu "
                        "up to 64 GPUs (above: --large-repeats)")
    parser.add_argument("--large-repeats", type=int, default=1, help="chains per collective for --controller-cpu "
                        "above 64 GPUs (medians reported; each chain's total in total_cpu_s_each)")
    parser.add_argument("--json-rows", action="store_true", help="--controller-cpu: also print each row as "
                        "'ROW <json>' (benchmarks/controller_ab.py reads them)")
    parser.add_argument("--cache", type=Path, default=None, help="--controller-cpu: keep the cold healthy "
                        "syntheses the chains start from in this folder (pickled, named by the code that made "
                        "them: source_fingerprint(); not part of the figures)")
    parser.add_argument("--cpu-csv", default="cpu_per_flag", help="--controller-cpu: results/control_NAME.csv (empty: none)")
    parser.add_argument("--serialize", action="store_true",
                        help="the schedule file the ranks fetch: JSON vs binary encode/decode CPU at --ingest-gpus "
                             "(collectives from --collectives, the healthy syntheses from --cache)")
    parser.add_argument("--ingest-gpus", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5, help="collectives of telemetry for --ingest-scale")
    args = parser.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))

    def ints(text: str) -> list[int]:
        return [int(item) for item in text.split(",") if item]

    if args.repeats < 1 or args.large_repeats < 1:
        parser.error(f"--repeats and --large-repeats must be at least 1, got {args.repeats} and {args.large_repeats}")
    bad_sizes = [error for gpus in ints(args.cpu_sizes) if (error := fabric_size_error(gpus))]
    if args.controller_cpu and bad_sizes:
        parser.error(f"--cpu-sizes: {bad_sizes[0]}")
    scale = args.manager_warm or args.controller_cpu or args.ingest_scale or args.serialize
    if args.serialize:
        write("serialize", serialize_cost(args.ingest_gpus, args.collectives.split(","), args.repeats, args.cache))
    if args.manager_warm:
        write("manager_warm", manager_warm(ints(args.sizes), args.warm_repeats))
    if args.controller_cpu:
        cpu_rows = controller_cpu(ints(args.cpu_sizes), args.collectives.split(","), args.repeats, args.cache,
                                  args.large_repeats, args.json_rows)
        if args.cpu_csv:
            write(args.cpu_csv, cpu_rows)
    if args.ingest_scale:
        write("ingest_scale", ingest_scale(args.ingest_gpus, args.rounds))
    if scale:
        return
    rows = detection(5 if args.quick else 20)
    write("detection", rows)
    plot(rows)
    write("drift_cost", drift_cost(args.quick))
    write("ingest", ingest(args.quick))
    write("live", live(1 if args.quick else 3))

if __name__ == "__main__":
    main()
