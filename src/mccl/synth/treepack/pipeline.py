"""AllGather and ReduceScatter by optimal spanning-tree packing: the three phases end to end.

ForestColl (Zhao et al. 2025) as mccl-paper §4.1/§4.3 and Appendix C use it:

1. :mod:`.maxrate` — the fractional optimum x* and its saturated cut (parametric max-flow);
2. :mod:`.rounding` — k ≤ ``chunks`` trees per rank and integer link capacities at the
   best rate x ≤ x* for them (the rounding loss ``1 - x/x*``);
3. :mod:`.switch_removal` — split switches off into rank-to-rank logical links;
4. :mod:`.arborescence` — k spanning out-trees per rank with integral multiplicities.

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

from mccl.errors import SynthesisError
from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta, TransferList, TransferOp, bottleneck_cut
from mccl.synth.common import check_ranks, describe_on
from mccl.synth.treepack.arborescence import pack_arborescences
from mccl.synth.treepack.fabric import fabric_of
from mccl.synth.treepack.maxrate import CutChecker, max_rate
from mccl.synth.treepack.rounding import best_integral_rate
from mccl.synth.treepack.switch_removal import LogicalGraph, packing_ok, remove_switches
from mccl.synth.treepack.tree import Tree
from mccl.synth.treepack.warm import WarmHints, kept_fraction, warm_hints
from mccl.topology import Link, Topology

__all__ = ["synthesize", "synthesize_reducescatter", "reversed_topology"]

MAX_CHUNKS = 10  # mccl-paper §6: "up to ten chunks"


def reversed_topology(topology: Topology) -> Topology:
    """Every link turned around (same ids, capacities and latencies): ReduceScatter's AllGather dual."""
    links = tuple(Link(link.id, link.dst, link.src, link.gbps, link.latency_us) for link in topology.links)
    return Topology(f"{topology.name}^T", topology.nodes, links)


def synthesize(topology: Topology, ranks: Sequence[str] | None = None, *, previous: Schedule | None = None,
               chunks: int = MAX_CHUNKS, latency_aware: bool = False) -> Schedule:
    """A throughput-optimal AllGather (up to the reported rounding loss), validated-shape.

    ``chunks``: most chunks (trees) per source, 1…10. ``previous``: a schedule on the
    same ranks to warm-start from. ``latency_aware``: shallow trees (Appendix C).
    """
    chosen = check_ranks(topology, ranks)
    return _run(topology, chosen, Collective.ALLGATHER, previous, chunks, latency_aware)


def synthesize_reducescatter(topology: Topology, ranks: Sequence[str] | None = None, *,
                             previous: Schedule | None = None, chunks: int = MAX_CHUNKS,
                             latency_aware: bool = False) -> Schedule:
    """ReduceScatter as the AllGather trees of the reversed fabric, run backwards (REDUCE transfers)."""
    chosen = check_ranks(topology, ranks)
    return _run(topology, chosen, Collective.REDUCESCATTER, previous, chunks, latency_aware)


