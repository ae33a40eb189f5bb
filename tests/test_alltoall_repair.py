"""Warm repair of the previous LP solution (``mccl.synth.alltoall.repair``): proven optimal or declined."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import small_topologies
from mccl.schedule import validate
from mccl.synth.alltoall import compact_lp, synthesize
from mccl.synth.alltoall.network import build_network
from mccl.synth.alltoall.pricing import Pricer
from mccl.synth.alltoall.repair import repair
from mccl.topology import Topology, degrade, fail1, fail2, fail3, rail_optimized


@pytest.fixture(scope="module")
def healthy64():
    topology = rail_optimized(1, 8, 8)
    return topology, synthesize(topology)


def _pair_chunks(schedule) -> dict[tuple[int, int], list[tuple[float, tuple]]]:
    """Per (source, destination): its chunks as (fraction, glued route), sorted."""
    transfers = schedule.transfers
    routes: dict[int, list] = {}
    for index in np.lexsort((transfers.step, transfers.chunk)):
        routes.setdefault(int(transfers.chunk[index]), []).extend(transfers.route(int(index)))
    chunks = schedule.chunks
    result: dict[tuple[int, int], list] = {}
    for c in range(len(chunks)):
        key = (int(chunks.source[c]), int(chunks.destination[c]))
        result.setdefault(key, []).append((round(float(chunks.fraction[c]), 12), tuple(routes[c])))
    return {key: sorted(value) for key, value in result.items()}


def test_fail2_is_repaired_to_the_cold_optimum_and_keeps_most_chunks(healthy64) -> None:
    """Fail2 cuts a NIC on the bottleneck cut: the repair proves the cold optimum with a few dozen
    pivots, and every pair it neither re-routes nor re-rounds keeps its chunks and routes."""
    topology, previous = healthy64
    faulty = fail2(topology)
    warm = synthesize(faulty, previous=previous)
    cold = synthesize(faulty)
    validate(warm.schedule, faulty)
    stats = dict(warm.schedule.meta.stats)
    assert stats["repaired"] == 1.0 and stats["repair_declined"] == 0.0 and stats["optimal"] == 1.0
    assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(cold.schedule.meta.throughput_bound_gbs, rel=1e-9)
    assert stats["iterations"] < cold.schedule.meta.stat("iterations")
    assert stats["rounding_gap"] <= 0.01
    assert 0 < stats["repaired_pairs"] <= stats["rerounded_pairs"] < 64 * 63
    before, after = _pair_chunks(previous.schedule), _pair_chunks(warm.schedule)
    changed = sum(before[pair] != after[pair] for pair in before)
    assert changed <= stats["rerounded_pairs"]
    assert warm.schedule.meta.bottleneck_cut  # from the repair LP's duals


def test_a_repair_that_needs_new_routes_prices_them() -> None:
    """Fail3 slows both cables of gpu0: its same-host peers were only ever reached over NVLink, so
    the pool has no other route to them; the repair prices new ones and reaches the compact optimum."""
    topology = rail_optimized(1, 2, 8)
    previous = synthesize(topology)
    faulty = fail3(topology)
    warm = synthesize(faulty, previous=previous)
    validate(warm.schedule, faulty)
    assert warm.schedule.meta.stat("repaired") == 1.0
    assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(compact_lp(faulty).algbw_gbs, rel=1e-6)
    state = warm.warm_state
    assert len(state.pool.paths) > len(previous.warm_state.pool.paths)  # the priced routes, in a copy
    assert state.master.col_status is None  # a repaired state keeps columns, not a basis


def test_recovery_and_chains_reach_the_cold_optimum(healthy64) -> None:
    """Healthy → Fail2 (repaired) → Fail2+Fail1 → healthy again: each step warm from the last, each at the
    cold optimum. The way back raises the NIC's capacity again; the pairs on the links the Fail2 optimum
    saturates (its host's NICs) are re-routed too, the rest scales up, and the repair proves it."""
    topology, previous = healthy64
    steps = [fail2(topology), fail1(fail2(topology)), topology]
    for faulty in steps:
        warm = synthesize(faulty, previous=previous)
        validate(warm.schedule, faulty)
        assert warm.schedule.meta.stat("optimal") == 1.0
        assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(synthesize(faulty).schedule.meta.throughput_bound_gbs, rel=1e-9)
        assert warm.schedule.meta.stat("repaired") + warm.schedule.meta.stat("repair_declined") <= 1.0
        previous = warm
    assert previous.schedule.meta.stat("repaired") == 1.0
    assert previous.schedule.meta.throughput_bound_gbs == pytest.approx(healthy64[1].schedule.meta.throughput_bound_gbs, rel=1e-9)


def test_the_way_back_from_a_repair_re_routes_its_detours(healthy64) -> None:
    """Fail3 then healthy again: the pairs the Fail3 repair sent around gpu0 are remembered as detoured,
    and when capacity comes back they are re-routed again, so the repair reaches the healthy optimum
    (without them, the pairs it had detoured would hold the others back, and it would be declined)."""
    topology, previous = healthy64
    faulty = synthesize(fail3(topology), previous=previous)
    assert faulty.schedule.meta.stat("repaired") == 1.0
    detoured = faulty.warm_state.detoured
    assert detoured.size == faulty.schedule.meta.stat("repaired_pairs") and previous.warm_state.detoured.size == 0
    back = synthesize(topology, previous=faulty)
    validate(back.schedule, topology)
    assert back.schedule.meta.stat("repaired") == 1.0
    assert back.schedule.meta.throughput_bound_gbs == pytest.approx(previous.schedule.meta.throughput_bound_gbs, rel=1e-9)
    state = faulty.warm_state
    network = build_network(topology)
    assert repair(state.flow, state.capacity, state.pool, Pricer(network), network.capacity) is None


def test_repair_declines_what_it_cannot_prove() -> None:
    """A ToR uplink at 83 % and an NVSwitch port at 16 % (found by a random search on this fabric): the
    pairs on them move, but the optimum would also move pairs that never crossed them, which the
    repair keeps in place; its bound does not close, so it returns None, and column generation
    reaches the optimum (cold's; the compact LP takes seconds at 32 GPUs)."""
    topology = rail_optimized(1, 4, 8)
    previous = synthesize(topology)
    slowed = degrade(degrade(topology, ("tor0.5", "agg3"), factor=0.828), ("nvs1", "gpu12"), factor=0.158)
    state = previous.warm_state
    network = build_network(slowed)
    assert repair(state.flow, state.capacity, state.pool, Pricer(network), network.capacity) is None
    warm = synthesize(slowed, previous=previous)
    validate(warm.schedule, slowed)
    assert warm.schedule.meta.stat("repair_declined") == 1.0 and warm.schedule.meta.stat("repaired") == 0.0
    assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(synthesize(slowed).schedule.meta.throughput_bound_gbs, rel=1e-9)


def test_a_change_that_touches_most_pairs_is_not_repaired(healthy64) -> None:
    """Every link 10 % slower (as measured capacities that all drift a little): every pair is affected,
    so the repair is declined at once, and column generation finds the optimum (the old one × 0.9)."""
    topology, previous = healthy64
    slower = topology.with_capacities(topology.capacities_gbps * 0.9, name=topology.name + "+slower")
    state = previous.warm_state
    network = build_network(slower)
    assert repair(state.flow, state.capacity, state.pool, Pricer(network), network.capacity) is None
    warm = synthesize(slower, previous=previous)
    validate(warm.schedule, slower)
    assert warm.schedule.meta.stat("repair_declined") == 1.0
    assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(0.9 * previous.schedule.meta.throughput_bound_gbs, rel=1e-9)


def test_no_change_is_not_a_repair(healthy64) -> None:
    topology, previous = healthy64
    state = previous.warm_state
    network = build_network(topology)
    assert repair(state.flow, state.capacity, state.pool, Pricer(network), network.capacity) is None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=small_topologies(), data=st.data())
