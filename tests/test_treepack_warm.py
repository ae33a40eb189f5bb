"""Warm start of the tree packing by keep-and-repair (mccl-paper §4.3): same optimum as cold, valid schedules.

The warm path keeps the previous trees that fit and repairs the rest on their physical routes
(:mod:`mccl.synth.treepack.repair`); these tests check that it is the path taken on the
paper's faults, that its fractional optimum is cold's exactly, that it never rounds below cold's
rounded rate, and that what it writes validates — on HPN faults and on random degradations.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import small_topologies
from mccl.schedule import Collective, link_load, validate
from mccl.synth.ring import nccl_ring
from mccl.synth.treepack import synthesize, synthesize_reducescatter
from mccl.synth.treepack.forest import forest_of, lower_rows, tree_depths
from mccl.topology import Node, NodeKind, Topology, degrade, fail1, fail2, fail3, rail_optimized

FAULTS = [fail1, fail2, fail3]


def _check_warm(warm, cold, topology: Topology, *, repaired: bool = True) -> None:
    """Valid; the fractional optimum is cold's exactly; the rounded rate is at least cold's rounded rate."""
    validate(warm, topology)
    assert warm.meta.throughput_bound_gbs == cold.meta.throughput_bound_gbs
    n = warm.n_ranks
    floor = cold.meta.stat("integral_rate_gbps") * n / 8.0
    assert warm.meta.achieved_gbs >= floor * (1 - 1e-9)
    assert warm.meta.achieved_gbs <= warm.meta.throughput_bound_gbs * (1 + 1e-9)
    assert warm.meta.achieved_gbs == pytest.approx(warm.meta.throughput_bound_gbs * (1 - warm.meta.stat("rounding_gap")))
    k = int(warm.meta.stat("trees_per_source"))
    blocks = warm.block_of_chunks()
    assert np.array_equal(np.bincount(blocks, minlength=n), np.full(n, k))
    assert warm.meta.stat("max_depth") == warm.transfers.n_steps
    if repaired:
        assert warm.meta.stat("warm_repair") == 1.0


@pytest.mark.parametrize("fault", FAULTS, ids=["Fail1", "Fail2", "Fail3"])
@pytest.mark.parametrize("shape", [(1, 4, 8), (2, 2, 4)], ids=lambda s: "x".join(map(str, s)))
def test_warm_repair_under_paper_faults(fault, shape) -> None:
    healthy = rail_optimized(*shape)
    previous = synthesize(healthy).schedule
    faulted = fault(healthy)
    cold = synthesize(faulted).schedule
    warm = synthesize(faulted, previous=previous).schedule
    _check_warm(warm, cold, faulted)
    assert warm.meta.achieved_gbs == pytest.approx(cold.meta.achieved_gbs, rel=1e-9)
    assert 0.3 <= warm.meta.stat("reused_trees_fraction") < 1.0  # some trees kept whole, some repaired
    assert warm.meta.stat("kept_fraction") >= 0.9


def test_warm_on_unchanged_fabric_keeps_every_tree() -> None:
    healthy = rail_optimized(1, 4, 8)
    previous = synthesize(healthy).schedule
    warm = synthesize(healthy, previous=previous).schedule
    _check_warm(warm, previous, healthy)
    assert warm.meta.stat("reused_trees_fraction") == 1.0
    assert warm.meta.stat("repaired_trees") == 0.0
    assert np.array_equal(link_load(warm, len(healthy.links)), link_load(previous, len(healthy.links)))


@pytest.mark.parametrize("degradation", [0.5, 0.88])
def test_reducescatter_warm_repair(hpn: Topology, degradation: float) -> None:
    previous = synthesize_reducescatter(hpn).schedule
    faulted = degrade(hpn, ("gpu0", "tor0.0"), factor=1 - degradation, duplex=True)
    cold = synthesize_reducescatter(faulted).schedule
    warm = synthesize_reducescatter(faulted, previous=previous).schedule
    _check_warm(warm, cold, faulted)
    assert warm.collective is Collective.REDUCESCATTER


def test_warm_with_more_chunks_than_before_and_latency_aware(hpn: Topology) -> None:
    """k grows from 2 to the best k ≤ 10: the extra trees are repaired from copies of kept ones."""
    previous = synthesize(hpn, chunks=2).schedule
    faulted = fail2(hpn)
    cold = synthesize(faulted).schedule
    warm = synthesize(faulted, previous=previous).schedule
    _check_warm(warm, cold, faulted)
    assert warm.meta.stat("trees_per_source") > 2
    shallow = synthesize(faulted, previous=previous, latency_aware=True).schedule
    _check_warm(shallow, cold, faulted)


def test_warm_from_a_ring(hpn: Topology) -> None:
    """Another synthesizer's AllGather (rings: each chunk a chain) seeds the repair just as well."""
    ring = nccl_ring(hpn, Collective.ALLGATHER)
    faulted = fail1(hpn)
    _check_warm(synthesize(faulted, previous=ring).schedule, synthesize(faulted).schedule, faulted)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_topologies(), st.data())
