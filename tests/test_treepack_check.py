"""Phase 3's packing check (issue 17): ranks proven by the rank and host rules agree with a max-flow per rank."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mccl.synth.cutbound import CutChecker, max_rate
from mccl.synth.maxflow import FlowNet
from mccl.synth.treepack.balance import split_switches
from mccl.synth.treepack.fabric import fabric_of
from mccl.synth.treepack.growkernel import host_index
from mccl.synth.treepack.packcheck import packs
from mccl.synth.treepack.rounding import best_integral_rate
from mccl.topology import rail_optimized


def _naive(n: int, tails: np.ndarray, heads: np.ndarray, residual: np.ndarray, untouched: np.ndarray) -> bool:
    """The definition: maxflow(s*, v) >= Σ untouched for every rank v (s* → r of capacity untouched[r])."""
    need = int(untouched.sum())
    if need == 0:
        return True
    net = FlowNet(n + 1)
    net.add_arcs(tails, heads, residual)
    net.add_arcs(np.full(n, n), np.arange(n), untouched)
    return all(net.max_flow(n, v) >= need for v in range(n))


@st.composite
def _check_cases(draw: st.DrawFn):
    """Random rank graphs (2–10 ranks) with hosts of 1–4 ranks, fat or thin intra-host arcs, demands 0–3."""
    n = draw(st.integers(2, 10))
    hosts = np.sort(np.array(draw(st.lists(st.integers(0, n // 2), min_size=n, max_size=n)), dtype=np.int64))
    pairs = [(u, v) for u in range(n) for v in range(n) if u != v]
    chosen = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=len(pairs), unique=True))
    tails = np.array([u for u, _ in chosen], dtype=np.int64)
    heads = np.array([v for _, v in chosen], dtype=np.int64)
    units = np.array(draw(st.lists(st.integers(0, 8), min_size=len(chosen), max_size=len(chosen))), dtype=np.int64)
    units[hosts[tails] == hosts[heads]] *= draw(st.sampled_from([1, 10]))  # NVSwitch-like fat arcs, or not
    untouched = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.int64)
    return n, tails, heads, units, untouched, host_index(n, hosts)


@settings(max_examples=60, deadline=None)
@given(_check_cases())
def test_check_agrees_with_a_max_flow_per_rank(case) -> None:
    """Whatever the rules prove, the verdict (the rest by one rooted cut) is the definition's, with at most one solve."""
    n, tails, heads, units, untouched, host = case
    ok, flows = packs(n, tails, heads, units, untouched, host)
    assert ok == _naive(n, tails, heads, units, untouched)
    assert flows <= 1


def test_rail_fabric_check_needs_few_flows() -> None:
    """On a rail-optimized fabric's logical graph with the trees of two roots still to pack (late in a
    packing, where checks happen) the host rule proves a host per flow or better: at most one max-flow
    per host, where the definition asks one per rank."""
    topology = rail_optimized(1, 4, 8)
    fabric = fabric_of(topology, [node.id for node in topology.nodes if node.is_gpu])
    checker = CutChecker(fabric)
    integral = best_integral_rate(fabric, 10, max_rate(fabric, checker=checker).rate_gbps, checker)
    split = split_switches(fabric, integral)
    keys = list(split.logical.units)
    tails = np.array([u for u, _ in keys], dtype=np.int64)
    heads = np.array([v for _, v in keys], dtype=np.int64)
    units = np.array([split.logical.units[key] for key in keys], dtype=np.int64)
    n = fabric.n_ranks
    untouched = np.zeros(n, dtype=np.int64)
    untouched[[5, 30]] = split.k
    host = host_index(n, fabric.groups)
    ok, flows = packs(n, tails, heads, units, untouched, host)
    assert ok and _naive(n, tails, heads, units, untouched)
    assert 1 <= flows <= int(host.max()) + 1
    short = units.copy()
    short[heads == 0] = 0  # rank 0 unreachable: the check fails
    assert not packs(n, tails, heads, short, untouched, host)[0]