def test_chained_changes_on_random_fabrics_reach_the_compact_optimum(topology: Topology, data) -> None:
    """Two capacity changes in a row, each warm from the last schedule (the second from a state that may
    have been repaired, so without a basis): every step validates and equals the compact LP's optimum."""
    previous = synthesize(topology)
    capacities = topology.capacities_gbps.copy()
    for step in range(2):
        links = data.draw(st.lists(st.integers(0, len(topology.links) - 1), min_size=1, max_size=3, unique=True))
        factors = data.draw(st.lists(st.floats(0.05, 2.0), min_size=len(links), max_size=len(links)))
        capacities[np.array(links)] *= np.array(factors)
        changed = topology.with_capacities(capacities.copy(), name=f"{topology.name}+change{step}")
        warm = synthesize(changed, previous=previous)
        validate(warm.schedule, changed)
        assert warm.schedule.meta.stat("optimal") == 1.0
        assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(compact_lp(changed).algbw_gbs, rel=1e-6), \
            dict(warm.schedule.meta.stats)
        # Rounding on such tiny fabrics can lose several % at K = 10 (see test_alltoall_props); the gap is exact.
        meta = warm.schedule.meta
        assert meta.stat("gap") == pytest.approx(1 - meta.achieved_gbs / meta.throughput_bound_gbs, abs=1e-12)
        previous = warm


