"""AllToAll column generation: optimum = compact LP, closed forms, rounding, warm start, budget, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.errors import Infeasible, SynthesisError
from mccl.schedule import Collective, dumps_schedule, link_load, loads_schedule, validate
from mccl.synth import optimize
from mccl.synth.alltoall import compact_lp, lp_optimum, minimal_steps, synthesize
from mccl.synth.direct import direct_alltoall
from mccl.topology import (
    Node,
    NodeKind,
    Topology,
    fail1,
    fail2,
    fail3,
    rail_optimized,
    single_switch,
    spine_leaf,
    switch_ring,
)

PAPER_WORST_GAP = 0.0213  # mccl-paper §6.1: the largest rounding error it measured

CASES = [
    rail_optimized(1, 2, 8),
    fail1(rail_optimized(1, 2, 8)),
    fail2(rail_optimized(1, 2, 8)),
    fail3(rail_optimized(1, 2, 8)),
    rail_optimized(2, 2, 4),
    rail_optimized(1, 3, 2, aggregation_switches=1),
    spine_leaf(2, 2, 2, 2, 100, 50),
    switch_ring(4, 1, 2, 100),
    single_switch(4, 100),
]


@pytest.fixture(scope="module")
def healthy_result():
    """The healthy 2×8 AllToAll result, with the solver state a warm restart uses."""
    return synthesize(rail_optimized(1, 2, 8))


@pytest.mark.parametrize("topology", CASES, ids=lambda t: t.name)
def test_cg_optimum_equals_compact_lp_and_rounded_schedule_validates(topology: Topology) -> None:
    schedule = synthesize(topology).schedule
    validate(schedule, topology)
    compact = compact_lp(topology)
    meta = schedule.meta
    assert meta.throughput_bound_gbs == pytest.approx(compact.algbw_gbs, rel=1e-6)
    assert meta.stat("optimal") == 1.0
    # The reported achieved algbw is what the schedule's own link loads allow.
    load = link_load(schedule, len(topology.links))
    used = load > 0
    assert meta.achieved_gbs == pytest.approx(schedule.n_ranks * np.min(topology.capacities_gbps[used] / 8 / load[used]))
    assert meta.achieved_gbs <= meta.throughput_bound_gbs * (1 + 1e-9)
    assert meta.stat("gap") == pytest.approx(1 - meta.achieved_gbs / meta.throughput_bound_gbs, abs=1e-12)
    assert meta.stat("gap") <= PAPER_WORST_GAP
    chunks_per_block = np.bincount(schedule.block_of_chunks(), minlength=schedule.n_ranks**2)
    assert chunks_per_block.max() <= 10
    fractions = schedule.chunks.fraction * 10
    assert np.allclose(fractions, np.round(fractions))  # whole tenths of a block


@pytest.mark.parametrize("gpus", [16, 32, 64])
def test_healthy_hpn_closed_form(gpus: int) -> None:
    """50·N/(N−8) GB/s with 400 Gbit/s NICs: every NIC carries its GPU's off-host share."""
    assert lp_optimum(rail_optimized(1, gpus // 8, 8)) == pytest.approx(50 * gpus / (gpus - 8), rel=1e-6)


def test_healthy_2x8_reaches_100_gbs_like_direct_pxn(healthy_result) -> None:
    assert healthy_result.schedule.meta.throughput_bound_gbs == pytest.approx(100.0, rel=1e-9)
    assert healthy_result.schedule.meta.achieved_gbs == pytest.approx(100.0, rel=1e-6)
    assert healthy_result.bound_gbs == pytest.approx(100.0, rel=1e-9) and healthy_result.optimal
    assert healthy_result.gap == pytest.approx(0.0, abs=1e-6) and healthy_result.warm_state is not None
    assert direct_alltoall(rail_optimized(1, 2, 8)).meta.achieved_gbs == pytest.approx(100.0)


def test_fail2_resynthesis_beats_direct_by_the_lp_ratio(healthy_result) -> None:
    """Fail2 (400 → 50 Gbit/s, 88%): host 0 keeps 7·400 + 50 Gbit/s for its 64 off-host blocks."""
    topology = fail2(rail_optimized(1, 2, 8))
    direct = direct_alltoall(topology).meta.achieved_gbs
    assert direct == pytest.approx(12.5)
    schedule = synthesize(topology, previous=healthy_result).schedule
    validate(schedule, topology)
    bound = schedule.meta.throughput_bound_gbs
    assert bound == pytest.approx(16 * (7 * 400 + 50) / 64 / 8)  # 89.0625 GB/s
    assert bound / direct == pytest.approx(7.125)  # the paper's "up to 7.12x"
    assert schedule.meta.achieved_gbs / direct >= 7.125 * (1 - PAPER_WORST_GAP)
    assert schedule.meta.stat("kept_fraction") > 0.5


@pytest.mark.parametrize("source", ["state", "file"])
@pytest.mark.parametrize("fault", [fail1, fail2, fail3], ids=["Fail1", "Fail2", "Fail3"])
def test_warm_start_reaches_the_cold_optimum(fault, source, healthy_result) -> None:
    """Both warm starts: from the solver state kept with an in-process schedule, and from the routes
    of the same schedule read back from its file (which carries no solver state)."""
    topology = fault(rail_optimized(1, 2, 8))
    previous = healthy_result if source == "state" else loads_schedule(dumps_schedule(healthy_result.schedule))
    warm = synthesize(topology, previous=previous).schedule
    cold = synthesize(topology).schedule
    validate(warm, topology)
    assert warm.meta.stat("restarted") == (1.0 if source == "state" else 0.0)
    assert warm.meta.throughput_bound_gbs == pytest.approx(cold.meta.throughput_bound_gbs, rel=1e-6)
    assert warm.meta.throughput_bound_gbs == pytest.approx(compact_lp(topology).algbw_gbs, rel=1e-6)
    assert warm.meta.stat("optimal") == 1.0
    assert dict(warm.meta.inputs)["warm"] == "true"


@pytest.mark.parametrize("fault", [fail1, fail2, fail3], ids=["Fail1", "Fail2", "Fail3"])
def test_file_warm_start_over_its_pivot_budget_falls_back_to_cold(fault, healthy_result) -> None:
    """A warm start from a schedule's routes whose master solves exceed their pivot budget (forced
    here by a budget of one pivot) starts over as cold and still reaches the cold optimum."""
    topology = fault(rail_optimized(1, 2, 8))
    previous = loads_schedule(dumps_schedule(healthy_result.schedule))
    warm = synthesize(topology, previous=previous, warm_pivots=1).schedule
    cold = synthesize(topology).schedule
    validate(warm, topology)
    assert warm.meta.stat("warm_fallback") == 1.0
    assert warm.meta.stat("warm_abandoned_pivots") >= 1.0
    assert warm.meta.stat("restarted") == 0.0
    assert warm.meta.stat("optimal") == 1.0
    assert warm.meta.throughput_bound_gbs == pytest.approx(cold.meta.throughput_bound_gbs, rel=1e-6)
    assert warm.meta.throughput_bound_gbs == pytest.approx(compact_lp(topology).algbw_gbs, rel=1e-6)
    assert dict(warm.meta.inputs)["warm"] == "true"
    # The default budget lets this small warm start finish on its own seeded columns.
    unforced = synthesize(topology, previous=previous).schedule
    assert unforced.meta.stat("warm_fallback") == 0.0
    assert unforced.meta.stat("warm_abandoned_pivots") == 0.0


def test_warm_pivot_budget_is_checked_and_unused_when_restarting_from_the_state(healthy_result) -> None:
    topology = fail1(rail_optimized(1, 2, 8))
    for bad in (0, -3, 2.5):
        with pytest.raises(SynthesisError, match="warm_pivots"):
            synthesize(topology, previous=healthy_result, warm_pivots=bad)
    restarted = synthesize(topology, previous=healthy_result, warm_pivots=1).schedule
    validate(restarted, topology)
    assert restarted.meta.stat("restarted") == 1.0
    assert restarted.meta.stat("warm_fallback") == 0.0


def test_warm_start_drops_routes_whose_links_are_gone(healthy_result) -> None:
    """Remove one NIC cable (both directions): routes over it are dropped, the rest seed the master."""
    base = rail_optimized(1, 2, 8)
    gone = {base.link_between("gpu3", "tor0.3").id, base.link_between("tor0.3", "gpu3").id}
    kept = [link for link in base.links if link.id not in gone]
    # Same name (same fabric), one cable less; link ids after the gap shift down.
    links = [type(link)(i, link.src, link.dst, link.gbps, link.latency_us) for i, link in enumerate(kept)]
    topology = Topology(base.name + "+cut(gpu3)", base.nodes, tuple(links))
    schedule = synthesize(topology, previous=healthy_result).schedule
    validate(schedule, topology)
    assert schedule.meta.stat("restarted") == 0.0  # other links: the solver state does not fit
    assert 0 < schedule.meta.stat("kept_fraction") < 1
    assert schedule.meta.throughput_bound_gbs == pytest.approx(compact_lp(topology).algbw_gbs, rel=1e-6)


def test_budgeted_run_returns_a_valid_schedule_with_a_correct_gap() -> None:
    topology = rail_optimized(1, 4, 8)
    optimum = lp_optimum(topology)
    # One seed round and a short budget usually stop the generation early; either way the gap
    # is measured against a proven bound, never below the optimum.
    schedule = synthesize(fail2(topology), time_limit_s=0.3, seed_rounds=1).schedule
    faulty_optimum = lp_optimum(fail2(topology))
    validate(schedule, fail2(topology))
    meta = schedule.meta
    assert meta.throughput_bound_gbs >= faulty_optimum * (1 - 1e-9)  # a bound, never below the optimum
    assert meta.achieved_gbs <= faulty_optimum * (1 + 1e-9)
    assert meta.stat("gap") == pytest.approx(1 - meta.achieved_gbs / meta.throughput_bound_gbs, abs=1e-12)
    assert optimum > faulty_optimum


def test_time_budget_too_small_for_the_first_master_is_a_clear_error() -> None:
    with pytest.raises(SynthesisError, match="time budget"):
        synthesize(rail_optimized(1, 8, 8), time_limit_s=1e-6)


@pytest.mark.slow  # a few seconds: out of the fast loop, run by CI
def test_step_bound_matches_the_time_expanded_compact_lp() -> None:
    topology = fail2(rail_optimized(1, 2, 8))
    for steps in (1, 2):
        schedule = synthesize(topology, max_steps=steps).schedule
        validate(schedule, topology)
        assert schedule.transfers.n_steps <= steps
        assert schedule.meta.throughput_bound_gbs == pytest.approx(
            compact_lp(topology, max_steps=steps).algbw_gbs, rel=1e-6)
    assert lp_optimum(topology, max_steps=1) < lp_optimum(topology)  # relays are needed under Fail2


def test_minimal_steps_binary_search() -> None:
    assert minimal_steps(rail_optimized(1, 2, 8)) == 1  # healthy: direct routes reach 100 GB/s
    topology = fail2(rail_optimized(1, 2, 8))
    steps = minimal_steps(topology)
    assert steps == 2
    auto = synthesize(topology, max_steps="auto").schedule
    assert auto.transfers.n_steps <= steps
    assert auto.meta.throughput_bound_gbs == pytest.approx(lp_optimum(topology), rel=1e-6)


def test_host_grouping_has_the_same_optimum() -> None:
    topology = fail2(rail_optimized(2, 2, 4))
    grouped = synthesize(topology, grouping="host").schedule
    validate(grouped, topology)
    assert grouped.meta.throughput_bound_gbs == pytest.approx(compact_lp(topology).algbw_gbs, rel=1e-6)


def test_metadata_and_optimize_entry_point(healthy_result) -> None:
    topology = rail_optimized(1, 2, 8)
    schedule = optimize(topology, Collective.ALLTOALL, chunks=10).schedule
    assert schedule.meta.synthesizer == "alltoall.cg"
    for name in ("solve_time_s", "columns", "iterations", "rounding_gap", "gap"):
        assert schedule.meta.stat(name) is not None
    cut = schedule.meta.bottleneck_cut
    assert cut and all(0 <= link.base_slack <= 1 for link in cut)
    nics = {topology.link_between(f"gpu{i}", f"tor0.{i % 8}").id for i in range(16)}
    nics |= {topology.link_between(f"tor0.{i % 8}", f"gpu{i}").id for i in range(16)}
    assert {link.link for link in cut} <= nics  # the LP's saturated links are NIC links
    assert schedule.meta.chunks_per_link


def test_rank_subset_and_relay_only_through_ranks() -> None:
    topology = rail_optimized(1, 2, 4)
    ranks = ["gpu0", "gpu2", "gpu5", "gpu7"]
    schedule = synthesize(topology, ranks).schedule
    validate(schedule, topology)
    assert schedule.ranks == tuple(ranks)
    assert schedule.meta.throughput_bound_gbs == pytest.approx(compact_lp(topology, ranks).algbw_gbs, rel=1e-6)


def test_infeasible_when_a_rank_is_reachable_only_through_a_non_rank_gpu() -> None:
    nodes = [Node(f"g{i}", NodeKind.GPU) for i in range(3)]
    edges = [("g0", "g1", 10.0, 0.0), ("g1", "g0", 10.0, 0.0), ("g1", "g2", 10.0, 0.0), ("g2", "g1", 10.0, 0.0)]
    chain = Topology.from_edges("chain", nodes, edges)
    assert synthesize(chain).schedule.meta.throughput_bound_gbs > 0  # g1 relays
    with pytest.raises(Infeasible, match="cannot reach|no outgoing"):
        synthesize(chain, ["g0", "g2"])


def test_bad_warm_start_inputs(healthy_result) -> None:
    with pytest.raises(SynthesisError, match="made for topology"):
        synthesize(rail_optimized(1, 4, 8), previous=healthy_result)
    with pytest.raises(SynthesisError, match="ranks differ"):
        synthesize(rail_optimized(1, 2, 8), ["gpu1", "gpu0"], previous=healthy_result)
    ring = optimize_ring_schedule()
    with pytest.raises(SynthesisError, match="allgather"):
        synthesize(rail_optimized(1, 2, 8), previous=ring)


def test_bad_options() -> None:
    topology = single_switch(3, 10)
    with pytest.raises(SynthesisError, match="chunks"):
        synthesize(topology, chunks=0)
    with pytest.raises(SynthesisError, match="time_limit_s"):
        synthesize(topology, time_limit_s=0)
    with pytest.raises(SynthesisError, match="max_steps"):
        synthesize(topology, max_steps=0)


def optimize_ring_schedule():
    from mccl.synth.ring import nccl_ring

    return nccl_ring(rail_optimized(1, 2, 8), "allgather")


def test_warm_start_keeps_the_previous_schedule_when_the_fault_is_off_its_cut() -> None:
    """On 64 GPUs, Fail1 slows an NVSwitch port the healthy schedule does not saturate: the LP optimum
    is unchanged and the previous chunks and transfers are kept (no new rounding); Fail2 hits the cut."""
    healthy = rail_optimized(1, 8, 8)
    previous = synthesize(healthy)
    off_cut = fail1(healthy)
    kept = synthesize(off_cut, previous=previous).schedule
    validate(kept, off_cut)
    assert kept.meta.stat("reused_previous") == 1.0
    assert kept.transfers == previous.schedule.transfers
    assert kept.meta.throughput_bound_gbs == pytest.approx(previous.bound_gbs, rel=1e-6)
    assert kept.meta.stat("gap") <= PAPER_WORST_GAP
    assert synthesize(fail2(healthy), previous=previous).schedule.meta.stat("reused_previous") == 0.0
