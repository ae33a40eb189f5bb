"""Benchmark of the live loop on the kernel-emulated fabric (needs root; see mccl.experiments.netemu).

    PYTHONPATH=src .venv/bin/python benchmarks/netemu.py            # 3 loop runs + the fresh references
    PYTHONPATH=src .venv/bin/python benchmarks/netemu.py --runs 1   # quicker
    PYTHONPATH=src .venv/bin/python benchmarks/netemu.py --alpha 0.15 --gamma 0.3 --alpha-level 0 --fresh-repeats 0 --tag _a015
    PYTHONPATH=src .venv/bin/python benchmarks/netemu.py --runs 3 --fresh-repeats 0 --overhead-repeats 10 --tag _v2
    PYTHONPATH=src .venv/bin/python benchmarks/netemu.py --runs 0 --fresh-repeats 0 --nic-util-repeats 6 --tag _util20

Per loop run (``run_netemu_demo``, 2 hosts × 4 ranks, NICs 400 Gbit/s / 20000 = 20 Mbit/s, rank 0's
NIC halved both ways after 6 iterations, restored once every stream ran ``--after-swap`` (7) iterations on the
fault's new version, or after ``--max-degraded`` (18)). Why 7, not the demo's 3: path samples are attributed to a
version by sequence number, ``settle`` (3) collectives after its issue, then its references are learned over
``warmup`` (3) collectives; with 3 the repair came inside that window in 3 of the 4 AllToAll runs of the
seventh session (the version had run 3–4 collectives), so it learned its references partly or wholly on the
repaired fabric: the repaired NICs read 1.33–1.35x their reference, or no jump at all (no swap back in that
run), against 1.7–2.1x in the run whose version had run 6 collectives (replayed, ``netemu_replay.py``): for AllGather and
AllToAll, median algbw healthy / degraded (the version the fault hit) / recovered (the last version
of the fault) / restored; the controller's model (its "issued" achieved throughput, / scale ×
goodput) against the measured algbw for every version; swaps per fabric change; detection (ms and
collectives after the change) and the reaction path of Fig. 13(b): synthesis, dispatch (issued → rank 0's
client has it), swap (staging → agreement), activation (detection → agreed), the wait for the collectives
in flight, detection → first collective on the new version; telemetry error:
rank 0's inter-host samples of a collective (receive side: the paths into rank 0, through its NIC's
downlink), summed over the union of their windows, against the shaped goodput of its NIC (20 or 10
Mbit/s × 1448/1514). ``benchmarks/netemu_telemetry.py``: the same error outside the loop, with the
NIC-busy fraction next to it.

Fresh references (same fabric, no controller, no swaps, telemetry on as in the loop so that both run one
executor driver): the healthy schedule on the healthy fabric,
the healthy schedule on the degraded fabric, and the schedule synthesized for the degraded topology
(``optimize`` on the nominal topology with gpu0's NIC at ``fault_factor``) started fresh on it —
the bar "recovered ≥ 80 % of the re-synthesized schedule started fresh".

``--nic-util-repeats N``: how busy rank 0's NIC is during a healthy collective (its htb byte counter
around each call ÷ the shaped rate × the slowest rank's time).

``--overhead-repeats N``: telemetry on vs off, N collectives each, alternating, healthy fabric and
schedules: median wall time (slowest rank) and rank 0's CPU time per collective, as on/off ratios.

``--dump DIR``: each loop run's report pickled (records, the controller's events, every rank's samples), for
``benchmarks/netemu_replay.py``, which replays the samples through this tree's controller offline.

Writes ``benchmarks/results/netemu_runs.csv``, ``netemu_versions.csv``, ``netemu_fresh.csv`` and the
timeline PNG of the first run.
"""

from __future__ import annotations

import argparse
import functools
import pickle
import statistics
import sys
import time
from pathlib import Path

from netemu_common import htb_sent_bytes, timed_collective  # noqa: E402  (benchmarks/ is on sys.path)
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.experiments.netemu import EmulatedFabric, FabricPlan, unsupported_reason
from mccl.experiments.netemu.demo import NetemuConfig, _synth_options, run_netemu_demo
from mccl.experiments.netemu.fabric import shape_nic
from mccl.experiments.netemu.present import plot_timeline
from mccl.experiments.netemu.ranks import run_ranks_in_fabric
from mccl.experiments.netemu.report import NetemuReport
from mccl.experiments.netemu.shaping import GOODPUT

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("allgather", "alltoall")