@pytest.mark.slow  # a few seconds: out of the fast loop, run by CI
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_faults_and_recoveries_in_a_row_on_a_rail_fabric_stay_optimal(data) -> None:
    """Four steps on an 8-GPU rail fabric, each warm from the last: some links slowed to 5–100 %, or all
    of them back to nominal. Whichever path each step takes (repair, decline, kept basis), it validates
    and equals the compact LP's optimum."""
    topology = rail_optimized(1, 2, 4)
    nominal = topology.capacities_gbps
    capacities = nominal.copy()
    previous = synthesize(topology)
    for step in range(4):
        if data.draw(st.booleans()):
            capacities = nominal.copy()
        else:
            links = data.draw(st.lists(st.integers(0, len(nominal) - 1), min_size=1, max_size=3, unique=True))
            factors = data.draw(st.lists(st.floats(0.05, 1.0), min_size=len(links), max_size=len(links)))
            capacities[np.array(links)] = nominal[np.array(links)] * np.array(factors)
        changed = topology.with_capacities(capacities.copy(), name=f"{topology.name}+step{step}")
        warm = synthesize(changed, previous=previous)
        validate(warm.schedule, changed)
        assert warm.schedule.meta.stat("optimal") == 1.0
        assert warm.schedule.meta.throughput_bound_gbs == pytest.approx(compact_lp(changed).algbw_gbs, rel=1e-6)
        previous = warm


@pytest.mark.parametrize("width", [3, 4, 8])
def test_paths_crossing_compares_or_looks_up_alike(width) -> None:
    """``paths_crossing`` compares the table with a few marked links and looks the rest up in one gather;
    both answer as a lookup per column would, for any table width and number of marked links."""
    from mccl.synth.alltoall.repair import paths_crossing

    rng = np.random.default_rng(width)
    table = rng.integers(0, 40, size=(300, width)).astype(np.int32)
    table[rng.random(table.shape) < 0.3] = -1  # padding
    for count in (0, 1, 2, 3, 7, 40):
        marked = np.zeros(40, dtype=bool)
        marked[rng.choice(40, count, replace=False)] = True
        lookup = np.append(marked, False)
        expected = np.zeros(len(table), dtype=bool)
        for column in range(width):
            expected |= lookup[table[:, column]]
        assert np.array_equal(paths_crossing(table, marked), expected), count
