"""AllGather and ReduceScatter by optimal spanning-tree packing: the three phases end to end.

ForestColl (Zhao et al. 2025) as mccl-paper §4.1/§4.3 and Appendix C use it:

1. :mod:`mccl.synth.cutbound` — the fractional optimum x* and its saturated cut (parametric max-flow);
2. :mod:`.rounding` — k ≤ ``chunks`` trees per rank and integer link capacities at the
   best rate x ≤ x* for them (the rounding loss ``1 - x/x*``);
3. :mod:`.switch_removal` — split switches off into rank-to-rank logical links; on unbalanced
   switches (per-direction degradations) :mod:`.balance` splits at the best lower rate that
   keeps trees, its loss in the stats as ``switch_balance_loss`` (part of ``rounding_gap``);
4. :mod:`.arborescence` — k spanning out-trees per rank with integral multiplicities.

Warm start (``previous``, mccl-paper §4.3): Phases 1 and the rounding run as cold (the
previous bottleneck cut and k only seed them, so the optimum is cold's), then
:mod:`.repair` replaces Phases 2–3: the previous trees (:mod:`.forest`) that fit the new
integer capacities are kept on their physical routes and the others repaired
(:mod:`.keep`, :mod:`.regrow`), lowered with numpy gathers. If a tree cannot be repaired,
Phases 2–3 run cold, trying each source's previous arcs first until the first greedy batch
they mislead (:mod:`.arborescence`, ``warm_prefer_dropped``); from there on the packing is cold's.
A recovery (the optimum above the previous schedule's bound: back to healthy) is synthesized
as cold: there the repair got stuck and the previous arcs misled the packer every time measured.

Lowering: tree edge ``u → v`` of the tree carrying chunk c is a transfer at step
depth(u), along the physical route of the logical link. ReduceScatter runs the same
synthesis on the reversed fabric (every link turned around, same ids) and reverses
the trees: a REDUCE transfer ``v → u`` at step ``D - depth(v)``, so a rank forwards
its partial sum after all its children have.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from mccl.schedule import Collective, Schedule, ScheduleMeta, bottleneck_cut, link_load
from mccl.synth.common import check_ranks, describe_on
from mccl.synth.cutbound import CutChecker, max_rate
from mccl.synth.options import TREEPACK_MAX_CHUNKS, TreePackOptions, resolve_options
from mccl.synth.result import SynthesisResult, TreePackStats, stats_from_pairs
from mccl.synth.treepack.arborescence import pack_arborescences
from mccl.synth.treepack.balance import split_switches
from mccl.synth.treepack.cutproof import violated_cut
from mccl.synth.treepack.fabric import fabric_of
from mccl.synth.treepack.forest import Forest, forest_of
from mccl.synth.treepack.lowerkernel import lower_warm
from mccl.synth.treepack.repair import warm_pack
from mccl.synth.treepack.rounding import best_integral_rate
from mccl.synth.treepack.treeset import lower_trees, route_table
from mccl.synth.treepack.warm import WarmHints, kept_fraction_of_rows, preferred_arcs, warm_hints
from mccl.topology import Link, Topology

__all__ = ["synthesize", "synthesize_reducescatter", "reversed_topology"]

MAX_CHUNKS = TREEPACK_MAX_CHUNKS


def reversed_topology(topology: Topology) -> Topology:
    """Every link turned around (same ids, capacities and latencies): ReduceScatter's AllGather dual."""
    links = tuple(Link(link.id, link.dst, link.src, link.gbps, link.latency_us) for link in topology.links)
    return Topology(f"{topology.name}^T", topology.nodes, links)