def telemetry_error(report: NetemuReport, rank: int = 0, collective: str | None = None) -> dict[str, float | None]:
    """Median over collectives (of ``collective``, or all) of (rank's inter bytes / union of its inter windows)
    / shaped goodput − 1, per phase (healthy: the healthy NIC rate; degraded: the halved one)."""
    by_seq: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    for kind, sample_kind, _peer, nbytes, seconds, end, seq in report.telemetry.get(rank, []):
        if sample_kind == "inter" and seconds > 0 and collective in (None, kind):
            by_seq.setdefault((kind, seq), []).append((end - seconds, end, nbytes))
    phase_of = {(r.kind, r.seq): r.phase for r in report.records}
    factor = report.config["fault_factor"]
    errors: dict[str, list[float]] = {"healthy": [], "degraded": []}
    for key, windows in by_seq.items():
        phase = phase_of.get(key)
        if phase not in errors:
            continue
        windows.sort()
        union, start, end = 0.0, windows[0][0], windows[0][1]
        for s, e, _ in windows[1:]:
            if s > end:
                union, start, end = union + end - start, s, e
            else:
                end = max(end, e)
        union += end - start
        rate_mbit = sum(b for _, _, b in windows) * 8 / union / 1e6
        shaped = report.nic_mbit * (factor if phase == "degraded" else 1.0) * GOODPUT
        errors[phase].append(rate_mbit / shaped - 1)
    return {phase: statistics.median(values) if values else None for phase, values in errors.items()}


def loop_run(index: int, config: NetemuConfig) -> tuple[dict, list[dict], NetemuReport]:
    report = run_netemu_demo(config)
    row: dict = {"run": index, "wall_s": round(report.wall_s, 1), "startup_s": round(report.startup_s, 1),
                 "all_correct": report.all_correct,
                 "torch_checked": sum(r.torch_checked for r in report.records)}
    versions = []
    for kind in KINDS:
        for phase in ("healthy", "degraded", "recovered", "restored"):
            value = report.median_algbw(kind, phase)
            row[f"{kind}_{phase}_MBps"] = None if value is None else round(value * 1e3, 3)
        row[f"{kind}_swaps_fault"] = report.swaps_in(kind, "degraded")
        row[f"{kind}_swaps_repair"] = report.swaps_in(kind, "restored")
        row[f"{kind}_swaps_healthy"] = len(report.phase_versions(kind, "healthy")) - 1
        for phase in ("degraded", "restored"):
            reaction = report.reaction(kind, phase)
            tag = "fault" if phase == "degraded" else "repair"
            for key in ("detect_s", "detect_collectives", "synth_s", "issue_s", "dispatch_s", "swap_total_s", "oob_s",
                        "activation_s", "inflight_wait_s", "detect_to_first_s"):
                value = reaction[key]
                row[f"{kind}_{tag}_{key}"] = None if value is None else round(value * (1 if "collectives" in key else 1e3), 2)
        for version in sorted({r.version for r in report.stream(kind)}):
            for phase in ("healthy", "degraded", "restored"):
                measured = report.measured(kind, version, phase)
                if measured is None:
                    continue
                model = report.predicted(kind, version)
                versions.append({"run": index, "collective": kind, "version": version, "phase": phase,
                                 "measured_MBps": round(measured * 1e3, 3),
                                 "model_MBps": None if model is None else round(model * 1e3, 3),
                                 "measured_over_model": None if not model else round(measured / model, 3)})
    for collective in KINDS:
        for phase, value in telemetry_error(report, collective=collective).items():
            row[f"{collective}_telemetry_err_{phase}"] = None if value is None else round(value, 3)
    return row, versions, report


def guard_events(index: int, report: NetemuReport) -> list[dict]:
    """The controller's flags and decisions of one run (the guard's r, "explained"/"unexplained", is in
    the text of its issued / kept events), timed from the fault (s)."""
    return [{"run": index, "t_from_fault_s": round(event["time"] - report.degraded_at, 3), "event": event["kind"],
             "collective": event["collective"], "version": event["version"], "value": round(event["value"], 4),
             "text": event.get("text", "")}
            for event in report.events if event["kind"] in ("flagged", "issued", "kept", "aborted")]


