"""The grouped engine (rates per hop, compiled event loop) against the general flow engine."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import small_topologies
from mccl.errors import InvalidSchedule, MCCLError
from mccl.schedule import Chunks, Collective, Schedule, TransferList
from mccl.sim import BackgroundFlow, SimOptions, simulate_schedule
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import naive_ring
from mccl.topology import Router, apply_fault, rail_optimized, single_switch

MiB = 1 << 20


def both(schedule, fabric, size, **options):
    """The same run on both engines (executor's model unless ``options`` say otherwise)."""
    grouped = simulate_schedule(schedule, fabric, size, options=SimOptions.executor(engine="grouped", **options))
    flows = simulate_schedule(schedule, fabric, size, options=SimOptions.executor(engine="flows", **options))
    return grouped, flows


def assert_same(grouped, flows):
    assert grouped.end_s == pytest.approx(flows.end_s, rel=1e-9)
    assert grouped.n_transfers == flows.n_transfers
    assert len(grouped.critical_chain) == len(flows.critical_chain)
    for mine, theirs in zip(grouped.critical_chain, flows.critical_chain, strict=True):
        assert (mine.transfer, mine.chunk, mine.sender, mine.receiver, mine.step, mine.cause) == (
            theirs.transfer, theirs.chunk, theirs.sender, theirs.receiver, theirs.step, theirs.cause)
        # (bottleneck links may differ where two saturated links tie: either is the max-min bottleneck)
        assert (mine.start_s, mine.sent_s, mine.arrive_s) == pytest.approx(
            (theirs.start_s, theirs.sent_s, theirs.arrive_s), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("fault", ["healthy", "fail2"])
def test_tree_packing_on_the_2x8_hpn_matches_the_flow_engine(fault):
    """Many trees, relays, shared NIC links, a slowed link: same completion and critical chain."""
    from mccl.synth import optimize

    fabric = rail_optimized(1, 2, 8)
    if fault != "healthy":
        fabric = apply_fault(fabric, fault)
    schedule = optimize(fabric, "allgather").schedule
    grouped, flows = both(schedule, fabric, 16 * MiB)  # 3 slices a chunk
    assert_same(grouped, flows)


@settings(max_examples=30, deadline=None)
@given(small_topologies(), st.sampled_from(list(Collective)), st.integers(1, 3), st.integers(1, 4))
def test_random_fabrics_and_collectives_match_the_flow_engine(fabric, collective, chunks, slices):
    """Rings of every collective (a chunk crossing one hop twice, several partial sums to wait for) and
    direct AllToAll, on random fabrics, cut into 1–4 slices."""
    try:
        schedule = (direct_alltoall(fabric, chunks=chunks) if collective is Collective.ALLTOALL
                    else naive_ring(fabric, collective, chunks=chunks))
    except MCCLError:
        return
    grouped, flows = both(schedule, fabric, 1e6 * schedule.n_ranks, slice_bytes=None, slices=slices)
    assert_same(grouped, flows)


def test_auto_picks_the_grouped_engine_only_where_it_is_exact():
    fabric = single_switch(3, 100)
    ring = naive_ring(fabric, Collective.ALLGATHER)
    literal = simulate_schedule(ring, fabric, 3e6)  # step_priority 1e3: the flow engine
    assert literal.end_s > 0
    with pytest.raises(MCCLError, match="step_priority == 1"):
        simulate_schedule(ring, fabric, 3e6, options=SimOptions(engine="grouped"))
    with pytest.raises(MCCLError, match="alone"):
        simulate_schedule(ring, fabric, 3e6, options=SimOptions.executor(engine="grouped"),
                          background=[BackgroundFlow("bg", (0,))])
    with pytest.raises(MCCLError, match="engine must be one of"):
        SimOptions(engine="fast")
    shared = simulate_schedule(ring, fabric, 3e6, options=SimOptions.executor(), background=[BackgroundFlow("bg", (0,))])
    alone = simulate_schedule(ring, fabric, 3e6, options=SimOptions.executor())
    assert shared.end_s > alone.end_s  # with background traffic: the flow engine, which models it


def test_a_sender_that_never_holds_its_chunk_is_rejected_by_the_grouped_engine():
    fabric = single_switch(3, 100)
    transfers = TransferList()
    transfers.add(0, 1, 2, 0, Router(fabric).route("gpu1", "gpu2"))
    bad = Schedule(Collective.ALLGATHER, fabric.gpus, Chunks([0], [-1], [1.0]), transfers.freeze())
    with pytest.raises(InvalidSchedule, match="never receives it"):
        simulate_schedule(bad, fabric, 3e6, options=SimOptions.executor(engine="grouped"))
    assert np.isfinite(simulate_schedule(naive_ring(fabric, Collective.ALLGATHER), fabric, 3e6,
                                         options=SimOptions.executor(engine="grouped")).algbw_gbs)


def test_live_class_lists_follow_activations_in_any_order():
    """Per link, the live segment holds exactly the classes with flows on that link (swap removal)."""
    from mccl.sim.classsolve import activate, deactivate

    rng = np.random.default_rng(7)
    n_classes, n_links = 40, 12
    routes = [rng.choice(n_links, size=rng.integers(1, 5), replace=False) for _ in range(n_classes)]
    c_lo = np.zeros(n_classes + 1, dtype=np.int64)
    c_lo[1:] = np.cumsum([len(route) for route in routes])
    c_links = np.concatenate(routes).astype(np.int64)
    l_lo = np.zeros(n_links + 1, dtype=np.int64)
    l_lo[1:] = np.cumsum(np.bincount(c_links, minlength=n_links))
    a_cnt = np.zeros(n_links, dtype=np.int64)
    a_cls, a_back = np.zeros(len(c_links), dtype=np.int64), np.zeros(len(c_links), dtype=np.int64)
    a_pos = np.zeros(len(c_links), dtype=np.int64)
    live, live_pos = np.zeros(n_classes, dtype=np.int64), np.zeros(n_classes, dtype=np.int64)
    active: set[int] = set()
    n_live = 0
    for k in rng.integers(0, n_classes, size=400):
        k = int(k)
        if k in active:
            n_live = deactivate(k, c_lo, c_links, l_lo, a_cnt, a_cls, a_back, a_pos, live, live_pos, n_live)
            active.remove(k)
        else:
            n_live = activate(k, c_lo, c_links, l_lo, a_cnt, a_cls, a_back, a_pos, live, live_pos, n_live)
            active.add(k)
        assert sorted(live[:n_live]) == sorted(active)
        for link in range(n_links):
            on_link = {c for c in active if link in routes[c]}
            assert sorted(a_cls[l_lo[link]:l_lo[link] + a_cnt[link]]) == sorted(on_link)


def test_depth_chosen_packing_under_a_fault_matches_the_flow_engine():
    """What treepack.depth issues on the 2×8 HPN with a slowed link (fewer trees per source, hops that go
    idle between slices and come back): both engines agree."""
    from mccl.synth import optimize

    fabric = apply_fault(rail_optimized(1, 2, 8), "fail1")
    schedule = optimize(fabric, "allgather", method="treepack.depth", size_bytes=64 * MiB,
                        candidates=("packing", "latency_aware")).schedule
    grouped, flows = both(schedule, fabric, 64 * MiB)
    assert_same(grouped, flows)


def test_rail_adapted_trees_under_a_fault_match_the_flow_engine():
    """The rail trees routed around a slow NVSwitch port (senders and entries moved, depth 2): both engines agree."""
    from mccl.synth.treepack.railadapt import rail_adapted_allgather

    fabric = apply_fault(rail_optimized(1, 2, 8), "fail1")
    schedule = rail_adapted_allgather(fabric, fabric.gpus)
    grouped, flows = both(schedule, fabric, 4 * MiB)
    assert_same(grouped, flows)
