"""MCCS ring reversal (mccs-summary §3.3, the paper's Figure 7) on the flow-level simulator.

Four switches in a ring, one host with two GPUs on each: ``switch_ring(4, 1, 2,
100)``. 100 Gbit/s links are what the paper's numbers imply: a hop carried about
83 Gbit/s (5.9 GB/s of ring AllReduce algbw on 8 GPUs is 10.3 GB/s of busbw per
hop), more than the 50 Gbit/s of the spine-leaf testbed, and 75 Gbit/s of
background left 25. An 8-GPU ring AllReduce runs clockwise, back to back. At
7.5 s a constant 75 Gbit/s background flow starts on the clockwise link sw0→sw1;
the controller, a closed-loop hook reading per-path throughput every 0.25 s,
reverses the ring at its first look at or after 12 s once a clockwise path
measures under half its healthy rate; every ring flow then takes a
counter-clockwise link.

The simulator runs links at line rate: healthy algbw is 12.5 GB/s / (2·7/8) =
7.14 GB/s where the testbed measured 5.9 (83 % of line rate); with 25 Gbit/s
left the bound is 1.79 GB/s where the testbed measured 1.7.
"""

from __future__ import annotations

import math

from mccl.experiments.report import MiB, ScenarioReport, ScenarioRow
from mccl.schedule import Collective
from mccl.sim.closedloop import ControlHook, ControlView
from mccl.sim.engine import simulate
from mccl.sim.inputs import BackgroundFlow, CollectiveOp, Job, path_links
from mccl.synth.ring import naive_ring, ring_schedule
from mccl.topology import switch_ring

__all__ = ["ring_reversal", "PAPER_GBS"]

PAPER_GBS = (5.9, 1.7, 5.9)  # mccs-summary §5: before, during the background flow, after the reversal


def ring_reversal(
    size_bytes: float = 1024 * MiB,
    *,
    link_gbps: float = 100.0,
    background_gbps: float = 75.0,
    background_at_s: float = 7.5,
    reverse_at_s: float = 12.0,
    horizon_s: float = 20.0,
    interval_s: float = 0.25,
) -> ScenarioReport:
    fabric = switch_ring(4, 1, 2, link_gbps)
    ranks = fabric.gpus
    clockwise = naive_ring(fabric, Collective.ALLREDUCE)  # gpu0 → gpu1 → … → gpu7 → gpu0
    counter = ring_schedule(fabric, Collective.ALLREDUCE, ranks, [list(reversed(range(len(ranks))))],
                            synthesizer="ring.reversed")
    loaded = path_links(fabric, ["sw0", "sw1"])
    healthy_gbps: dict[tuple[str, str], float] = {}
    events: list[tuple[float, str]] = [(background_at_s, f"{background_gbps:g} Gbit/s background on sw0->sw1")]

    def controller(view: ControlView) -> None:
        congested = False
        for sample in view.samples:
            if math.isnan(sample.gbps):
                continue
            key = (sample.src, sample.dst)
            best = healthy_gbps.setdefault(key, sample.gbps)
            healthy_gbps[key] = max(best, sample.gbps)
            congested |= sample.gbps < 0.5 * healthy_gbps[key]
        if view.time_s >= reverse_at_s and congested and view.schedule("tenant", "allreduce") is clockwise:
            view.swap("tenant", "allreduce", counter)
            events.append((view.time_s, "controller reverses the ring"))

    job = Job("tenant", (CollectiveOp(clockwise, size_bytes),), iterations=10**6, until_s=horizon_s)
    result = simulate(fabric, [job], background=[BackgroundFlow("background", loaded, rate_gbps=background_gbps,
                                                                start_s=background_at_s)],
                      hook=ControlHook(interval_s, controller))
    runs = result.runs_of("tenant")
    swapped = next((t for t, what in events if "reverses" in what), math.inf)
    windows = (("before the background flow", 0.0, background_at_s, PAPER_GBS[0]),
               ("background flow, clockwise ring", background_at_s, swapped, PAPER_GBS[1]),
               ("after the reversal", swapped, horizon_s, PAPER_GBS[2]))
    rows = []
    for label, start, stop, paper in windows:
        inside = [run for run in runs if run.start_s >= start and run.end_s <= stop]
        if not inside:
            continue
        algbw = sum(run.size_bytes for run in inside) / sum(run.time_s for run in inside) / 1e9
        rows.append(ScenarioRow(f"{start:g}-{min(stop, horizon_s):g} s: {label}", Collective.ALLREDUCE,
                                inside[-1].schedule, fabric.name, size_bytes, algbw, algbw * 2 * 7 / 8,
                                f"paper: {paper} GB/s; {len(inside)} AllReduces"))
    timeline = tuple((run.end_s, run.algbw_gbs, run.schedule) for run in runs)
    return ScenarioReport("mccs-reversal", f"MCCS ring reversal on {fabric.name}: 8-GPU ring AllReduce, "
                          f"{background_gbps:g} Gbit/s background at {background_at_s:g} s", tuple(rows),
                          timeline, tuple(sorted(events)))