def _run(topology: Topology, ranks: tuple[str, ...], collective: Collective, previous: Schedule | None,
         chunks: int, latency_aware: bool) -> Schedule:
    if not 1 <= chunks <= MAX_CHUNKS:
        raise SynthesisError(f"chunks must be 1..{MAX_CHUNKS} per source, got {chunks}")
    start = time.perf_counter()
    fabric_topology = topology if collective is Collective.ALLGATHER else reversed_topology(topology)
    fabric = fabric_of(fabric_topology, ranks)
    hints: WarmHints | None = None
    if previous is not None:
        hints = warm_hints(previous, topology, ranks, collective, fabric)
    checker = CutChecker(fabric)
    optimum = max_rate(fabric, hint_sides=hints.cut_sides if hints else (), checker=checker)
    t_phase1 = time.perf_counter()
    integral = best_integral_rate(fabric, chunks, optimum.rate_gbps, checker, prefer=hints.k if hints else None)
    t_rounding = time.perf_counter()
    logical = remove_switches(fabric, integral.units, integral.k, fabric.groups)
    k = _trees_that_fit(logical, integral.k)
    t_phase2 = time.perf_counter()
    prefer = (lambda root: hints.arcs[root]) if hints else None
    trees, phase3_flows = pack_arborescences(fabric.n_ranks, logical.units, k, latency_aware=latency_aware,
                                             prefer=prefer, groups=fabric.groups)
    t_phase3 = time.perf_counter()
    schedule = _lower(topology, ranks, collective, trees, k, logical)
    n = len(ranks)
    stats = {
        "solve_time_s": time.perf_counter() - start,
        "phase1_s": t_phase1 - start,
        "rounding_s": t_rounding - t_phase1,
        "phase2_s": t_phase2 - t_rounding,
        "phase3_s": t_phase3 - t_phase2,
        "max_flows": checker.net.solves + phase3_flows,
        "phase1_rounds": optimum.rounds,
        "trees_per_source": k,
        "tree_groups": len(trees),
        "max_depth": max(max(tree.depth.values()) for tree in trees),
        "integral_rate_gbps": integral.rate_gbps * k / integral.k,
        "fractional_rate_gbps": optimum.rate_gbps,
        "switch_removal_careful": float(logical.careful),
    }
    if hints is not None:
        stats["kept_fraction"] = kept_fraction(hints, trees)
    schedule = Schedule(collective, ranks, schedule.chunks, schedule.transfers, ScheduleMeta(
        f"{collective.value}.treepack", topology=topology.name,
        inputs=(("chunks", str(chunks)), ("latency_aware", str(latency_aware).lower()),
                ("warm", "true" if previous is not None else "false")),
        throughput_bound_gbs=n * optimum.rate_gbps / 8.0))
    schedule = describe_on(schedule, topology)
    cut_links = sorted({int(fabric.link[arc]) for arc in optimum.cut_arcs})
    achieved = schedule.meta.achieved_gbs or 0.0
    stats["rounding_gap"] = max(0.0, 1.0 - achieved / schedule.meta.throughput_bound_gbs)
    meta = replace(schedule.meta, bottleneck_cut=bottleneck_cut(schedule, topology, cut_links=cut_links),
                   stats=tuple(sorted(stats.items())))
    return replace(schedule, meta=meta)


def _trees_that_fit(logical: LogicalGraph, k: int) -> int:
    """k, or fewer trees per rank when switch removal could not keep the cut condition (unbalanced switches)."""
    if not logical.careful:
        return k
    import numpy as np

    keys = list(logical.units)
    tail = np.array([u for u, _ in keys], dtype=np.int64)
    head = np.array([v for _, v in keys], dtype=np.int64)
    caps = np.array([logical.units[key] for key in keys], dtype=np.int64)
    for fit in range(k, 0, -1):
        if packing_ok(logical.n_ranks, logical.n_ranks, tail, head, caps, fit):
            return fit
    raise SynthesisError("switch removal left no spanning tree per rank; the fabric's switches are too "
                         "unbalanced (far more capacity in than out) for tree packing")


def _lower(topology: Topology, ranks: tuple[str, ...], collective: Collective, trees: list[Tree], k: int,
           logical: LogicalGraph) -> Schedule:
    """Trees to chunks and transfers (see the module docstring for steps and ReduceScatter)."""
    n = len(ranks)
    pools = {key: [list(item) for item in routes] for key, routes in logical.routes.items()}
    reduce = collective is Collective.REDUCESCATTER
    deepest = max(max(tree.depth.values()) for tree in trees)
    transfers = TransferList()
    sources: list[int] = []
    next_chunk = [0] * n
    ordered = sorted(trees, key=lambda tree: tree.root)
    chunk_of_tree: list[int] = []
    for tree in ordered:
        chunk_of_tree.append(tree.root * k + next_chunk[tree.root])
        next_chunk[tree.root] += tree.multiplicity
    for tree, first in zip(ordered, chunk_of_tree, strict=True):
        for chunk in range(first, first + tree.multiplicity):
            for u, v in tree.edges:
                route = _take_route(pools[(u, v)])
                if reduce:
                    transfers.add(chunk, v, u, deepest - tree.depth[v], tuple(reversed(route)), TransferOp.REDUCE)
                else:
                    transfers.add(chunk, u, v, tree.depth[u], route)
    sources = [root for root in range(n) for _ in range(k)]
    fractions = [1.0 / k] * (n * k)
    none = [-1] * (n * k)
    table = Chunks(none, sources, fractions) if reduce else Chunks(sources, none, fractions)
    return Schedule(collective, ranks, table, transfers.freeze())


def _take_route(pool: list[list]) -> tuple[int, ...]:
    """One unit of a logical link's routes (the link carries one more chunk of one tree)."""
    for item in pool:
        if item[1] > 0:
            item[1] -= 1
            return item[0]
    raise SynthesisError("a logical link carries more trees than its routes allow (a bug)")