def synthesize(topology: Topology, ranks: Sequence[str] | None = None, *,
               previous: SynthesisResult | Schedule | None = None, options: TreePackOptions | None = None,
               **overrides: object) -> SynthesisResult:
    """A throughput-optimal AllGather (up to the reported rounding loss), validated-shape.

    ``previous``: the result or schedule on the same ranks to warm-start from (its trees).
    ``options``: :class:`~mccl.synth.options.TreePackOptions` (``chunks``: most trees per
    source, 1…10; ``latency_aware``: shallow trees, Appendix C); ``overrides``: its fields.
    """
    chosen = check_ranks(topology, ranks)
    return _run(topology, chosen, Collective.ALLGATHER, _schedule_of(previous),
                resolve_options("treepack", TreePackOptions, options, overrides))


def synthesize_reducescatter(topology: Topology, ranks: Sequence[str] | None = None, *,
                             previous: SynthesisResult | Schedule | None = None,
                             options: TreePackOptions | None = None, **overrides: object) -> SynthesisResult:
    """ReduceScatter as the AllGather trees of the reversed fabric, run backwards (REDUCE transfers)."""
    chosen = check_ranks(topology, ranks)
    return _run(topology, chosen, Collective.REDUCESCATTER, _schedule_of(previous),
                resolve_options("treepack", TreePackOptions, options, overrides))


def _schedule_of(previous: SynthesisResult | Schedule | None) -> Schedule | None:
    """The packing warm-starts from the previous trees, which the schedule itself holds."""
    return previous.schedule if isinstance(previous, SynthesisResult) else previous


