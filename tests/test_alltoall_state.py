"""Warm restarts from the solver state a synthesis result carries (``mccl.synth.alltoall.state``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import small_topologies
from mccl.schedule import dumps_schedule, loads_schedule, validate
from mccl.synth.alltoall import compact_lp, synthesize
from mccl.synth.alltoall.network import build_network
from mccl.topology import Topology, degrade, fail1, fail2, fail3, rail_optimized


@pytest.fixture(scope="module")
def healthy64():
    topology = rail_optimized(1, 8, 8)
    return topology, synthesize(topology)


def test_an_off_cut_fault_keeps_the_optimal_basis_and_takes_no_pivot(healthy64) -> None:
    """Fail1 slows an NVSwitch port that no optimal solution saturates: the old basis stays optimal."""
    topology, previous = healthy64
    state = previous.warm_state
    assert state is not None and state.fits(build_network(fail1(topology)), None, "tensor")
    assert state.basis_still_optimal(build_network(fail1(topology)).capacity)
    warm = synthesize(fail1(topology), previous=previous)
    validate(warm.schedule, fail1(topology))
    assert warm.schedule.meta.stat("restarted") == 1.0
    assert warm.schedule.meta.stat("iterations") == 0.0
    assert warm.schedule.meta.stat("optimal") == 1.0
    assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(previous.schedule.meta.throughput_bound_gbs, rel=1e-9)


def test_a_change_the_repair_cannot_prove_restarts_from_the_slack_basis() -> None:
    """A ToR uplink and an NVSwitch port slowed (tight links): the old basis is infeasible and the repair
    is declined (``test_alltoall_repair``), so the master restarts over the old columns from the slack basis."""
    topology = rail_optimized(1, 4, 8)
    previous = synthesize(topology)
    slowed = degrade(degrade(topology, ("tor0.5", "agg3"), factor=0.828), ("nvs1", "gpu12"), factor=0.158)
    assert not previous.warm_state.basis_still_optimal(build_network(slowed).capacity)
    warm = synthesize(slowed, previous=previous)
    validate(warm.schedule, slowed)
    assert warm.schedule.meta.stat("restarted") == 1.0 and warm.schedule.meta.stat("repair_declined") == 1.0
    assert warm.schedule.meta.stat("iterations") > 0
    assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(synthesize(slowed).schedule.meta.throughput_bound_gbs, rel=1e-9)


def test_the_way_back_from_a_file_warm_result_costs_what_cold_does() -> None:
    """healthy (a schedule from a file, no state) → Fail2 (warm from its routes) → healthy (from that
    result's state): the repair is declined (the Fail2 optimum saturates so many links that a recovery
    would re-route over a quarter of the pairs) and the old basis is lost; the restart over the old
    columns, priced for the scarcer fabric, took 320 master pivots here against the cold run's 116
    (at 512 GPUs 282 s CPU against 33 s). A recovery that loses the basis now takes the cold path
    straight away: the cold run's pivots, recorded as a fallback with no pivot abandoned."""
    topology = rail_optimized(1, 4, 8)
    cold = synthesize(topology)
    middle = synthesize(fail2(topology), previous=loads_schedule(dumps_schedule(cold.schedule)))
    assert middle.stats.warm is not None and not middle.stats.warm.restarted
    back = synthesize(topology, previous=middle)
    validate(back.schedule, topology)
    warm = back.stats.warm
    assert warm is not None and warm.restarted and warm.repair_declined
    assert warm.warm_fallback and warm.warm_abandoned_pivots == 0
    assert back.stats.iterations == cold.stats.iterations <= 200
    assert back.stats.lp_gbs == pytest.approx(cold.stats.lp_gbs, rel=1e-9)
    assert back.schedule.meta.stat("optimal") == 1.0


def test_a_restart_over_its_pivot_budget_falls_back_to_cold(monkeypatch) -> None:
    """A restart from the slack basis over the old columns (no capacity grew) that takes more pivots
    than ``restart_pivot_budget`` allows (one, forced here) starts over as cold, recorded in the stats."""
    import mccl.synth.alltoall.solve as solve  # where the restart reads its budget

    topology = rail_optimized(1, 4, 8)
    previous = synthesize(topology)
    slowed = degrade(degrade(topology, ("tor0.5", "agg3"), factor=0.828), ("nvs1", "gpu12"), factor=0.158)
    unforced = synthesize(slowed, previous=previous)
    assert unforced.stats.warm.restarted and not unforced.stats.warm.warm_fallback
    monkeypatch.setattr(solve, "restart_pivot_budget", lambda master: 1)
    warm = synthesize(slowed, previous=previous)
    validate(warm.schedule, slowed)
    cold = synthesize(slowed)
    assert warm.stats.warm.restarted and warm.stats.warm.repair_declined
    assert warm.stats.warm.warm_fallback and warm.stats.warm.warm_abandoned_pivots >= 1
    assert warm.stats.iterations == cold.stats.iterations  # the cold run's master, from scratch
    assert warm.stats.lp_gbs == pytest.approx(cold.stats.lp_gbs, rel=1e-9)
    assert warm.schedule.meta.stat("optimal") == 1.0