def _fresh_rank(rank: int, world: int, plan, texts: dict, config: NetemuConfig, repeats: int,
                degrade: bool) -> dict:  # noqa: ANN001 - FabricPlan
    """Each schedule for ``repeats`` collectives (no controller, no swaps); the slowest rank's time is
    taken by the caller. ``degrade``: rank 0 halves its NIC first. Telemetry on, as in the loop (a sink that
    keeps the samples, the loop's flush interval): a metered communicator runs AllToAll on the eager driver,
    an unmetered one on the exchange driver, so a fresh reference without telemetry times another driver
    than the loop it is the bar for (closing note of the fourth session)."""
    import torch
    import torch.distributed as dist

    from mccl.experiments.netemu.demo import _known_answer, _source
    from mccl.runtime import MemorySink, TelemetryConfig, init
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    if degrade and rank == 0:
        shape_nic(plan, config.fault_rank, config.fault_factor)
    topology = parse_topology(config.topology_spec)
    out: dict = {}
    for name, text in texts.items():
        schedule = loads_schedule(text)
        kind = schedule.collective.value
        comm = init(dist.group.WORLD, None, topology=topology, schedules=[schedule], hot_swap=False, name=name,
                    sink=MemorySink(), telemetry=TelemetryConfig(flush_interval_s=0.02))
        times = []
        for index in range(repeats):
            sources = [_source(kind, config, world, peer, index, torch) for peer in range(world)]
            output = torch.empty(sources[rank].numel() * (world if kind == "allgather" else 1), dtype=torch.int32)
            dist.barrier()
            start = time.perf_counter()
            if kind == "allgather":
                comm.all_gather_into_tensor(output, sources[rank])
            else:
                comm.all_to_all_single(output, sources[rank])
            times.append(time.perf_counter() - start)
            if not torch.equal(output, _known_answer(kind, sources, rank, world, torch)):
                raise RuntimeError(f"{name}: wrong output on rank {rank}")
        comm.close()
        out[name] = times
    return out


def _overhead_rank(rank: int, world: int, plan, texts: dict, config: NetemuConfig, repeats: int) -> dict:  # noqa: ANN001
    """Each schedule on two communicators, telemetry on (a sink that keeps the samples) and off, called
    alternately (on, off, on, ...) so that both see the same load; per call the wall time and this rank's
    CPU time (``process_time``: the executor's own cost, which wall time on a loaded machine hides)."""
    import torch
    import torch.distributed as dist

    from mccl.experiments.netemu.demo import _source
    from mccl.runtime import MemorySink, TelemetryConfig, init
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    topology = parse_topology(config.topology_spec)
    out: dict = {}
    for name, text in texts.items():
        kind = loads_schedule(text).collective.value
        comms = {"on": init(dist.group.WORLD, None, topology=topology, schedules=[loads_schedule(text)], hot_swap=False,
                            name=f"{name}-on", sink=MemorySink(), telemetry=TelemetryConfig(flush_interval_s=0.02)),
                 "off": init(dist.group.WORLD, None, topology=topology, schedules=[loads_schedule(text)], hot_swap=False,
                             name=f"{name}-off")}
        times: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        for index in range(2 * repeats):
            mode = "on" if index % 2 == 0 else "off"
            source = _source(kind, config, world, rank, index, torch)
            output = torch.empty(source.numel() * (world if kind == "allgather" else 1), dtype=torch.int32)
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            if kind == "allgather":
                comms[mode].all_gather_into_tensor(output, source)
            else:
                comms[mode].all_to_all_single(output, source)
            times[mode].append((time.perf_counter() - start, time.process_time() - cpu))
        for comm in comms.values():
            comm.close()
        out[name] = times
    return out


