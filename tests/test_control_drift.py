"""Algorithm 1 (mccl-paper §3.2) by hand numbers and as properties; the measured topology."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import small_topologies
from mccl.control.drift import CutProfile, drift_test, measured_capacities, merge_maps, overlay_map, profile
from mccl.errors import ControllerError, Infeasible, SynthesisError
from mccl.synth import optimize
from mccl.synth.ring import naive_ring, nccl_ring
from mccl.topology import degrade, fail2, rail_optimized


def hand_profile() -> CutProfile:
    """Three links a0, a1, a2 with n = 4, 2, 1 chunks; the cut is {a0} (4 chunks on 100 Gbit/s)."""
    return CutProfile(links=np.array([0, 1, 2]), n=np.array([4.0, 2.0, 1.0]), cut=np.array([0]),
                      base_slack=np.array([0.0]))


def test_hand_numbers_healthy_and_degraded_cut():
    cut = hand_profile()
    healthy = drift_test(cut, np.array([100.0, 100.0, 100.0]), gamma=0.2)
    assert healthy.x_min == pytest.approx(25.0)  # min(100/4, 100/2, 100/1)
    assert healthy.slack == pytest.approx([0.0]) and not healthy.flagged
    # a1 drops to 20: x_min = 10, a0's slack = (100 - 4·10)/100 = 0.6 → δ = 0.6 > Γ
    degraded = drift_test(cut, np.array([100.0, 20.0, 100.0]), gamma=0.2)
    assert degraded.x_min == pytest.approx(10.0)
    assert degraded.slack == pytest.approx([0.6])
    assert degraded.max_deviation == pytest.approx(0.6) and degraded.flagged and degraded.worst_link == 0
    # a1 to 45: x_min = 22.5, slack 0.1 → below Γ = 0.2, not flagged; Γ = 0.05 flags it
    mild = np.array([100.0, 45.0, 100.0])
    assert drift_test(cut, mild, gamma=0.2).max_deviation == pytest.approx(0.1)
    assert not drift_test(cut, mild, gamma=0.2).flagged
    assert drift_test(cut, mild, gamma=0.05).flagged


def test_uniformly_scaled_cut_does_not_trigger():
    """§6.1: a cut scaled down uniformly leaves the schedule optimal — no re-optimization."""
    cut = hand_profile()
    for factor in (0.5, 0.1, 0.01):
        result = drift_test(cut, factor * np.array([100.0, 100.0, 100.0]), gamma=0.01)
        assert result.max_deviation == pytest.approx(0.0, abs=1e-12) and not result.flagged


def test_failure_off_the_cut_does_not_trigger():
    """A link off the cut slows down but stays faster per chunk than the cut: x_min is unchanged."""
    cut = hand_profile()
    result = drift_test(cut, np.array([100.0, 60.0, 30.0]), gamma=0.01)  # 60/2 = 30, 30/1 = 30 > 25
    assert result.x_min == pytest.approx(25.0) and not result.flagged


def test_base_slack_of_a_rounded_schedule_is_the_reference():
    cut = CutProfile(np.array([0, 1]), np.array([3.0, 4.0]), np.array([0, 1]), np.array([0.25, 0.0]))
    result = drift_test(cut, np.array([100.0, 100.0]), gamma=0.2)  # x = 25: a0 slack 0.25 = base
    assert result.deviation == pytest.approx([0.0, 0.0])


def test_hpn_fail2_on_the_cut_triggers_and_the_healthy_fabric_does_not(hpn):
    schedule = optimize(hpn, "allgather").schedule
    cut = profile(schedule, len(hpn.links))
    assert not drift_test(cut, hpn.capacities_gbps, 0.05).flagged
    assert not drift_test(cut, 0.3 * hpn.capacities_gbps, 0.05).flagged
    assert drift_test(cut, fail2(hpn).capacities_gbps, 0.2).flagged
    # tree packing leaves every link of the HPN within 0.3% of saturation, so any slower link is a
    # new bottleneck; NCCL's ring leaves NVSwitch headroom: slow the roomiest link it uses until it
    # is just faster per chunk than the cut, and nothing is flagged
    ring = profile(nccl_ring(hpn, "allgather"), len(hpn.links))
    x_min = drift_test(ring, hpn.capacities_gbps, 0.2).x_min
    headroom = hpn.capacities_gbps[ring.links] / (ring.n * x_min)
    roomy = int(ring.links[np.argmax(headroom)])
    slowed = degrade(hpn, roomy, factor=1.01 / float(headroom.max()))
    assert slowed.capacities_gbps[roomy] < hpn.capacities_gbps[roomy]
    assert not drift_test(ring, slowed.capacities_gbps, 0.01).flagged
    assert drift_test(ring, degrade(hpn, roomy, factor=0.9 / float(headroom.max())).capacities_gbps, 0.01).flagged


def test_bad_inputs_are_named():
    with pytest.raises(ControllerError, match="positive"):
        drift_test(hand_profile(), np.array([100.0, 0.0, 100.0]), 0.2)
    schedule = optimize(rail_optimized(1, 2, 2), "allgather").schedule
    cut_type = type(schedule.meta.bottleneck_cut[0])
    with pytest.raises(ControllerError, match="outside"):
        profile(schedule.with_meta(bottleneck_cut=(cut_type(999, 0.0),)), 24)


def _ring(topology):
    """A ring where switches can route it, else the tree-packing schedule (random fabrics often
    need GPU relays)."""
    try:
        return naive_ring(topology, "allgather")
    except (Infeasible, SynthesisError):
        return optimize(topology, "allgather", chunks=2).schedule


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(topology=small_topologies(), data=st.data())
def test_properties_on_random_schedules(topology, data):
    """On random fabrics and measurements: nominal capacities give δ = 0; any uniform scaling never
    flags; slowing links the schedule does not use never flags; slowing one cut link by a lot flags."""
    schedule = _ring(topology)
    assume(schedule is not None)
    n_links = len(topology.links)
    cut = profile(schedule, n_links)
    nominal = topology.capacities_gbps
    assert drift_test(cut, nominal, 1e-6).max_deviation == pytest.approx(0.0, abs=1e-9)
    scale = data.draw(st.floats(1e-3, 1e3))
    assert not drift_test(cut, nominal * scale, 1e-6).flagged
    unused = np.setdiff1d(np.arange(n_links), cut.links)
    slowed = nominal.copy()
    slowed[unused] *= data.draw(st.floats(1e-3, 1.0))
    assert not drift_test(cut, slowed, 1e-6).flagged
    tight = [int(i) for i, base in zip(cut.cut, cut.base_slack, strict=True) if cut.n[i] > 0 and base < 0.1]
    assume(len(tight) >= 2)  # with one tight cut link, slowing it is a uniform scaling of the cut
    victim = int(cut.links[tight[0]])
    others = tight[1:]
    slow = nominal.copy()
    slow[victim] *= 0.1
    result = drift_test(cut, slow, 0.2)
    assert others and result.flagged  # the other cut links now idle most of the time


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=small_topologies(), data=st.data())
def test_measured_capacities_properties(topology, data):
    """Never above nominal, nominal where nothing measured, and a single slow overlay link that alone
    covers a link sets it to nominal × its factor."""
    schedule = _ring(topology)
    assume(schedule is not None)
    n = schedule.n_ranks
    mapping = overlay_map(schedule, topology)
    inter = np.array(data.draw(st.lists(st.floats(0.01, 3.0), min_size=n * n, max_size=n * n))).reshape(n, n)
    intra = np.array(data.draw(st.lists(st.floats(0.01, 3.0), min_size=n, max_size=n)))
    nominal = topology.capacities_gbps
    measured = measured_capacities(mapping, inter, intra, nominal)
    assert np.all(measured <= nominal + 1e-9) and np.all(measured > 0)
    covered = np.zeros(len(nominal), dtype=bool)
    covered[mapping.links] = True
    assert np.array_equal(measured[~covered], nominal[~covered])
    nothing = measured_capacities(mapping, np.full((n, n), np.nan), np.full(n, np.nan), nominal)
    assert np.array_equal(nothing, nominal)
    assert merge_maps(mapping, mapping).links.tolist() == mapping.links.tolist()


def test_mapping_localizes_a_degraded_nic_on_hpn(hpn):
    """Every pair through gpu0's NIC cable at 1/8, all others healthy: the max rule puts the loss
    on gpu0's two NIC links only, exactly Fail2."""
    schedule = optimize(hpn, "allgather").schedule
    n = schedule.n_ranks
    mapping = overlay_map(schedule, hpn)
    inter = np.ones((n, n))
    inter[0, 8:] = inter[8:, 0] = 50 / 400
    cable = {hpn.link_between("gpu0", "tor0.0").id, hpn.link_between("tor0.0", "gpu0").id}
    for i in range(n):  # a same-host pair routed through the NIC (per-peer intra samples) slows too
        for j in range(n):
            if i // 8 == j // 8 and cable & set(mapping.links_of(i * n + j).tolist()):
                inter[i, j] = 50 / 400
    measured = measured_capacities(mapping, inter, np.ones(n), hpn.capacities_gbps)
    changed = set(np.flatnonzero(measured != hpn.capacities_gbps).tolist())
    used = set(int(link) for link in schedule.transfers.route_links)
    assert cable & used <= changed and cable & used  # the cable (the directions the schedule uses)
    # Any other link lowered is one that only gpu0's degraded pairs cross (with loop-free routes, e.g.
    # the one ToR-aggregation hop of a cross-rail pair of gpu0): the evidence cannot tell it from the cable.
    degraded = {i * n + j for i in range(n) for j in range(n) if inter[i, j] < 1}
    for link in changed - cable:
        covering = {o for o in range(n * n + n) if link in mapping.links_of(o)}
        assert covering and covering <= degraded
    assert np.allclose(measured[list(cable & used)], fail2(hpn).capacities_gbps[list(cable & used)])


