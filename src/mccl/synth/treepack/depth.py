"""Depth as an objective: the AllGather whose estimated completion time at the job's size is least.

Throughput is not the whole time. Every level of a tree is a step whose slowest route
latency adds to the collective (the α-β latency term: 18 µs for the 10 levels of the
2×8 packing against 38 µs of bandwidth time at 16 MiB), and every level is a hop whose
pipeline a chunk's slices must fill. So among schedules that differ in depth and
throughput, which is fastest depends on the size. The candidates
(:data:`~mccl.synth.options.DEPTH_CANDIDATES`): the optimal packing, its latency-aware
variant (mccl-paper App. C: shallower trees at the same optimum) and the depth-2 / depth-3
trees of :mod:`.hierarchical` (shallowest, throughput not adapted to the capacities).

The estimate, per candidate, at size S (the executor's slicing, :mod:`mccl.schedule.slicing`)::

    T = T_bw + L + w · T_bw · (D − 1) / k       (w: FILL_WEIGHT, HIERARCHY_FILL_WEIGHT)

``T_bw = max_a load_a · (S / n) / C_a`` (the steady state), ``L`` the sum over steps of the
slowest route latency in the step, D the steps, k the slices per chunk. The fill weight is
measured, not derived: the flow-level simulator with the executor's model
(``SimOptions.executor()``) on the 2×8 HPN puts ``T − T_bw − L`` at −0.01 to 0.08 of
``T_bw · (D − 1) / k`` for the packings at 4–64 MiB (the other trees keep the bottleneck busy
while one fills; median 0.04), and near 0 when one slow link is the only tight one (Fail1).
With 0.1 the choice went wrong on 2×8 Fail1 at 16 MiB (a depth-2 tree at 114 GB/s over a
packing the simulator runs at 157); 0.04 chooses as the simulator ranks in every case measured
but one (2×8 Fail2 at 16 MiB: the latency-aware trees at 301.5 GB/s over the packing's 305.1;
BENCHMARKS.md, 2026-12-01). The synth layer cannot run the simulator (DESIGN.md layering), so
this is α-β; ``benchmarks/treepack_table.py`` checks the choice against the flow-level simulation.
At 128 GPUs the choice is checked flow-level (grouped engine, BENCHMARKS.md 2026-12-01 third
session: 0.995–0.998 of the bound in every fault case). At 512 GPUs (BENCHMARKS.md, 2026-12-01
fourth session) the healthy choice, the rail hierarchy (depth 3, 32 slices), simulates at 0.9725 of
the bound, 0.987× the ring: each of its flows gets ~1/60 of a NIC, so each level's fill is a slice
time of ~80 µs — 2.7 % of 2.7 ms, more than the 0.04 weight predicts; the estimate still ranks it
first among the candidates (host-rail: 0.82 flow level).

The fill weight differs by kind, so the hierarchies get their own, :data:`HIERARCHY_FILL_WEIGHT`
(BENCHMARKS.md, 2026-12-01 fifth session). In a hierarchy every source has one tree, all trees
start at once and every NIC carries about the same count of them, so each level waits about one
slice at a flow's share of a NIC (a 64 KiB slice at ~1/60 of a NIC: ~80 µs) and nothing else keeps the
NIC busy meanwhile. Measured (flow level, grouped engine, 1 GiB): the rail trees at 512 GPUs lose 2.7 %
to fill = 0.43 · T_bw · (D − 1) / k (D 3, k 32) where 0.04 predicted 0.25 %; the rail trees at 128
(D 2, k 128) 0.56: 0.45 for ``rail`` and ``host-rail``. The rail-adapted trees exist only under a fault,
where one slow link sets the pace and the slack of every other link hides part of the fill: at 512
Fail2 (D 5, k 32) 0.21, :data:`ADAPTED_FILL_WEIGHT`. The packings keep 0.04 (measured on the 2×8
packings; the 128-GPU Fail2 packing with one tree per source, D 27, k 128: 0.01).

Under a fault the rail trees adapt nothing; ``rail-adapted`` (:mod:`.railadapt`) is the rail
hierarchy re-chosen around the fabric's hot links: built whenever ``rail`` is a candidate (its name
in the stats: ``estimate_rail_adapted_gbs``) and kept if its steady state beats the rail trees' (on a
healthy HPN fabric its trees are the rail trees and it is dropped); at 512 GPUs under Fail1/2/3 it reaches 0.996–0.999 of the bound in steady
state at depth 5, where the packings' trees are 35–59 deep.

Fewer trees per source. With k trees per source a chunk is 1/k of a block, so it has k times
fewer slices to fill its tree's pipeline with; the rounding (:mod:`.rounding`) keeps the k of the
best steady rate, however small its gain. On the 8×8 HPN at 1 GiB the flow-level simulation
puts the packing of 6 trees per source (43 slices, depth 17) at 0.951 of the bound, and the
packings of 3 / 2 / 1 trees (86–128 slices) at 0.975 / 0.985 / 0.976 for a steady state at most
1.2 % lower (BENCHMARKS.md, 2026-12-01 third session). So each packing candidate is also built
with at most c of :data:`FEWER_CHUNKS` trees per source (``<name>-k<c>``) wherever the estimate says one could
win: with the full packing's steady state and depth and its own slices it must beat the best
estimate so far (else it is not built; this leaves every case where the slices are capped at
128 or are 1 anyway, e.g. the 2×8 HPN at 1 MiB and 1 GiB, as it was).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mccl.errors import MCCLError
from mccl.schedule import Schedule, gbps_to_gbs, link_load
from mccl.schedule.slicing import slice_count
from mccl.synth.common import check_ranks, describe_on
from mccl.synth.options import DepthOptions
from mccl.synth.result import BaselineStats, SynthesisResult
from mccl.synth.treepack.hierarchical import hierarchical_allgather
from mccl.synth.treepack.pipeline import synthesize
from mccl.synth.treepack.railadapt import rail_adapted_allgather
from mccl.topology import Topology

__all__ = ["FILL_WEIGHT", "HIERARCHY_FILL_WEIGHT", "ADAPTED_FILL_WEIGHT", "Estimate", "estimate", "choose_by_time"]

FILL_WEIGHT = 0.04  # packings (module docstring)
HIERARCHY_FILL_WEIGHT = 0.45  # one tree per source through every NIC at once: rail, host-rail
ADAPTED_FILL_WEIGHT = 0.21  # the same under a fault, rail-adapted: the slow link's pace hides part of it
FEWER_CHUNKS = (4, 2, 1)  # trees per source also tried for the packings (module docstring)


@dataclass(frozen=True)
class Estimate:
    """α-β time of one AllGather of ``size_bytes`` with the executor's slicing (module docstring)."""

    time_s: float
    bandwidth_s: float
    latency_s: float
    fill_s: float
    depth: int
    slices: int
    algbw_gbs: float