def test_warm_equals_cold_on_random_degradations(topology: Topology, data: st.DataObject) -> None:
    """Random fabrics, random per-direction slow-downs: the warm schedule validates, its optimum is cold's
    exactly and its rounded rate is at least cold's (whether it repaired or fell back to the cold packer)."""
    factors = data.draw(st.lists(st.sampled_from([1.0, 1.0, 0.9, 0.5, 0.25, 0.1, 2.0]),
                                 min_size=len(topology.links), max_size=len(topology.links)))
    degraded = topology.with_capacities(topology.capacities_gbps * np.array(factors))
    chunks = data.draw(st.integers(1, 10))
    for synth in (synthesize, synthesize_reducescatter):
        previous = synth(topology, chunks=data.draw(st.integers(1, 10))).schedule
        cold = synth(degraded, chunks=chunks).schedule
        _check_warm(synth(degraded, previous=previous, chunks=chunks).schedule, cold, degraded, repaired=False)


def _one_way_fabric() -> Topology:
    """4 GPUs on 3 hosts, 3 switches, cables plus one-way links (found by the random-degradation search)."""
    nodes = [Node("g0", NodeKind.GPU, host="h2"), Node("g1", NodeKind.GPU, host="h2"), Node("g2", NodeKind.GPU, host="h0"),
             Node("g3", NodeKind.GPU, host="h1")] + [Node(f"s{i}", NodeKind.SWITCH) for i in range(3)]
    cables = [("g1", "g3", 313.0), ("g3", "g2", 560.0), ("g2", "s0", 100.0), ("s0", "s2", 64.6), ("s2", "g0", 740.0),
              ("g0", "s1", 779.0), ("s1", "g1", 776.0)]
    edges = [edge for a, b, gbps in cables for edge in ((a, b, gbps, 0.0), (b, a, gbps, 0.0))]
    edges += [("g3", "s1", 53.0, 0.0), ("s1", "g1", 999.0, 0.0), ("s2", "g1", 252.0, 0.0), ("g0", "s1", 333.0, 0.0),
              ("s2", "s0", 1.5, 0.0), ("s1", "g2", 21.9, 0.0), ("s2", "s1", 693.0, 0.0)]
    return Topology.from_edges("one-way", nodes, edges)


def test_stuck_repair_falls_back_to_cold_packing() -> None:
    """Here the greedy re-attachment spends a tight cut and gets stuck: the cold packer (previous arcs first)
    takes over, and the result is still valid and exactly as good as cold."""
    fabric = _one_way_fabric()
    factors = [2.0, 0.1, 2.0, 2.0, 1.0, 2.0, 0.25, 2.0, 2.0, 2.0, 1.0, 1.0, 2.0, 0.1, 0.5, 0.9, 0.25, 1.0, 0.1, 0.5, 0.5]
    degraded = fabric.with_capacities(fabric.capacities_gbps * np.array(factors))
    previous = synthesize(fabric, chunks=7).schedule
    cold = synthesize(degraded).schedule
    warm = synthesize(degraded, previous=previous).schedule
    _check_warm(warm, cold, degraded, repaired=False)
    assert warm.meta.stat("warm_repair") == 0.0 and warm.meta.stat("reused_trees_fraction") == 0.0
    assert warm.meta.achieved_gbs == pytest.approx(cold.meta.achieved_gbs, rel=1e-9)
    assert 0.5 <= warm.meta.stat("kept_fraction") <= 1.0


