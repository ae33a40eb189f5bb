"""The fast paths equal main's materialized ones: routes, ring transfers, link loads, α-β times.

Reference: ``tests/reference_materialized.py`` (main's code, verbatim). Exact equality where the
computation is the same (routes, transfer columns, chunk tables, integer crossings), 1e-9 relative
where a closed form sums in another order (loads, times, algbw).
"""

from __future__ import annotations

import pickle
import random
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import BUILDER_CASES, small_topologies
from mccl.errors import Infeasible, TopologyError
from mccl.schedule import Collective, Schedule, Transfers, chunks_per_link, link_load, validate
from mccl.schedule.pattern import RingTransfers
from mccl.schedule.serialize import dumps_schedule, loads_schedule
from mccl.sim import evaluate
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import nccl_ring, nccl_ring_orders, ring_schedule
from mccl.topology import Node, NodeKind, Topology, fail2, rail_optimized, spine_leaf
from mccl.topology.routebatch import crc32_of_concatenation, crc32_parts
from mccl.topology.routing import MAX_ECMP_ROUTES, Router, router_for
from reference_materialized import ReferenceRouter, reference_direct_alltoall, reference_ring_schedule

RING_KINDS = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)


def layered_fabric(seed: int, *, gpus: int = 6, layers: int = 3, width: int = 3, parallel: int = 2) -> Topology:
    """GPUs under random switch layers with parallel links: wide, uneven ECMP groups."""
    rng = random.Random(seed)
    nodes = [Node(f"g{i}", NodeKind.GPU, host=f"h{i // 2}", rail=i % 2) for i in range(gpus)]
    switches = [[f"s{layer}.{i}" for i in range(width)] for layer in range(layers)]
    nodes += [Node(name, NodeKind.SWITCH) for layer in switches for name in layer]
    edges = []
    for i in range(gpus):
        for name in rng.sample(switches[0], rng.randint(1, width)):
            edges += [(f"g{i}", name, 100.0, 0.5), (name, f"g{i}", 100.0, 0.5)]
    for lower, upper in zip(switches, switches[1:], strict=False):
        for a in lower:
            for b in rng.sample(upper, rng.randint(1, width)):
                for _ in range(rng.randint(1, parallel)):
                    cap = rng.choice([50.0, 100.0, 400.0])
                    edges += [(a, b, cap, rng.random()), (b, a, cap, rng.random())]
    return Topology.from_edges(f"layered{seed}", nodes, edges)


def wide_ecmp_fabric() -> Topology:
    """17 × 17 parallel links between two GPUs' switches: 289 equal-cost routes, over the 256 cap."""
    nodes = [Node("g0", NodeKind.GPU), Node("g1", NodeKind.GPU), Node("a", NodeKind.SWITCH), Node("b", NodeKind.SWITCH),
             Node("c", NodeKind.SWITCH)]
    edges = [("g0", "a", 10.0, 1.0), ("a", "g0", 10.0, 1.0), ("c", "g1", 10.0, 1.0), ("g1", "c", 10.0, 1.0)]
    edges += [(x, y, 10.0, 1.0) for _ in range(17) for x, y in (("a", "b"), ("b", "a"), ("b", "c"), ("c", "b"))]
    return Topology.from_edges("wide", nodes, edges)


def assert_same_routing(topology: Topology, seed: int) -> None:
    """Every ordered node pair, asked in a shuffled order (near and far mixed, so the resumable
    search is resumed), gives main's routes, group size and ECMP choice, or main's error."""
    fast, reference = Router(topology), ReferenceRouter(topology)
    names = [node.id for node in topology.nodes]
    pairs = [(a, b) for a in names for b in names]
    random.Random(seed).shuffle(pairs)
    for src, dst in pairs:
        try:
            expected = reference.routes(src, dst)
        except TopologyError:
            with pytest.raises(TopologyError):
                fast.routes(src, dst)
            with pytest.raises(TopologyError):
                fast.route(src, dst)
            continue
        assert fast.routes(src, dst) == expected
        assert fast.n_routes(src, dst) == len(expected)
        for key in (None, f"k{src}{dst}", "ring0:1>2", "a2a:3>4:3>4"):
            assert fast.route(src, dst, key) == reference.route(src, dst, key)


@pytest.mark.parametrize("topology", BUILDER_CASES, ids=lambda t: t.name)
def test_routes_equal_mains_on_the_builders(topology):
    assert_same_routing(topology, 0)


@pytest.mark.parametrize("seed", range(6))
def test_routes_equal_mains_on_layered_fabrics_with_wide_ecmp(seed):
    assert_same_routing(layered_fabric(seed), seed)


def test_an_ecmp_group_over_the_cap_is_cut_as_mains():
    fabric = wide_ecmp_fabric()
    assert len(ReferenceRouter(fabric).routes("g0", "g1")) == MAX_ECMP_ROUTES
    assert_same_routing(fabric, 1)
    with pytest.raises(TopologyError, match="out of range"):
        Router(fabric).route_at("g0", "g1", MAX_ECMP_ROUTES)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_topologies(), st.integers(0, 1000))