def test_stale_evidence_does_not_exonerate_a_link():
    """Two pairs cross link 0: 0 -> 1 is sampled now at 1/8, 1 -> 0 is no longer used by the active
    schedule and keeps its last (healthy) value. Without freshness the stale 1.0 wins the max and the
    degradation goes unseen; with it only the fresh pair counts on link 0, and link 1, which only the
    stale pair covers, keeps that pair's last word."""
    from mccl.control.drift import OverlayMap

    n = 2  # overlays: inter i * n + j, intra n * n + i
    owners = {1: [0], 2: [0, 1]}
    counts = [len(owners.get(o, [])) for o in range(n * n + n)]
    mapping = OverlayMap(n, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                         np.array(owners[1] + owners[2], dtype=np.int64))
    inter = np.array([[np.nan, 0.125], [1.0, np.nan]])
    intra = np.full(n, np.nan)
    nominal = np.array([400.0, 400.0, 400.0])
    assert measured_capacities(mapping, inter, intra, nominal).tolist() == [400.0, 400.0, 400.0]
    fresh = (np.array([[False, True], [False, False]]), np.zeros(n, dtype=bool))
    assert measured_capacities(mapping, inter, intra, nominal, fresh).tolist() == [50.0, 400.0, 400.0]
    inter[1, 0] = 0.5  # stale and slow: still the last word on link 1
    assert measured_capacities(mapping, inter, intra, nominal, fresh).tolist() == [50.0, 200.0, 400.0]


