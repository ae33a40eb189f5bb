"""Phase 2: switch removal by splitting off (ForestColl §5.2, mccl-paper Fig. 18).

Switches forward but do not copy, so a tree can only use a switch as a pass-through
from one rank to another. Splitting off a pair of arcs ``u → w → t`` at a switch w
by γ units replaces γ units of each by γ units of a logical arc ``u → t`` whose
physical route is the concatenation. Once every switch is split off, only ranks are
left, and Phase 3 packs arborescences on the logical graph. The Bang-Jensen –
Frank – Jackson theorem says a switch whose in-capacity equals its out-capacity
(every full-duplex fabric, and every fault here, which degrades both directions)
can be split off completely while keeping the cut condition of Phase 1.

Per switch we split greedily but spread: first each in-arc's share proportional
to the out-arcs' capacities (floors), then a small bipartite max-flow (no ``u → u``
pairs) fills up what is left, so the split is maximal. After all switches we check
the cut condition on the logical graph: ``maxflow(s*, v) >= need`` for every rank v, asked
as one rooted minimum cut (:func:`~.packcheck.packing_ok`, Hao–Orlin: about one max-flow's
time, where n max-flows took 137 s at 2,048 GPUs). If it fails (unbalanced
switches, e.g. random one-way links or a measured topology degraded one direction
at a time), the careful mode first balances the switches — excess in-units drain
into the super-source s* by an extra arc (arcs into s* carry no flow, so the cut
condition is unchanged and the theorem applies), excess out-units (a switch never
forwards more than it takes in) are trimmed arc by arc by the largest amount that
keeps the condition — then re-splits switch by switch, falling back per switch to
pair by pair, each amount the largest that keeps the condition (binary search on
max-flow checks); what still cannot be split is dropped and shows as loss
(:mod:`.balance` then tries lower rates).

Where links have more units than the trees can use (a slow rank sets the rate: Fail1, Fail3), the
split first runs on the least units the cut condition needs (:mod:`.slackcap`), then on 10 % more,
then on the units capped at Σ k, then as given — the first whose logical graph passes the check is kept.

The arcs and their route pools while splitting are :class:`~.splitgraph.SplitGraph`; the
routes are straightened at the end (:mod:`.straighten`). Units are integers: trees per time
unit of :mod:`mccl.synth.treepack.rounding`. Complexity: fast path O(Σ_w deg(w)²) plus one
rooted minimum cut on the logical graph.
"""

from __future__ import annotations

import functools
import gc
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import numpy as np

from mccl.synth.maxflow import BIG, FlowNet
from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.packcheck import packing_ok
from mccl.synth.treepack.slackcap import least_units
from mccl.synth.treepack.splitgraph import Path, SplitGraph
from mccl.synth.treepack.straighten import straighten_routes

__all__ = ["LogicalGraph", "remove_switches", "packing_ok", "straighten_logical"]