def test_routes_equal_mains_on_random_fabrics(topology, seed):
    assert_same_routing(topology, seed)


def test_a_group_in_one_host_does_not_search_the_fabric():
    fabric = rail_optimized(4, 16, 8)  # 512 GPUs
    router = Router(fabric)
    for a in range(8):
        for b in range(8):
            if a != b:
                router.route(f"gpu{a}", f"gpu{b}")
    reached = max(len(search.distance) for search in router._searches.values())
    assert reached == 41  # itself, NVSwitch + ToR, 7 + 15 GPUs and 16 aggregation switches behind them; not 624 nodes
    router.route("gpu0", "gpu511")  # a farther destination resumes the same search
    assert len(router._searches[fabric.node_index["gpu0"]].distance) > 512


def test_router_for_shares_one_router_per_topology_and_lets_it_go():
    fabric = rail_optimized(1, 2, 4)
    assert router_for(fabric) is router_for(fabric)
    other = rail_optimized(1, 2, 4)
    assert router_for(other) is not router_for(fabric)
    router = router_for(other)
    del other
    import gc

    gc.collect()
    with pytest.raises(TopologyError, match="no longer exists"):
        _ = router.topology


def materialized_copy(schedule: Schedule) -> Schedule:
    """The same schedule with plain (column-stored) transfers: main's evaluation path."""
    transfers = schedule.transfers
    plain = Transfers(*(getattr(transfers, name) for name in ("chunk", "sender", "receiver", "step", "op",
                                                               "route_offsets", "route_links")))
    return Schedule(schedule.collective, schedule.ranks, schedule.chunks, plain, schedule.meta)


def assert_same_evaluation(fast: Schedule, reference: Schedule, topology: Topology, size: float) -> None:
    a, b = evaluate(fast, topology, size, step_overhead_us=0.7), evaluate(reference, topology, size, step_overhead_us=0.7)
    for name in ("time_s", "bandwidth_time_s", "latency_time_s", "algbw_gbs", "busbw_gbs", "steady_state_algbw_gbs"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9, abs=1e-15), name
    np.testing.assert_allclose(a.link_bytes, b.link_bytes, rtol=1e-9, atol=1e-9)
    assert a.bottleneck_links == b.bottleneck_links


def assert_same_ring(topology: Topology, collective: Collective, rings: list[list[int]], chunks: int) -> None:
    ranks = topology.gpus
    try:
        expected = reference_ring_schedule(topology, collective, ranks, rings, chunks=chunks)
    except Infeasible as error:
        with pytest.raises(Infeasible) as raised:
            ring_schedule(topology, collective, ranks, rings, chunks=chunks)
        assert str(raised.value).split(" through")[0] == str(error).split(" through")[0]  # the same first hop named
        return
    fast = ring_schedule(topology, collective, ranks, rings, chunks=chunks)
    assert isinstance(fast.transfers, RingTransfers)
    n_links = len(topology.links)
    # closed forms, before anything reads a column
    assert len(fast.transfers) == len(expected.transfers)
    assert fast.transfers.n_steps == expected.transfers.n_steps
    assert fast.transfers.max_link() == expected.transfers.max_link()
    np.testing.assert_array_equal(chunks_per_link(fast, n_links), chunks_per_link(expected, n_links))
    np.testing.assert_allclose(link_load(fast, n_links), link_load(expected, n_links), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fast.transfers.step_max_route_cost(topology.latencies_us),
                               expected.transfers.step_max_route_cost(topology.latencies_us), rtol=1e-9)
    assert_same_evaluation(fast, expected, topology, 3.0e8)
    assert_same_evaluation(fast, expected, topology, 64.0)
    assert fast.meta.achieved_gbs == pytest.approx(expected.meta.achieved_gbs, rel=1e-9)
    assert fast.meta.chunks_per_link == expected.meta.chunks_per_link
    assert [c.link for c in fast.meta.bottleneck_cut] == [c.link for c in expected.meta.bottleneck_cut]
    assert not fast.transfers.materialized
    # then the columns themselves, bit for bit
    assert fast.chunks == expected.chunks
    assert fast.transfers == expected.transfers
    assert fast.transfers.materialized
    for name in ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links"):
        column = getattr(fast.transfers, name)
        assert column.dtype == getattr(expected.transfers, name).dtype and not column.flags.writeable, name


@pytest.mark.parametrize("topology", BUILDER_CASES, ids=lambda t: t.name)
@pytest.mark.parametrize("collective", RING_KINDS)
def test_nccl_rings_equal_mains_on_the_builders(topology, collective):
    for chunks in (1, 3):
        assert_same_ring(topology, collective, nccl_ring_orders(topology, topology.gpus), chunks)


@pytest.mark.parametrize("seed", range(4))
def test_random_rings_equal_mains_on_layered_fabrics(seed):
    topology = layered_fabric(seed)
    rng = random.Random(seed)
    n = len(topology.gpus)
    rings = [rng.sample(range(n), n) for _ in range(rng.randint(1, 4))]
    for collective in RING_KINDS:
        assert_same_ring(topology, collective, rings, rng.randint(1, 3))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_topologies(), st.sampled_from(RING_KINDS), st.integers(1, 3), st.integers(1, 3), st.integers(0, 10**6))