def overhead(config: NetemuConfig, repeats: int) -> list[dict]:
    """Telemetry on vs off on the healthy fabric (healthy schedules): median wall (slowest rank) and median
    CPU time of rank 0 per collective, the first call of each dropped."""
    from mccl.schedule import Collective, dumps_schedule
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    topology = parse_topology(config.topology_spec)
    options = _synth_options(config.chunks)
    texts = {kind: dumps_schedule(optimize(topology, kind, options=options[Collective(kind)]).schedule) for kind in KINDS}
    plan = FabricPlan.from_topology(topology, scale=config.scale, nvlink=config.nvlink)
    with EmulatedFabric(plan) as built:
        outputs = run_ranks_in_fabric(_overhead_rank, built.plan, texts, config, repeats, timeout_s=600)
    rows = []
    for name in texts:
        row: dict = {"collective": name}
        for mode in ("on", "off"):
            walls = [max(out[name][mode][i][0] for out in outputs) for i in range(repeats)][1:]
            cpus = [outputs[0][name][mode][i][1] for i in range(repeats)][1:]
            row[f"wall_ms_{mode}"] = round(statistics.median(walls) * 1e3, 1)
            row[f"cpu_ms_{mode}"] = round(statistics.median(cpus) * 1e3, 2)
        row["wall_on_over_off"] = round(row["wall_ms_on"] / row["wall_ms_off"], 3)
        row["cpu_on_over_off"] = round(row["cpu_ms_on"] / row["cpu_ms_off"], 3)
        rows.append(row)
    return rows


def _nic_util_rank(rank: int, world: int, plan, texts: dict, config: NetemuConfig, repeats: int) -> dict:  # noqa: ANN001
    """Each healthy schedule ``repeats`` times; rank 0 reads its NIC's byte counter around every call."""
    import torch
    import torch.distributed as dist

    from mccl.experiments.netemu.demo import _source
    from mccl.runtime import init
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    topology = parse_topology(config.topology_spec)
    out: dict = {}
    for name, text in texts.items():
        kind = loads_schedule(text).collective.value
        comm = init(dist.group.WORLD, None, topology=topology, schedules=[loads_schedule(text)], hot_swap=False,
                    name=f"{name}-util")
        rows = []
        for index in range(repeats):
            source = _source(kind, config, world, rank, index, torch)
            output = torch.empty(source.numel() * (world if kind == "allgather" else 1), dtype=torch.int32)
            nic = functools.partial(htb_sent_bytes, plan.ranks[rank].namespace, "eth0") if rank == 0 else None
            rows.append(timed_collective(comm, kind, output, source, nic))
        comm.close()
        out[name] = rows
    return out


def nic_utilization(config: NetemuConfig, repeats: int) -> list[dict]:
    """How busy rank 0's NIC is during a collective: its L2 bytes sent ÷ (slowest rank's time × the shaped
    rate); median over the calls after the first. 1.0: the link is the bottleneck the whole collective."""
    from mccl.schedule import Collective, dumps_schedule
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    topology = parse_topology(config.topology_spec)
    options = _synth_options(config.chunks)
    texts = {kind: dumps_schedule(optimize(topology, kind, options=options[Collective(kind)]).schedule) for kind in KINDS}
    plan = FabricPlan.from_topology(topology, scale=config.scale, nvlink=config.nvlink)
    with EmulatedFabric(plan) as built:
        outputs = run_ranks_in_fabric(_nic_util_rank, built.plan, texts, config, repeats, timeout_s=600)
        mbit = built.plan.ranks[0].nic_up_mbit
    rows = []
    for name in texts:
        busy = []
        for index in range(1, repeats):
            slowest = max(out[name][index][0] for out in outputs)
            busy.append(outputs[0][name][index][1] * 8 / slowest / (mbit * 1e6))
        rows.append({"collective": name, "nic_mbit": mbit, "nic_busy_median": round(statistics.median(busy), 3),
                     "nic_busy_min": round(min(busy), 3), "nic_busy_max": round(max(busy), 3)})
    return rows