@pytest.mark.slow  # a few seconds: out of the fast loop, run by CI
def test_a_recovery_is_packed_as_cold() -> None:
    """Back to the healthy fabric from a cold Fail2 schedule (64 GPUs): the optimum rises above the
    previous schedule's bound, where the repair gets stuck and the previous arcs, made to route around
    the faults, mislead the cold packer (at 512 GPUs: 3.7 s of failed repair, then 3.1 s of packing
    against cold's 1.3 s; before the warm budget, 539 s). So it is packed as cold: cold's trees exactly,
    cold's max-flows, cold's k (the previous one is not tried first)."""
    healthy = rail_optimized(1, 8, 8)
    previous = synthesize(fail2(healthy)).schedule
    cold = synthesize(healthy).schedule
    warm = synthesize(healthy, previous=previous).schedule
    _check_warm(warm, cold, healthy, repaired=False)
    assert warm.meta.stat("warm_repair") == 0.0 and warm.meta.stat("warm_prefer_dropped") is None
    for column in ("chunk", "sender", "receiver", "step", "route_links"):
        assert np.array_equal(getattr(warm.transfers, column), getattr(cold.transfers, column)), column
    assert warm.meta.stat("max_flows") <= cold.meta.stat("max_flows") + 64  # Phase 1's hint cut: a few flows


def test_tree_depths_flags_non_trees() -> None:
    """Chunk 0: a valid tree of root 0; 1: a cycle 1 -> 2 -> 1; 2: rank 2 reached twice; 3: into the root."""
    n = 3
    root = np.array([0, 0, 0, 1])
    rows = [(0, 0, 1), (0, 1, 2), (1, 1, 2), (1, 2, 1), (2, 0, 2), (2, 1, 2), (3, 0, 1), (3, 2, 0)]
    chunk, tail, head = (np.array(column) for column in zip(*rows, strict=True))
    depth, valid = tree_depths(n, root, chunk, tail, head)
    assert valid.tolist() == [True, False, False, False]
    assert depth[0].tolist() == [0, 1, 2]


def test_forest_of_another_synthesizers_schedule() -> None:
    """On a ring's schedule (steps read as depths where they are, pointer doubling where not), forest_of
    finds the same depths and tree flags as pointer doubling alone."""
    topology = rail_optimized(1, 2, 8)
    ring = nccl_ring(topology, Collective.ALLGATHER)
    forest = forest_of(ring, Collective.ALLGATHER)
    depth, valid = tree_depths(forest.n, forest.root, forest.row_chunk, forest.tail, forest.head)
    assert np.array_equal(forest.valid, valid) and np.array_equal(forest.depth, depth)


@pytest.mark.parametrize("reduce", [False, True], ids=["allgather", "reducescatter"])
def test_forest_round_trip(hpn: Topology, reduce: bool) -> None:
    """Reading a schedule's trees and lowering all of them again gives the same loads and a valid schedule."""
    synth = synthesize_reducescatter if reduce else synthesize
    schedule = synth(hpn).schedule
    collective = schedule.collective
    forest = forest_of(schedule, collective)
    assert forest.valid.all()
    # The depths read off the steps (forest_of's fast path) are the pointer-doubling ones.
    depth, valid = tree_depths(forest.n, forest.root, forest.row_chunk, forest.tail, forest.head)
    assert np.array_equal(depth, forest.depth) and valid.all()
    k = len(schedule.chunks) // schedule.n_ranks
    rows = np.arange(len(forest.tail))
    chunk = forest.row_chunk  # treepack numbers chunks root by root: chunk c is root c // k's
    empty = np.zeros(0, dtype=np.int64)
    again, _ = lower_rows(collective, schedule.ranks, k, forest, rows, chunk, empty, empty, empty, np.zeros(1, dtype=np.int64), empty, forest.depth)
    validate(again, hpn)
    assert np.array_equal(link_load(again, len(hpn.links)), link_load(schedule, len(hpn.links)))
    assert np.array_equal(np.sort(again.transfers.step), np.sort(schedule.transfers.step))