def test_states_chain_and_are_not_shared_between_restarts(healthy64) -> None:
    """A warm result keeps its own state (Fail2 then Fail1 on top of it), and restarting from a state
    twice gives the same result: restarts copy the pool and never change the state."""
    topology, previous = healthy64
    columns_before = len(previous.warm_state.pool)
    first = synthesize(fail2(topology), previous=previous)
    second = synthesize(fail2(topology), previous=previous)
    assert len(previous.warm_state.pool) == columns_before
    assert first.schedule.meta.throughput_bound_gbs == second.schedule.meta.throughput_bound_gbs
    assert first.schedule.transfers == second.schedule.transfers
    both = fail1(fail2(topology))
    chained = synthesize(both, previous=first)
    validate(chained.schedule, both)
    assert chained.schedule.meta.stat("restarted") == 1.0
    assert chained.schedule.meta.throughput_bound_gbs == pytest.approx(synthesize(both).schedule.meta.throughput_bound_gbs, rel=1e-9)


def test_a_state_whose_blocks_changed_does_not_fit() -> None:
    """Fail3 moves gpu0 to a host of its own: with per-host blocks the old columns belong to other
    blocks, so the warm start seeds from the routes instead, and still reaches the optimum."""
    topology = rail_optimized(1, 2, 4)
    previous = synthesize(topology, grouping="host")
    assert previous.warm_state.fits(build_network(fail2(topology)), None, "host")
    assert not previous.warm_state.fits(build_network(fail3(topology)), None, "host")
    warm = synthesize(fail3(topology), previous=previous, grouping="host")
    validate(warm.schedule, fail3(topology))
    assert warm.schedule.meta.stat("restarted") == 0.0
    assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(compact_lp(fail3(topology)).algbw_gbs, rel=1e-6)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=small_topologies(), data=st.data())
def test_restart_after_any_capacity_change_reaches_the_compact_optimum(topology: Topology, data) -> None:
    """Capacities up or down on a few links (degradations and recoveries): the restart, whichever basis it
    takes, and the warm start from the routes both reach the compact LP's optimum with valid schedules."""
    previous = synthesize(topology)
    capacities = topology.capacities_gbps.copy()
    links = data.draw(st.lists(st.integers(0, len(topology.links) - 1), min_size=1, max_size=3, unique=True))
    factors = data.draw(st.lists(st.floats(0.05, 4.0), min_size=len(links), max_size=len(links)))
    capacities[np.array(links)] *= np.array(factors)
    changed = topology.with_capacities(capacities, name=topology.name + "+change")
    optimum = compact_lp(changed).algbw_gbs
    restarted = synthesize(changed, previous=previous)
    from_file = synthesize(changed, previous=loads_schedule(dumps_schedule(previous.schedule)))
    for warm, kind in ((restarted, 1.0), (from_file, 0.0)):
        validate(warm.schedule, changed)
        assert warm.schedule.meta.stat("restarted") == kind
        assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(optimum, rel=1e-6)


def test_the_state_travels_with_the_result_and_a_file_has_none() -> None:
    """The warm state is a field of the result: a re-versioned copy keeps it (the controller re-versions
    every schedule it issues), a schedule read from a file has none and warm-starts from its routes."""
    topology = rail_optimized(1, 2, 4)
    result = synthesize(topology)
    assert result.warm_state is not None
    copy = result.with_version(7)
    assert copy.warm_state is result.warm_state and copy.schedule.meta.version == 7
    restarted = synthesize(fail2(topology), previous=copy)
    from_file = synthesize(fail2(topology), previous=loads_schedule(dumps_schedule(copy.schedule)))
    assert restarted.stats.warm.restarted and not from_file.stats.warm.restarted
    assert restarted.bound_gbs == pytest.approx(from_file.bound_gbs, rel=1e-9)