@dataclass(frozen=True)
class LogicalGraph:
    """Rank-to-rank logical arcs: ``units[(u, v)]`` trees per time unit, ``routes[(u, v)]`` their physical routes."""

    n_ranks: int
    units: dict[tuple[int, int], int]
    routes: dict[tuple[int, int], list[tuple[Path, int]]]
    careful: bool  # whether the fast split failed its check
    split_units: np.ndarray | None = None  # the integer link units split (after pruning), for straighten_logical
    straight: bool = True  # whether the routes are straightened (simple and short)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _without_cyclic_gc(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """``function`` with Python's cyclic garbage collector paused while it runs (restored after).

    The split and the straightening allocate millions of route tuples and pool dicts that live until
    Phase 2 ends and form no cycles; each collection of the oldest generation walks all of them
    again, and allocation keeps triggering collections (512 GPUs Fail3, one run each: split 8.38 →
    7.23 s CPU, straightening 6.55 → 6.05 with the collector paused; more at 2,048, where the heap
    is larger). Reference counting still frees everything as usual.
    """
    @functools.wraps(function)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not gc.isenabled():
            return function(*args, **kwargs)
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            gc.enable()
    return paused


@_without_cyclic_gc
def straighten_logical(fabric: Fabric, logical: LogicalGraph) -> LogicalGraph:
    """``logical`` with its routes straightened (:mod:`.straighten`), if they are not yet.

    Lets a caller that tries several splits (:mod:`.balance`) straighten only the one it keeps."""
    if logical.straight or logical.split_units is None:
        return logical
    routes = straighten_routes(fabric, logical.split_units, logical.routes)
    return LogicalGraph(logical.n_ranks, logical.units, routes, logical.careful, logical.split_units, True)


def _fast_split(graph: SplitGraph, w: int, groups: np.ndarray) -> None:
    """Split switch w maximally and spread, keeping pairs of one host (``groups``) for last.

    A route that leaves a host through w and comes back into the same host spends
    that host's ingress on data it already has: the host cut (tight on HPN, where
    the NICs carry almost exactly what the host lacks) would lose it. So pairs
    with ``groups[u] == groups[t] >= 0`` (and w outside that host) are used only
    when nothing else is left.
    """
    ins = {u: graph.units((u, w)) for u in graph.inn[w]}
    outs = {t: graph.units((w, t)) for t in graph.out[w]}
    if not ins or not outs:
        graph.drop_switch(w)
        return

    def apart(u: np.ndarray, t: np.ndarray) -> np.ndarray:  # elementwise over in-ranks × out-ranks
        return (u != t) & ((groups[u] < 0) | (groups[u] != groups[t]) | (groups[w] == groups[u]))

    plan, left_in, left_out = _spread(ins, outs, groups, w)
    _fill(plan, left_in, left_out, apart)
    _fill(plan, left_in, left_out, lambda u, t: u != t)
    for (u, t), amount in plan.items():
        graph.split(u, w, t, amount)
    graph.drop_switch(w)


def _spread(ins: dict[int, int], outs: dict[int, int], groups: np.ndarray,
            w: int) -> tuple[dict[tuple[int, int], int], dict[int, int], dict[int, int]]:
    """The proportional part of :func:`_fast_split`: in-ranks by falling units, each spreading its units
    over the out-ranks apart from it in proportion, within what the out-ranks have left; the plan (in
    the order its pairs arose) and the units left on each side.

    One numpy row per in-rank (:func:`_spread_reference` is the per-pair loop it replaces; 2,048 GPUs
    under Fail3 spent most of the split there). Each share is ``min(⌊cu·ct/reachable⌋, left_out[t])``:
    the reference's third bound, what u has left, never binds, as Σ_t ⌊cu·ct/reachable⌋ ≤ cu.
    """
    us = np.fromiter(ins, dtype=np.int64, count=len(ins))
    cu = np.fromiter(ins.values(), dtype=np.int64, count=len(ins))
    ts = np.fromiter(outs, dtype=np.int64, count=len(outs))
    ct = np.fromiter(outs.values(), dtype=np.int64, count=len(outs))
    group_u, group_t = groups[us], groups[ts]
    left_u, left_t = cu.copy(), ct.copy()
    plan: dict[tuple[int, int], int] = defaultdict(int)
    for i in np.argsort(-cu, kind="stable").tolist():  # what ``sorted(..., key=-units)`` gives
        g = group_u[i]
        apart = (ts != us[i]) & ((g < 0) | (group_t != g) | (groups[w] == g))
        reachable = int(ct[apart].sum())
        if reachable == 0:
            continue
        share = np.where(apart, np.minimum(cu[i] * ct // reachable, left_t), 0)
        taken = np.flatnonzero(share > 0)
        u = int(us[i])
        for j, amount in zip(taken.tolist(), share[taken].tolist(), strict=True):
            plan[(u, int(ts[j]))] += amount
        left_t -= share
        left_u[i] -= int(share.sum())
    return plan, dict(zip(us.tolist(), left_u.tolist(), strict=True)), dict(zip(ts.tolist(), left_t.tolist(), strict=True))


def _spread_reference(ins: dict[int, int], outs: dict[int, int], groups: np.ndarray,
                      w: int) -> tuple[dict[tuple[int, int], int], dict[int, int], dict[int, int]]:
    """:func:`_spread` pair by pair (the former loop; the tests' reference)."""
    def apart(u: int, t: int) -> bool:
        return u != t and (groups[u] < 0 or groups[u] != groups[t] or groups[w] == groups[u])

    plan: dict[tuple[int, int], int] = defaultdict(int)
    left_in = dict(ins)
    left_out = dict(outs)
    for u, cu in sorted(ins.items(), key=lambda item: -item[1]):
        reachable = sum(ct for t, ct in outs.items() if apart(u, t))
        if reachable == 0:
            continue
        for t, ct in outs.items():
            if not apart(u, t):
                continue
            share = min(cu * ct // reachable, left_in[u], left_out[t])
            if share > 0:
                plan[(u, t)] += share
                left_in[u] -= share
                left_out[t] -= share
    return plan, left_in, left_out


def _fill(plan: dict[tuple[int, int], int], left_in: dict[int, int], left_out: dict[int, int],
          allowed: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    """Add to ``plan`` a maximal split of what is left, over the allowed pairs (bipartite max-flow).

    ``allowed(u, t)``: elementwise over an in-rank column and an out-rank row; the pairs in row-major
    order, as the nested loop over in- then out-ranks listed them."""
    us = [u for u in left_in if left_in[u] > 0]
    ts = [t for t in left_out if left_out[t] > 0]
    if not us or not ts:
        return
    pairs = np.argwhere(allowed(np.array(us, dtype=np.int64)[:, None], np.array(ts, dtype=np.int64)[None, :])).tolist()
    if not pairs:
        return
    net = FlowNet(2 + len(us) + len(ts))
    sink = 1 + len(us) + len(ts)
    net.add_arcs(np.zeros(len(us)), np.arange(1, 1 + len(us)), np.array([left_in[u] for u in us]))
    net.add_arcs(np.arange(1 + len(us), sink), np.full(len(ts), sink), np.array([left_out[t] for t in ts]))
    ids = net.add_arcs(np.array([1 + i for i, _ in pairs]), np.array([1 + len(us) + j for _, j in pairs]),
                       np.full(len(pairs), BIG))
    net.max_flow(0, sink)
    for (i, j), flow in zip(pairs, net.flows(ids), strict=True):
        if flow > 0:
            u, t = us[i], ts[j]
            plan[(u, t)] += int(flow)
            left_in[u] -= int(flow)
            left_out[t] -= int(flow)


def _careful_split(graph: SplitGraph, w: int, k: int | np.ndarray) -> None:
    """Split switch w pair by pair, each by the largest amount that keeps the cut condition."""

    def ok() -> bool:
        tail, head, caps = graph.arrays()
        return packing_ok(graph.n_nodes, graph.n_ranks, tail, head, caps, k)

    for u in sorted(graph.inn[w]):
        for t in sorted(graph.out[w]):
            if t == u or (u, w) not in graph.pools or (w, t) not in graph.pools:
                continue
            high = min(graph.units((u, w)), graph.units((w, t)))
            saved = graph.snapshot([(u, w), (w, t), (u, t)])
            low = 0
            while low < high:
                mid = (low + high + 1) // 2
                graph.split(u, w, t, mid)
                good = ok()
                graph.restore(saved)
                if good:
                    low = mid
                else:
                    high = mid - 1
            if low > 0:
                graph.split(u, w, t, low)
    graph.drop_switch(w)


@_without_cyclic_gc
def remove_switches(fabric: Fabric, units: np.ndarray, k: int | np.ndarray,
                    groups: np.ndarray | None = None, *, straighten: bool = True) -> LogicalGraph:
    """Split off every switch; the logical rank-to-rank graph with the routes of its arcs.

    ``k``: trees per rank still to pack (uniform, or per rank for a warm start's residual).
    ``straighten``: make the routes simple and short (:mod:`.straighten`); False keeps the raw
    concatenations of the splits (they may visit a switch twice): for comparison, or for a caller
    that straightens only the split it keeps (:func:`straighten_logical`).
    """
    if groups is None:
        groups = np.full(fabric.n_nodes, -1, dtype=np.int64)
    groups = np.append(groups, -1)  # s*, the target of drained excess
    distance = _switch_distance(fabric)
    units = _prune_far_switches(fabric, units, k, distance)
    order = _farthest_first(fabric, distance)
    careful = True
    trials = _capped_first(units, k, fabric.n_ranks)
    if len(trials) > 1:  # links with slack: first as few units as the cut condition needs (:mod:`.slackcap`)
        least = least_units(fabric, units, k)
        # then with 10 % to spare: the proportional split can lose a few units of a tight cut (1,024 and
        # 2,048 GPUs under Fail1: the least units fail the logical check, 10 % more pass with 169 k / 640 k arcs)
        trials[:0] = [least, np.minimum(units, -(-least * 11 // 10))]
    for trial in trials:
        graph = SplitGraph(fabric, trial)  # the fast split is maximal: no drain, every out-unit gets used
        for w in order:
            _fast_split(graph, w, groups)
        tail, head, caps = graph.arrays()
        if packing_ok(fabric.n_nodes, fabric.n_ranks, tail, head, caps, k):
            careful = False
            break
    if careful:
        graph = SplitGraph(fabric, units)
        graph.drain_excess()
        graph.trim_out_excess(k)
        for w in order:
            before = graph.snapshot()
            _fast_split(graph, w, groups)
            tail, head, caps = graph.arrays()
            if packing_ok(graph.n_nodes, graph.n_ranks, tail, head, caps, k):
                continue
            graph.restore(before, everything=True)
            _careful_split(graph, w, k)
    pools = graph.rank_pools()
    units_out = {key: graph.units(key) for key in pools}
    routes = {key: list(pool.items()) for key, pool in pools.items()}
    if straighten:
        routes = straighten_routes(fabric, units, routes)
    return LogicalGraph(fabric.n_ranks, units_out, routes, careful, units, straighten)


def _capped_first(units: np.ndarray, k: int | np.ndarray, n_ranks: int) -> list[np.ndarray]:
    """The link units to split, first capped at ``need`` = Σ k (the trees to pack), then as given.

    Where one slow rank sets the rate (Fail3: 18.8 of 406 GB/s at 512 GPUs) every other link's
    integer capacity is ~20× what the trees can use, and the proportional split then links almost
    every rank pair: 262 k logical arcs at 512 GPUs against 46 k healthy, and the straightening and
    Phase 3 pay for each. Capped, the split is sparser, but not enough (2,048 GPUs: still 4.06 M arcs,
    so :mod:`.slackcap`'s least units are tried before this cap: 607 k). The cap is kept only
    if the split passes the packing check (so k and the rate, hence the optimum, are unchanged);
    healthy fabrics (no link above ``need``) split once, as before.
    """
    need = int(np.broadcast_to(np.asarray(k, dtype=np.int64), (n_ranks,)).sum())
    capped = np.minimum(units, need)
    return [capped, units] if bool((capped < units).any()) else [units]


def _switch_distance(fabric: Fabric) -> np.ndarray:
    """Hop distance of every node from the nearest rank (0 for ranks)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    n = fabric.n_nodes
    graph = csr_matrix((np.ones(fabric.n_arcs), (fabric.tail, fabric.head)), shape=(n, n))
    return shortest_path(graph, unweighted=True, indices=np.arange(fabric.n_ranks)).min(axis=0)


def _farthest_first(fabric: Fabric, distance: np.ndarray) -> list[int]:
    """Switches by hop distance from the nearest rank, farthest first (aggregation, then ToRs and NVSwitches).

    Splitting the core first keeps every split small (an aggregation switch sees ToRs, not every GPU
    behind them), so the logical graph stays sparse: O(n · ports) arcs rather than O(n²).
    """
    return sorted(range(fabric.n_ranks, fabric.n_nodes), key=lambda w: (-distance[w], w))


def _prune_far_switches(fabric: Fabric, units: np.ndarray, k: int | np.ndarray, distance: np.ndarray) -> np.ndarray:
    """``units`` without the switches far from every rank, when the ranks' trees fit without them.

    A group of a few ranks on a large fabric (8 GPUs of a 2,048-GPU HPN) sees every switch of it,
    each with capacity to spare, and splitting them all costs tens of thousands of splits for
    routes no tree needs. Only for such sub-groups (the fabric has GPUs that hold no rank), the
    switches at distance >= d from every rank are dropped for the smallest d >= 2 at which the
    packing condition still holds (n max-flows per d tried; the first d that holds is kept):
    the rate and the trees per rank are unchanged, only the routes stay nearer the ranks.
    """
    if not fabric.foreign or fabric.n_nodes == fabric.n_ranks:
        return units
    finite = distance[np.isfinite(distance)]
    for reach in range(2, int(finite.max(initial=0)) + 1):
        far = distance >= reach
        kept = units * ~(far[fabric.tail] | far[fabric.head])
        live = kept > 0
        if packing_ok(fabric.n_nodes, fabric.n_ranks, fabric.tail[live], fabric.head[live], kept[live], k):
            return kept
    return units