def fill_weight(schedule: Schedule) -> float:
    """The fill weight of ``schedule``'s kind (module docstring), by its ``hierarchy`` input: a packing has none."""
    hierarchy = dict(schedule.meta.inputs).get("hierarchy")
    if hierarchy is None:
        return FILL_WEIGHT
    return ADAPTED_FILL_WEIGHT if hierarchy == "rail-adapted" else HIERARCHY_FILL_WEIGHT


def estimate(schedule: Schedule, topology: Topology, size_bytes: float) -> Estimate:
    """The module docstring's estimate of ``schedule`` at ``size_bytes`` on ``topology``."""
    n = schedule.n_ranks
    load = link_load(schedule, len(topology.links))
    rate = gbps_to_gbs(topology.capacities_gbps) * 1e9
    used = load > 0
    bandwidth = float(np.max(load[used] * (size_bytes / n) / rate[used])) if np.any(used) else 0.0
    latency = float(schedule.transfers.step_max_route_cost(topology.latencies_us).sum() * 1e-6)
    depth = schedule.transfers.n_steps
    slices = slice_count(float(schedule.chunks.fraction.max()) * size_bytes / n)
    fill = fill_weight(schedule) * bandwidth * (depth - 1) / slices
    total = bandwidth + latency + fill
    return Estimate(total, bandwidth, latency, fill, depth, slices, size_bytes / total / 1e9)


