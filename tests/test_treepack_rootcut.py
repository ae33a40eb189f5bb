"""Phase 2's check as one rooted minimum cut (Hao–Orlin, issue 17): the same answer as a max-flow per sink."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mccl.synth.common import check_ranks
from mccl.synth.cutbound import CutChecker, max_rate
from mccl.synth.maxflow import FlowNet
from mccl.synth.treepack.fabric import fabric_of
from mccl.synth.treepack.packcheck import packing_ok, packing_ok_by_flows
from mccl.synth.treepack.rootcut import rooted_min_cut
from mccl.synth.treepack.rounding import best_integral_rate
from mccl.synth.treepack.switch_removal import remove_switches
from mccl.topology import fail1, fail2, fail3, rail_optimized


@st.composite
def _graphs(draw: st.DrawFn):
    """Random directed multigraphs (2–12 nodes, parallel arcs and self-loops allowed), a source, candidate sinks."""
    n = draw(st.integers(2, 12))
    m = draw(st.integers(1, 45))
    tails = np.array(draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m)), dtype=np.int64)
    heads = np.array(draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m)), dtype=np.int64)
    caps = np.array(draw(st.lists(st.integers(0, 9), min_size=m, max_size=m)), dtype=np.int64)
    source = draw(st.integers(0, n - 1))
    candidates = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    candidates[source] = False
    candidates[(source + 1) % n] = True
    return n, source, tails, heads, caps, candidates


def _cut_of(side: np.ndarray, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray) -> int:
    return int(caps[~side[tails] & side[heads]].sum())


@settings(max_examples=80, deadline=None)
@given(_graphs(), st.integers(-2, 2))
def test_rooted_cut_is_the_least_max_flow(case, offset: int) -> None:
    """The value is min over candidates of maxflow(source, t), the returned side is a cut of that value
    (holding a candidate, not the source), and deciding against ``need`` answers value >= need."""
    n, source, tails, heads, caps, candidates = case
    net = FlowNet(n)
    net.add_arcs(tails, heads, caps)
    least = min(net.max_flow(source, int(t)) for t in np.flatnonzero(candidates))
    cut = rooted_min_cut(n, source, tails, heads, caps, candidates)
    assert cut.value == least
    assert not cut.sink_side[source] and cut.sink_side[candidates].any()
    assert _cut_of(cut.sink_side, tails, heads, caps) == least
    need = max(0, least + offset)
    decided = rooted_min_cut(n, source, tails, heads, caps, candidates, need=need)
    assert (decided.value >= need) == (least >= need)


@st.composite
def _packing_cases(draw: st.DrawFn):
    """Ranks and switches (a switch never a sink), arcs into s* (drained excess), uniform or per-rank k."""
    n_ranks = draw(st.integers(1, 8))
    n_nodes = n_ranks + draw(st.integers(0, 4))
    m = draw(st.integers(1, 40))
    tails = np.array(draw(st.lists(st.integers(0, n_nodes - 1), min_size=m, max_size=m)), dtype=np.int64)
    heads = np.array(draw(st.lists(st.integers(0, n_nodes), min_size=m, max_size=m)), dtype=np.int64)
    caps = np.array(draw(st.lists(st.integers(0, 12), min_size=m, max_size=m)), dtype=np.int64)
    k = draw(st.one_of(st.integers(0, 3), st.lists(st.integers(0, 3), min_size=n_ranks, max_size=n_ranks)))
    return n_nodes, n_ranks, tails, heads, caps, np.asarray(k)


@settings(max_examples=80, deadline=None)
@given(_packing_cases())
def test_packing_ok_agrees_with_a_max_flow_per_rank(case) -> None:
    n_nodes, n_ranks, tails, heads, caps, k = case
    assert packing_ok(n_nodes, n_ranks, tails, heads, caps, k) == packing_ok_by_flows(n_nodes, n_ranks, tails, heads,
                                                                                      caps, k)


@pytest.mark.parametrize("fault", [None, fail1, fail2, fail3])
def test_hpn_logical_graph_check_agrees(fault) -> None:
    """On the 32-GPU rail fabric's logical graph (healthy and the paper's faults): the split's k packs, k + 1
    does not, both by the rooted cut and by 32 max-flows, and the rooted cut's value is the least max-flow."""
    topology = rail_optimized(1, 4, 8)
    topology = fault(topology) if fault else topology
    ranks = check_ranks(topology, None)
    fabric = fabric_of(topology, ranks)
    checker = CutChecker(fabric)
    integral = best_integral_rate(fabric, 10, max_rate(fabric, checker=checker).rate_gbps, checker)
    logical = remove_switches(fabric, integral.units, integral.k, fabric.groups, straighten=False)
    keys = list(logical.units)
    tails = np.array([u for u, _ in keys], dtype=np.int64)
    heads = np.array([v for _, v in keys], dtype=np.int64)
    caps = np.array([logical.units[key] for key in keys], dtype=np.int64)
    n = logical.n_ranks
    for k in (integral.k, integral.k + 1):
        assert packing_ok(n, n, tails, heads, caps, k) == packing_ok_by_flows(n, n, tails, heads, caps, k) == (
            k == integral.k)
    net = FlowNet(n + 1)
    net.add_arcs(tails, heads, caps)
    net.add_arcs(np.full(n, n), np.arange(n), np.full(n, integral.k + 1))
    least = min(net.max_flow(n, v) for v in range(n))
    every = np.concatenate([np.ones(n, dtype=bool), [False]])
    assert rooted_min_cut(n + 1, n, np.concatenate([tails, np.full(n, n)]), np.concatenate([heads, np.arange(n)]),
                          np.concatenate([caps, np.full(n, integral.k + 1)]), every).value == least