def test_merge_maps_is_the_union_per_overlay_link(hpn):
    first = overlay_map(nccl_ring(hpn, "allgather"), hpn)
    second = overlay_map(naive_ring(hpn, "allgather"), hpn)
    merged = merge_maps(first, second)
    assert len(merged.offsets) == len(first.offsets)
    for overlay in range(len(first.offsets) - 1):
        expected = np.union1d(first.links_of(overlay), second.links_of(overlay))
        assert merged.links_of(overlay).tolist() == expected.tolist()


def test_base_scales_factors_and_a_clear_recovery_snaps_to_nominal():
    """References learned on a believed fabric (``base``): a factor of 1 is that fabric, above 1 a
    recovery (clipped at nominal); a path through a link believed degraded that speeds up by more
    than ``recovered_factor`` takes that link back to nominal (issue 11: the half-recovered estimate
    after Fail3 kept the AllToAll at 57 of 85.6 GB/s)."""
    from mccl.control.drift import OverlayMap

    n = 2
    owners = {1: [0], 2: [1]}  # pair 0->1 covers link 0, pair 1->0 covers link 1; link 2 uncovered
    counts = [len(owners.get(o, [])) for o in range(n * n + n)]
    mapping = OverlayMap(n, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                         np.array(owners[1] + owners[2], dtype=np.int64))
    nominal = np.array([400.0, 400.0, 400.0])
    base = np.array([50.0, 100.0, 200.0])
    intra = np.full(n, np.nan)
    same = np.array([[np.nan, 1.0], [1.0, np.nan]])
    assert measured_capacities(mapping, same, intra, nominal, base_gbps=base).tolist() == [50.0, 100.0, 200.0]
    faster = np.array([[np.nan, 1.1], [6.0, np.nan]])
    assert measured_capacities(mapping, faster, intra, nominal, base_gbps=base) == pytest.approx([55.0, 400.0, 200.0])
    snapped = measured_capacities(mapping, faster, intra, nominal, base_gbps=base, recovered_factor=1.2)
    assert snapped == pytest.approx([55.0, 400.0, 200.0])  # 1.1 is within noise; 6x is a repair
    partial = np.array([[np.nan, 1.5], [1.0, np.nan]])
    assert measured_capacities(mapping, partial, intra, nominal, base_gbps=base,
                               recovered_factor=1.2).tolist() == [400.0, 100.0, 200.0]
    assert measured_capacities(mapping, partial, intra, nominal, base_gbps=base) == pytest.approx([75.0, 100.0, 200.0])
    with pytest.raises(ControllerError, match="base"):
        measured_capacities(mapping, same, intra, nominal, base_gbps=base[:2])