def _could_win(full: Estimate, schedule: Schedule, chunks: int, size_bytes: float, best_s: float) -> bool:
    """Whether a packing of ``chunks`` trees per source could beat ``best_s``: the full packing's steady
    state and depth (an optimistic bound: fewer trees never raise the steady rate), its own slices."""
    n = schedule.n_ranks
    slices = slice_count(size_bytes / n / chunks)
    fill = FILL_WEIGHT * full.bandwidth_s * (full.depth - 1) / slices
    return full.bandwidth_s + full.latency_s + fill < best_s * (1 - 1e-9)


def _candidate(name: str, topology: Topology, ranks: tuple[str, ...], chunks: int) -> Schedule:
    if name in ("packing", "latency_aware"):
        return synthesize(topology, ranks, chunks=chunks, latency_aware=name == "latency_aware").schedule
    if name == "rail-adapted":
        return describe_on(rail_adapted_allgather(topology, ranks), topology)
    return describe_on(hierarchical_allgather(topology, ranks, name), topology)


def choose_by_time(topology: Topology, ranks: Sequence[str] | None, options: DepthOptions) -> SynthesisResult:
    """The candidate with the least estimated time at ``options.size_bytes``; every candidate's figures in its stats.

    Stats: ``depth``, ``estimated_time_s``, ``estimated_algbw_gbs``, ``estimate_<candidate>_gbs`` per
    candidate, and when the packing was weighed, ``packing_achieved_gbs`` and ``throughput_traded`` (the
    chosen schedule's steady-state loss against the packing's: what depth cost in throughput).
    A candidate that cannot be built on the fabric (e.g. no switch route for a hierarchy's hop) is
    left out; if none can, the first one's error is raised.
    """
    chosen_ranks = check_ranks(topology, ranks)
    started = time.perf_counter()
    built: dict[str, tuple[Schedule, Estimate]] = {}
    first_error: MCCLError | None = None
    names = list(options.candidates) + (["rail-adapted"] if "rail" in options.candidates else [])
    for name in names:
        try:
            schedule = _candidate(name, topology, chosen_ranks, options.chunks)
        except MCCLError as error:
            first_error = first_error or error
            continue
        if name == "rail-adapted" and "rail" in built and not (
                float(schedule.meta.achieved_gbs or 0.0) > float(built["rail"][0].meta.achieved_gbs or 0.0) * (1 + 1e-9)):
            continue  # nothing to route around: the rail trees themselves
        built[name] = (schedule, estimate(schedule, topology, options.size_bytes))
    for name in [name for name in ("packing", "latency_aware") if name in built]:
        full_schedule, full = built[name]
        trees = int(full_schedule.meta.stat("trees_per_source", options.chunks) or options.chunks)
        for chunks in (c for c in FEWER_CHUNKS if c < trees):
            best_s = min(item[1].time_s for item in built.values())
            if not _could_win(full, full_schedule, chunks, options.size_bytes, best_s):
                continue
            try:
                schedule = _candidate(name, topology, chosen_ranks, chunks)
            except MCCLError:
                continue
            built[f"{name}-k{chunks}"] = (schedule, estimate(schedule, topology, options.size_bytes))
    if not built:
        assert first_error is not None
        raise first_error
    best = min(built, key=lambda name: (built[name][1].time_s, name))
    schedule, chosen = built[best]
    stats = dict(schedule.meta.stats)
    stats.update({"depth": float(chosen.depth), "estimated_time_s": chosen.time_s,
                  "estimated_algbw_gbs": chosen.algbw_gbs, "solve_time_s": time.perf_counter() - started})
    stats.update({f"estimate_{name.replace('-', '_')}_gbs": item[1].algbw_gbs for name, item in built.items()})
    achieved = float(schedule.meta.achieved_gbs or 0.0)
    if "packing" in built:
        packing = float(built["packing"][0].meta.achieved_gbs or 0.0)
        stats.update({"packing_achieved_gbs": packing,
                      "throughput_traded": max(0.0, 1.0 - achieved / packing) if packing > 0 else 0.0})
    inputs = schedule.meta.inputs + (("shape", best), ("size_bytes", repr(float(options.size_bytes))),
                                     ("candidates", ",".join(options.candidates)))
    meta = replace(schedule.meta, inputs=inputs, stats=tuple(sorted(stats.items())))
    return SynthesisResult(schedule=replace(schedule, meta=meta), method="treepack.depth", bound_gbs=None,
                           achieved_gbs=achieved, optimal=False,
                           stats=BaselineStats(solve_time_s=stats["solve_time_s"]))