def _run(topology: Topology, ranks: tuple[str, ...], collective: Collective, previous: Schedule | None,
         options: TreePackOptions) -> SynthesisResult:
    chunks, latency_aware = options.chunks, options.latency_aware
    start = time.perf_counter()
    fabric_topology = topology if collective is Collective.ALLGATHER else reversed_topology(topology)
    fabric = fabric_of(fabric_topology, ranks)
    hints: WarmHints | None = None
    forest: Forest | None = None
    if previous is not None:
        hints = warm_hints(previous, topology, ranks, collective, fabric)
    checker = CutChecker(fabric)
    optimum = max_rate(fabric, hint_sides=hints.cut_sides if hints else (), checker=checker,
                       find_violated=violated_cut)  # most ranks proven without a max-flow (cutproof.py)
    t_phase1 = time.perf_counter()
    # A recovery (the optimum rose above the previous schedule's bound): every integer capacity shrinks
    # at the higher rate, the repair gets stuck (512 GPUs, back from Fail2: 3.7 s, then cold) and the
    # previous k steers the packing to a harder count (k 8 for cold's 10: 18 s against 1.3 s). The
    # rounding then runs as cold, the repair is not tried and the previous arcs, made to route around
    # the fault, are not preferred either (they mislead the greedy: 3.1 s of packing against 1.3 s):
    # a recovery is synthesized as cold.
    bound_before = previous.meta.throughput_bound_gbs if previous is not None else None
    recovered = bound_before is not None and len(ranks) * optimum.rate_gbps / 8.0 > bound_before * (1 + 1e-9)
    if previous is not None and not recovered:
        forest = forest_of(previous, collective)
    prefer_k = hints.k if hints and not recovered else None
    integral = best_integral_rate(fabric, chunks, optimum.rate_gbps, checker, prefer=prefer_k)
    t_rounding = time.perf_counter()
    n = len(ranks)
    stats: dict[str, float] = {}
    load = None  # the schedule's link load, once (describe_on and the bottleneck cut both read it)
    warm = None
    origin = None  # which transfers copy the previous schedule's (warm repair only)
    if forest is not None:
        warm = warm_pack(forest, fabric, integral.units, integral.k, len(topology.links), checker,
                         latency_aware=latency_aware)
    if warm is not None:
        # Warm Phases 2+3 (:mod:`.repair`): previous trees kept or repaired on their physical routes.
        k, split_rate = warm.k, integral.rate_gbps
        t_phase2 = t_phase3 = time.perf_counter()
        schedule, origin, load = lower_warm(collective, ranks, k, forest, warm.rows, warm.row_chunk, warm.new_tail,
                                            warm.new_head, warm.new_chunk, warm.new_route_offsets,
                                            warm.new_route_links, warm.depth, len(topology.links))
        new_root = warm.new_chunk // k
        stats.update({
            "tree_groups": float(n * k), "max_depth": float(warm.depth.max()), "switch_removal_careful": 0.0,
            "switch_balance_retries": 0.0, "warm_repair": 1.0, "repaired_trees": float(warm.repaired_chunks),
            "reused_trees_fraction": warm.kept_chunks / (n * k),
            "kept_fraction": kept_fraction_of_rows(forest, len(warm.rows), new_root, warm.new_tail, warm.new_head),
        })
        phase3_flows = 0
    else:
        arcs = preferred_arcs(forest) if forest is not None else None
        prefer = (lambda root: arcs[root]) if arcs is not None else None
        split = split_switches(fabric, integral)
        logical, k, split_rate = split.logical, split.k, split.rate_gbps
        t_phase2 = time.perf_counter()
        trees, phase3_flows, dropped = pack_arborescences(fabric.n_ranks, logical.units, k, latency_aware=latency_aware,
                                                 prefer=prefer, groups=fabric.groups)
        t_phase3 = time.perf_counter()
        schedule = lower_trees(ranks, collective, trees, k, route_table(list(logical.units), logical.routes))
        stats.update({
            "tree_groups": float(trees.n_groups), "max_depth": float(trees.max_depth),
            "switch_removal_careful": float(logical.careful),
            # Unbalanced switches (more capacity in than out, per direction): splitting at the rounded
            # rate kept no tree per rank, so it was retried at lower rates (see :mod:`.balance`).
            "switch_balance_retries": float(split.retries),
        })
        if arcs is not None:
            stats.update({"warm_repair": 0.0, "reused_trees_fraction": 0.0, "kept_fraction": trees.kept_fraction(arcs),
                          # 1: the previous arcs misled a packing check, the rest was packed cold
                          "warm_prefer_dropped": float(dropped)})
        elif recovered:  # packed as cold (see above): nothing of the previous trees was used
            stats.update({"warm_repair": 0.0, "reused_trees_fraction": 0.0})
    stats.update({
        "solve_time_s": time.perf_counter() - start,
        "phase1_s": t_phase1 - start,
        "rounding_s": t_rounding - t_phase1,
        "phase2_s": t_phase2 - t_rounding,
        "phase3_s": t_phase3 - t_phase2,
        "max_flows": checker.net.solves + phase3_flows,
        "phase1_rounds": optimum.rounds,
        "trees_per_source": k,
        "integral_rate_gbps": split_rate * k / integral.k,
        "fractional_rate_gbps": optimum.rate_gbps,
        "switch_balance_loss": max(0.0, 1.0 - split_rate * k / (integral.rate_gbps * integral.k)),
    })
    schedule = Schedule(collective, ranks, schedule.chunks, schedule.transfers, ScheduleMeta(
        f"{collective.value}.treepack", topology=topology.name,
        inputs=(("chunks", str(chunks)), ("latency_aware", str(latency_aware).lower()),
                ("warm", "true" if previous is not None else "false")),
        throughput_bound_gbs=n * optimum.rate_gbps / 8.0))
    load = link_load(schedule, len(topology.links)) if load is None else load
    schedule = describe_on(schedule, topology, load=load)
    cut_links = sorted({int(fabric.link[arc]) for arc in optimum.cut_arcs})
    achieved = schedule.meta.achieved_gbs or 0.0
    stats["rounding_gap"] = max(0.0, 1.0 - achieved / schedule.meta.throughput_bound_gbs)
    meta = replace(schedule.meta, bottleneck_cut=bottleneck_cut(schedule, topology, cut_links=cut_links, load=load),
                   stats=tuple(sorted(stats.items())))
    bound = float(schedule.meta.throughput_bound_gbs)
    return SynthesisResult(schedule=replace(schedule, meta=meta), method="treepack", bound_gbs=bound,
                           achieved_gbs=float(achieved), optimal=True, stats=stats_from_pairs(TreePackStats, stats),
                           origin=origin)