def test_per_peer_intra_samples_blame_the_slow_ingress_not_the_senders(hpn):
    """GPU 0's NVSwitch -> GPU port at half speed (Fail1-like). Per-peer intra samples: every same-host pair
    into rank 0 reads 1/2, every other pair 1: the measured fabric lowers that port alone. With the older
    aggregate reading healthy (one injection per rank: the slow peer mixed in with six healthy ones) the
    port is exonerated and the fault not seen."""
    from mccl.synth.direct import direct_alltoall

    schedule = direct_alltoall(hpn)
    n = schedule.n_ranks
    mapping = overlay_map(schedule, hpn)
    port = hpn.link_between("nvs0", "gpu0").id
    pairs = np.ones((n, n))
    for i in range(1, 8):
        pairs[i, 0] = 0.5
    measured = measured_capacities(mapping, pairs, np.full(n, np.nan), hpn.capacities_gbps)
    lowered = set(np.flatnonzero(measured < hpn.capacities_gbps).tolist())
    assert lowered == {port} and measured[port] == pytest.approx(hpn.capacities_gbps[port] / 2)
    aggregate = np.full((n, n), np.nan)
    for i in range(n):
        for j in range(n):
            if i // 8 != j // 8:
                aggregate[i, j] = 1.0
    blurred = measured_capacities(mapping, aggregate, np.ones(n), hpn.capacities_gbps)
    assert blurred[port] == hpn.capacities_gbps[port]