def test_random_rings_equal_mains_on_random_fabrics(topology, collective, n_rings, chunks, seed):
    rng = random.Random(seed)
    n = len(topology.gpus)
    assert_same_ring(topology, collective, [rng.sample(range(n), n) for _ in range(n_rings)], chunks)


def test_a_static_ring_evaluated_on_a_faulted_fabric_equals_mains():
    fabric = rail_optimized(2, 2, 4)
    rings = nccl_ring_orders(fabric, fabric.gpus)
    for collective in RING_KINDS:
        fast = ring_schedule(fabric, collective, fabric.gpus, rings)
        assert_same_evaluation(fast, reference_ring_schedule(fabric, collective, fabric.gpus, rings), fail2(fabric),
                               2.0**30)


def test_lazy_ring_transfers_behave_as_transfers():
    fabric = spine_leaf(2, 2, 2, 2, 100, 50)
    schedule = nccl_ring(fabric, Collective.ALLREDUCE, chunks=2)
    copy = pickle.loads(pickle.dumps(schedule))
    assert not copy.transfers.materialized and "transfers" in repr(copy.transfers)
    validate(schedule, fabric)  # reads the columns: materializes, and the result is a valid AllReduce
    assert schedule.transfers.materialized
    assert copy.transfers == schedule.transfers
    assert loads_schedule(dumps_schedule(copy)) == loads_schedule(dumps_schedule(schedule))
    first = schedule.transfers[0]
    assert first.route == schedule.transfers.route(0)
    assert evaluate(materialized_copy(schedule), fabric, 1e6).time_s == pytest.approx(evaluate(copy, fabric, 1e6).time_s,
                                                                                      rel=1e-12)


def assert_same_direct(topology: Topology, chunks: int, pxn: bool) -> None:
    try:
        expected = reference_direct_alltoall(topology, topology.gpus, chunks=chunks, pxn=pxn)
    except Infeasible as error:
        with pytest.raises(Infeasible) as raised:
            direct_alltoall(topology, chunks=chunks, pxn=pxn)
        assert str(raised.value).split(" through")[0] == str(error).split(" through")[0]  # the same first hop named
        return
    fast = direct_alltoall(topology, chunks=chunks, pxn=pxn)
    assert fast.transfers == expected.transfers
    assert fast.chunks == expected.chunks
    assert fast.meta.achieved_gbs == pytest.approx(expected.meta.achieved_gbs, rel=1e-9)
    assert fast.meta.chunks_per_link == expected.meta.chunks_per_link
    assert_same_evaluation(fast, expected, topology, 1e8)


@pytest.mark.parametrize("topology", [*BUILDER_CASES, rail_optimized(2, 4, 4), layered_fabric(2), wide_ecmp_fabric()],
                         ids=lambda t: t.name)
def test_direct_alltoall_equals_mains(topology):
    for chunks, pxn in ((1, True), (2, True), (1, False)):
        assert_same_direct(topology, chunks, pxn)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_topologies(), st.integers(1, 2), st.booleans())
def test_direct_alltoall_equals_mains_on_random_fabrics(topology, chunks, pxn):
    assert_same_direct(topology, chunks, pxn)


def test_route_many_equals_route_with_the_same_keys():
    fabric = layered_fabric(5, gpus=8, layers=4, width=4, parallel=3)
    router, reference = Router(fabric), ReferenceRouter(fabric)
    rng = random.Random(5)
    names = [node.id for node in fabric.nodes]
    pairs = [(rng.choice(names), rng.choice(names)) for _ in range(2000)]
    keys = [f"key{i}" for i in range(len(pairs))]
    hashes = np.array([zlib.crc32(key.encode()) for key in keys], dtype=np.uint32)
    lengths, links = router.route_many(router.positions([a for a, _ in pairs]), router.positions([b for _, b in pairs]),
                                       hashes)
    starts = np.concatenate([[0], np.cumsum(np.maximum(lengths, 0))])
    for i, (src, dst) in enumerate(pairs):
        try:
            expected = reference.route(src, dst, keys[i])
        except TopologyError:
            assert lengths[i] == -1
            continue
        assert tuple(links[starts[i]:starts[i + 1]].tolist()) == expected


def test_crc32_of_concatenated_parts_equals_zlib():
    rng = np.random.default_rng(3)
    parts = [[f"a2a:{i}>".encode() for i in range(1200)], [f"{i}:".encode() for i in range(1200)],
             [str(i).encode() for i in range(1200)]]
    tables = [crc32_parts(texts) for texts in parts]
    rows = [rng.integers(0, 1200, 5000) for _ in parts]
    got = crc32_of_concatenation([(crc[r], length[r]) for (crc, length), r in zip(tables, rows, strict=True)])
    expected = [zlib.crc32(b"".join(texts[r[i]] for texts, r in zip(parts, rows, strict=True))) for i in range(5000)]
    assert got.tolist() == expected