def fresh(config: NetemuConfig, repeats: int) -> list[dict]:
    from mccl.schedule import Collective, dumps_schedule
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    topology = parse_topology(config.topology_spec)
    gpu = topology.gpus[config.fault_rank]
    degraded = topology.with_capacities(
        [link.gbps * (config.fault_factor if gpu in (link.src, link.dst) and "tor" in (link.src + link.dst) else 1.0)
         for link in topology.links], name=f"{topology.name}+{gpu} NIC x{config.fault_factor:g}")
    options = _synth_options(config.chunks)
    texts_healthy, texts_degraded, model = {}, {}, {}
    for kind in KINDS:
        healthy = optimize(topology, kind, options=options[Collective(kind)]).schedule
        resynth = optimize(degraded, kind, options=options[Collective(kind)]).schedule
        texts_healthy[f"{kind}-healthy"] = dumps_schedule(healthy)
        texts_degraded[f"{kind}-healthy"] = dumps_schedule(healthy)
        texts_degraded[f"{kind}-resynth"] = dumps_schedule(resynth)
        model[(kind, "healthy", "healthy fabric")] = healthy.meta.achieved_gbs
        model[(kind, "resynth", "degraded fabric")] = resynth.meta.achieved_gbs
    rows = []
    for fabric_state, texts, degrade in (("healthy fabric", texts_healthy, False), ("degraded fabric", texts_degraded, True)):
        plan = FabricPlan.from_topology(topology, scale=config.scale, nvlink=config.nvlink)
        with EmulatedFabric(plan) as built:
            outputs = run_ranks_in_fabric(_fresh_rank, built.plan, texts, config, repeats, degrade, timeout_s=600)
        for name in texts:
            kind, schedule = name.split("-")
            per_collective = [max(out[name][i] for out in outputs) for i in range(repeats)][1:]  # first: warm-up
            size = config.ag_bytes * config.ranks if kind == "allgather" else (config.a2a_bytes // 4 // config.ranks) * config.ranks * 4
            measured = size / statistics.median(per_collective) / 1e9
            achieved = model.get((kind, schedule, fabric_state))
            rows.append({"collective": kind, "schedule": schedule, "fabric": fabric_state,
                         "measured_MBps": round(measured * 1e3, 3),
                         "model_MBps": None if achieved is None else round(achieved / config.scale * GOODPUT * 1e3, 3)})
    return rows


def model_gain(config: NetemuConfig) -> list[dict]:
    """Is the fault worth a swap, by the controller's own model? The α-β time (the guard's predictor) of one
    collective of the job's size on the degraded topology, for the healthy schedule and for the schedule
    synthesized for the degraded topology; gain = healthy schedule's time ÷ re-synthesized one's − 1. Flagging
    is right where the gain clears Γ (the drift threshold), not flagging where it does not."""
    from mccl.control.guard import alpha_beta_seconds
    from mccl.schedule import Collective
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    topology = parse_topology(config.topology_spec)
    gpu = topology.gpus[config.fault_rank]
    degraded = topology.with_capacities(
        [link.gbps * (config.fault_factor if gpu in (link.src, link.dst) and "tor" in (link.src + link.dst) else 1.0)
         for link in topology.links])
    options = _synth_options(config.chunks)
    rows = []
    for kind in KINDS:
        size = config.ag_bytes * config.ranks if kind == "allgather" else config.a2a_bytes  # nccl-tests S
        healthy = optimize(topology, kind, options=options[Collective(kind)]).schedule
        resynth = optimize(degraded, kind, options=options[Collective(kind)]).schedule
        before, after = alpha_beta_seconds(healthy, degraded, size), alpha_beta_seconds(resynth, degraded, size)
        rows.append({"collective": kind, "fault_factor": config.fault_factor, "model_gain": round(before / after - 1, 3),
                     "gamma": config.gamma, "worth_a_swap": before / after - 1 > config.gamma})
    return rows


def summary(rows: list[dict], fresh_rows: list[dict]) -> dict:
    """The bars per collective, medians over runs: recovered ÷ fresh re-synthesized (≥ 0.8), restored ÷ healthy
    (±5 %), swaps per fault / per repair / while healthy (≤ 1, ≤ 1, 0), detection in collectives (≤ 10)."""
    out: dict = {}
    fresh_of = {(r["collective"], r["schedule"], r["fabric"]): r["measured_MBps"] for r in fresh_rows}
    for kind in KINDS:
        def median(key: str) -> float | None:
            values = [r[key] for r in rows if r.get(key) is not None]
            return round(statistics.median(values), 3) if values else None

        recovered = [r[f"{kind}_recovered_MBps"] or r[f"{kind}_degraded_MBps"] for r in rows]
        resynth = fresh_of.get((kind, "resynth", "degraded fabric"))
        if resynth and all(v is not None for v in recovered):
            out[f"{kind}_recovered_over_fresh"] = round(statistics.median(recovered) / resynth, 3)
        ratios = [r[f"{kind}_restored_MBps"] / r[f"{kind}_healthy_MBps"] for r in rows
                  if r[f"{kind}_restored_MBps"] and r[f"{kind}_healthy_MBps"]]
        if ratios:
            out[f"{kind}_restored_over_healthy"] = round(statistics.median(ratios), 3)
        for key in ("swaps_fault", "swaps_repair", "swaps_healthy"):
            out[f"{kind}_{key}_per_run"] = [r[f"{kind}_{key}"] for r in rows]
        out[f"{kind}_detect_collectives_per_run"] = [r[f"{kind}_fault_detect_collectives"] for r in rows]
        out[f"{kind}_detect_to_first_ms"] = median(f"{kind}_fault_detect_to_first_s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fresh-repeats", type=int, default=8, help="0: skip the fresh references")
    parser.add_argument("--alpha", type=float, default=NetemuConfig.alpha)
    parser.add_argument("--gamma", type=float, default=NetemuConfig.gamma)
    parser.add_argument("--alpha-level", type=float, default=NetemuConfig.alpha_level, help="0: none (the detection EWMA)")
    parser.add_argument("--tag", default="", help="suffix of the CSV names")
    parser.add_argument("--nic-util-repeats", type=int, default=0,
                        help="how busy rank 0's NIC is during a healthy collective: this many each (0: skip)")
    parser.add_argument("--scale", type=float, default=NetemuConfig.scale, help="emulated rates = topology's / this")
    parser.add_argument("--after-swap", type=int, default=7,
                        help="iterations on the fault's new version before the repair (the demo's 3 end the fault "
                             "inside the version's reference window: settle 3 + warmup 3 collectives after its issue)")
    parser.add_argument("--max-degraded", type=int, default=18, help="most iterations of the fault")
    parser.add_argument("--dump", type=Path, default=None,
                        help="pickle each loop run's report (records, events, every rank's samples) into this folder")
    parser.add_argument("--overhead-repeats", type=int, default=0,
                        help="telemetry on/off: this many collectives each, alternating (0: skip)")
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason is not None:
        sys.exit(f"netemu: {reason}")
    if args.after_swap < 1 or args.max_degraded < args.after_swap:
        sys.exit("netemu: --after-swap must be >= 1 and --max-degraded >= --after-swap")
    config = NetemuConfig(alpha=args.alpha, gamma=args.gamma, alpha_level=args.alpha_level or None, scale=args.scale,
                          after_swap=args.after_swap, max_degraded=args.max_degraded)
    print(f"alpha {config.alpha}, gamma {config.gamma}, alpha_level {config.alpha_level}", flush=True)
    for row in model_gain(config):
        print("model:", row, flush=True)
    if args.nic_util_repeats:
        util_rows = nic_utilization(config, args.nic_util_repeats)
        for row in util_rows:
            print(row, flush=True)
        write_csv(RESULTS / f"netemu_nic_util{args.tag}.csv", util_rows)
    if args.overhead_repeats:
        overhead_rows = overhead(config, args.overhead_repeats)
        for row in overhead_rows:
            print(row, flush=True)
        write_csv(RESULTS / f"netemu_overhead{args.tag}.csv", overhead_rows)
    rows, versions, decisions = [], [], []
    for index in range(args.runs):
        started = time.strftime("%H:%M:%S", time.gmtime())
        row, version_rows, report = loop_run(index, config)
        row["started_utc"] = started
        rows.append(row)
        versions += version_rows
        decisions += guard_events(index, report)
        print(row, flush=True)
        if args.dump is not None:
            args.dump.mkdir(parents=True, exist_ok=True)
            with open(args.dump / f"netemu_run{args.tag}_{index}.pkl", "wb") as handle:
                pickle.dump(report, handle)
        if index == 0:
            print("timeline:", plot_timeline(report, RESULTS, f"netemu_timeline{args.tag}"))
    if rows:
        write_csv(RESULTS / f"netemu_runs{args.tag}.csv", rows)
        write_csv(RESULTS / f"netemu_versions{args.tag}.csv", versions)
        if decisions:  # none where the controller never flagged (a loaded run)
            write_csv(RESULTS / f"netemu_guard{args.tag}.csv", decisions)
        for decision in decisions:
            print("guard:", decision)
    fresh_rows: list[dict] = []
    if args.fresh_repeats:
        fresh_rows = fresh(config, args.fresh_repeats)
        for row in fresh_rows:
            print(row)
        write_csv(RESULTS / f"netemu_fresh{args.tag}.csv", fresh_rows)
    if not rows:
        return
    numeric = [key for key in rows[0] if all(isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
                                             for r in rows)]
    print("medians over runs:", {key: round(statistics.median(r[key] for r in rows), 3) for key in numeric})
    print("bars:", summary(rows, fresh_rows))


if __name__ == "__main__":
    main()
