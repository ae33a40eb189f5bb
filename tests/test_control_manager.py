"""The Schedule Manager end to end with the real tree-packing synthesizer (mccl-paper §3.2)."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, Sample, ScheduleManager
from mccl.errors import ControllerError, InvalidOptions
from mccl.schedule import dumps_schedule, link_load, schedule_binary_text, steady_state_algbw, validate
from mccl.synth import AllToAllOptions, optimize
from mccl.synth.direct import direct_alltoall
from mccl.topology import fail2, rail_optimized


def samples(n: int, seq: int, slow_rank: int | None = None, factor: float = 50 / 400, communicator: str = "job"):
    """One round of telemetry on a 2-host fabric of n ranks: every cross-host pair and every rank's
    injection at 10 Gbit/s; pairs through ``slow_rank``'s NIC at ``factor`` of that (Fail2 = 50/400)."""
    half = n // 2
    out = []
    for i in range(n):
        out.append(Sample("intra", communicator, i, -1, 10**9, 0.8, 0.0, seq))
        for j in range(n):
            if (i < half) != (j < half):
                rate = 10.0 * (factor if slow_rank in (i, j) else 1.0)
                out.append(Sample("inter", communicator, i, j, int(rate * 1e9 / 8 * 0.01), 0.01, 0.0, seq))
    return out


def warmed_up(topology, schedule):
    """A manager that runs ``schedule`` and has seen four healthy rounds (seq 1 is start-up, 2-3 learn
    the references, 4 is healthy)."""
    manager = ScheduleManager(topology, ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1))
    assert manager.register("job", schedule) == schedule.meta.version
    for seq in range(1, 5):
        manager.ingest(samples(16, seq))
    return manager


def fail2_seen(topology, schedule):
    """``warmed_up``, then seven rounds with rank 0's NIC at 50/400 (Fail2)."""
    manager = warmed_up(topology, schedule)
    for seq in range(5, 12):
        manager.ingest(samples(16, seq, slow_rank=0))
    return manager


@pytest.fixture(scope="module")
def hpn_schedule():
    topology = rail_optimized(1, 2, 8)
    return topology, optimize(topology, "allgather").schedule.with_meta(version=1)


def test_fail2_is_detected_resynthesized_validated_and_versioned(hpn_schedule):
    topology, schedule = hpn_schedule
    manager = warmed_up(topology, schedule)
    assert manager.step() == [] and manager.versions("job") == {"allgather": 1}
    for seq in range(5, 12):
        manager.ingest(samples(16, seq, slow_rank=0))
    events = manager.step()
    assert [event.kind for event in events] == ["flagged", "synthesized", "issued"]
    version, text = manager.latest("job", "allgather")
    assert version == 2
    from mccl.schedule import loads_schedule

    issued = loads_schedule(text)
    validate(issued, topology)
    assert issued.meta.version == 2 and issued.meta.stat("kept_fraction") is not None  # warm-started
    # on the real Fail2 fabric the new schedule beats the old one by far, and matches a cold synthesis
    real = fail2(topology)
    old = steady_state_algbw(link_load(schedule, len(real.links)), real.capacities_gbps, 16)
    new = steady_state_algbw(link_load(issued, len(real.links)), real.capacities_gbps, 16)
    assert new > 5 * old
    assert new == pytest.approx(optimize(real, "allgather").achieved_gbs, rel=0.02)
    # the same measurements keep flagging nothing: the new schedule fits them
    for seq in range(12, 20):
        manager.ingest(samples(16, seq, slow_rank=0))
    assert manager.step() == []


def test_uniform_slowdown_does_not_resynthesize(hpn_schedule):
    topology, schedule = hpn_schedule
    manager = warmed_up(topology, schedule)
    for seq in range(5, 12):  # every overlay link at 30%: a uniformly scaled fabric
        manager.ingest([Sample(s.kind, s.communicator, s.rank, s.peer, int(s.bytes * 0.3), s.seconds, 0.0, seq)
                        for s in samples(16, seq)])
    assert manager.step() == []
    decision = manager.check()[0]
    assert decision.result.max_deviation == pytest.approx(0.0, abs=1e-9)


def test_degradation_that_clears_during_synthesis_is_aborted(hpn_schedule):
    topology, schedule = hpn_schedule

    def synthesize_while_it_clears(*args, **kwargs):
        for seq in range(100, 110):  # the link recovers while the synthesizer runs
            manager.ingest(samples(16, seq))
        return optimize(*args, **kwargs)

    manager = ScheduleManager(topology, ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1),
                              synthesize=synthesize_while_it_clears)
    manager.register("job", schedule)
    for seq in range(1, 5):
        manager.ingest(samples(16, seq))
    for seq in range(5, 12):
        manager.ingest(samples(16, seq, slow_rank=0))
    kinds = [event.kind for event in manager.step()]
    assert kinds == ["flagged", "synthesized", "aborted"] and manager.versions("job") == {"allgather": 1}


def test_unavailable_synthesizer_keeps_the_schedule_and_logs_once(caplog):
    """A collective configured with a method that does not make it (here: a name nothing registers):
    ``optimize`` raises SynthesisUnavailable, and the manager keeps the schedule and says so once."""
    topology = rail_optimized(1, 2, 2)
    schedule = direct_alltoall(topology).with_meta(version=1)
    config = ControlConfig(alpha=1.0, gamma=0.05, warmup=1, settle_collectives=0,
                           methods={"alltoall": "alltoall.missing"})
    manager = ScheduleManager(topology, config)
    manager.register("job", schedule)
    manager.ingest(samples(4, 1))
    for round_ in range(3):
        manager.ingest(samples(4, 2 + round_, slow_rank=0, factor=0.05))
        manager.step()
    kinds = [event.kind for event in manager.events]
    assert kinds.count("unavailable") == 1 and "issued" not in kinds
    assert manager.versions("job") == {"alltoall": 1}
    assert sum("not available" in record.message for record in caplog.records) == 1


def test_options_go_to_their_own_collective_only(hpn_schedule):
    """An AllToAll-only option configured for AllToAll leaves AllGather re-synthesis alone (it used to be
    applied to every collective and broke it)."""
    topology, schedule = hpn_schedule
    config = ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1,
                           synth_options={"alltoall": AllToAllOptions(chunks=4, time_limit_s=5.0)})
    manager = ScheduleManager(topology, config)
    manager.register("job", schedule)
    for seq in range(1, 5):
        manager.ingest(samples(16, seq))
    for seq in range(5, 12):
        manager.ingest(samples(16, seq, slow_rank=0))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    with pytest.raises(InvalidOptions, match="chunks"):
        ControlConfig(synth_options={"alltoall": AllToAllOptions(chunks=0)})
    with pytest.raises(InvalidOptions, match="expected TreePackOptions for allgather"):
        ControlConfig(synth_options={"allgather": AllToAllOptions()})


def test_alltoall_warm_state_is_kept_through_the_manager():
    """Two re-syntheses in a row through the manager: the second restarts from the solver state of the
    first (the manager keeps the synthesis result, not a re-versioned copy that lost it)."""
    topology = rail_optimized(1, 2, 8)
    schedule = optimize(topology, "alltoall").schedule.with_meta(version=1)
    manager = fail2_seen(topology, schedule)
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    first = manager.active_result("job", "alltoall")
    assert first is not None and first.warm_state is not None and first.schedule.meta.version == 2
    assert not first.stats.warm.restarted  # the registered schedule had no state: warm from its routes
    assert 85 < first.bound_gbs < 95  # the measured fabric: Fail2's 89.06 GB/s, up to the EWMA's estimate
    for seq in range(12, 16):  # the new version runs under the fault: its references are learned there
        manager.ingest(samples(16, seq, slow_rank=0))
    assert manager.step() == []
    for seq in range(16, 30):  # the cable is repaired
        manager.ingest(samples(16, seq))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    second = manager.active_result("job", "alltoall")
    assert second.schedule.meta.version == 3
    assert second.stats.warm.restarted or second.stats.warm.repaired  # from the first one's state
    assert second.bound_gbs == pytest.approx(100.0, rel=1e-4)  # healthy 2x8 optimum, up to the EWMA
    for seq in range(30, 34):  # the healthy version learns its references
        manager.ingest(samples(16, seq))
    assert manager.step() == []
    for seq in range(34, 52):  # and the cable degrades again: warm from the healthy re-synthesis's state
        manager.ingest(samples(16, seq, slow_rank=0))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    third = manager.active_result("job", "alltoall")
    assert third.schedule.meta.version == 4
    assert third.stats.warm.restarted or third.stats.warm.repaired
    assert third.bound_gbs == pytest.approx(89.06, rel=1e-3)  # Fail2's optimum


def test_register_rules(hpn_schedule):
    topology, schedule = hpn_schedule
    manager = ScheduleManager(topology)
    assert manager.register("job", schedule) == 1
    assert manager.register("job", schedule.with_meta(version=0)) == 1  # older: ignored
    with pytest.raises(ControllerError, match="ranks"):
        manager.register("job", optimize(topology, "allgather", topology.gpus[:8]).schedule)
    with pytest.raises(ControllerError, match="gamma"):
        ScheduleManager(topology, ControlConfig(gamma=0.0))
    assert manager.ingest(samples(16, 50, communicator="unknown")) == 0 and manager.samples_ignored > 0
    assert np.isfinite(manager.samples_taken)


def test_a_degradation_that_clears_after_the_swap_brings_the_nominal_schedule_back(hpn_schedule):
    topology, schedule = hpn_schedule
    manager = fail2_seen(topology, schedule)
    manager.step()
    assert manager.versions("job") == {"allgather": 2}
    for seq in range(12, 16):  # the new version runs under the fault: its references are learned there
        manager.ingest(samples(16, seq, slow_rank=0))
    assert manager.step() == []
    for seq in range(16, 30):  # the cable is repaired: the pairs through it 8x faster than their references
        manager.ingest(samples(16, seq))
    kinds = [event.kind for event in manager.step()]
    assert kinds == ["flagged", "synthesized", "issued"] and manager.versions("job") == {"allgather": 3}
    from mccl.schedule import loads_schedule

    back = loads_schedule(manager.latest("job", "allgather")[1])
    healthy = steady_state_algbw(link_load(back, len(topology.links)), topology.capacities_gbps, 16)
    assert healthy == pytest.approx(schedule.meta.achieved_gbs, rel=0.02)


def test_references_are_per_version(hpn_schedule):
    """After the swap, the new schedule shares the degraded NIC among fewer pairs, so they read 4x
    faster than under the old one although the fault persists. Compared with the old version's
    references that looks like a recovery and swaps again (the measured thrash of the tree packing
    under Fail2); compared with the new version's own, it is the fabric it was made for."""
    topology, schedule = hpn_schedule
    manager = fail2_seen(topology, schedule)
    manager.step()
    assert manager.versions("job") == {"allgather": 2}
    for seq in range(12, 40):  # same fault, new schedule: rank 0's pairs at 1/2 of healthy, not 1/8
        manager.ingest(samples(16, seq, slow_rank=0, factor=0.5))
        assert manager.step() == []
    assert manager.versions("job") == {"allgather": 2}
    decision = manager.check()[0]
    assert decision.capacities_gbps.min() < 60  # still about Fail2's 50 Gbit/s NIC (the estimate at the flag)
    for seq in range(40, 50):  # now it clears: 2x over the new references
        manager.ingest(samples(16, seq))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]


def test_alltoall_fail2_is_resynthesized_by_column_generation():
    """The same loop for AllToAll: NCCL-style direct sends paced by a degraded NIC get a CG schedule."""
    topology = rail_optimized(1, 2, 8)
    schedule = direct_alltoall(topology).with_meta(version=1)
    manager = fail2_seen(topology, schedule)
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    from mccl.schedule import loads_schedule

    version, text = manager.latest("job", "alltoall")
    issued = loads_schedule(text)
    validate(issued, topology)
    real = fail2(topology)
    old = steady_state_algbw(link_load(schedule, len(real.links)), real.capacities_gbps, 16)
    new = steady_state_algbw(link_load(issued, len(real.links)), real.capacities_gbps, 16)
    assert version == 2 and new > 5 * old  # the LP bounds allow 7.1x (89.06 vs 12.5 GB/s)



def test_register_with_its_synthesis_result_warm_starts_from_its_state():
    topology = rail_optimized(1, 2, 8)
    result = optimize(topology, "alltoall").with_version(1)
    manager = ScheduleManager(topology, ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1))
    with pytest.raises(ControllerError, match="result="):
        manager.register("job", result.schedule.with_meta(version=1), result=result)
    assert manager.register("job", result.schedule, result=result) == 1
    assert manager.active_result("job", "alltoall") is result
    for seq in range(1, 12):
        manager.ingest(samples(16, seq, slow_rank=0 if seq >= 5 else None))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    warm = manager.active_result("job", "alltoall").stats.warm
    assert warm.repaired or warm.restarted


def test_ingest_matches_sample_by_sample_and_the_event_log_is_bounded(hpn_schedule):
    """The vectorized ingest leaves the EWMAs as folding each sample does (two communicators, an
    unknown one, a malformed sample, tagged samples of an old version); events keep only the newest."""
    topology, schedule = hpn_schedule
    manager = ScheduleManager(topology, ControlConfig(alpha=0.5, warmup=2, settle_collectives=1, max_events=2))
    for name in ("job", "other"):
        manager.register(name, schedule)
    batch = []
    for seq in range(1, 6):
        batch += samples(16, seq, slow_rank=0 if seq > 3 else None)
        batch += samples(16, seq, communicator="other")[:20] + samples(16, seq, communicator="nobody")[:3]
    batch.append(Sample("inter", "job", 0, 1, "many", 0.01, 0.0, 5))  # malformed: ignored, the rest folded
    batch += [Sample("inter", "job", 0, 9, 10**6, 0.01, 0.0, 5, "allgather", 0)]  # a version never active
    taken = manager.ingest(batch)
    ewma = manager._comms["job"].ewma
    expected = type(ewma)(16, 0.5, warmup=2)
    for sample in batch:
        if sample.communicator == "job" and sample.seq > 1 and sample.version < 0 and isinstance(sample.bytes, int):
            expected.update(sample.kind, sample.rank, sample.peer, sample.gbps, sample.seq)
    np.testing.assert_array_equal(ewma.value, expected.value)
    np.testing.assert_array_equal(ewma.reference, expected.reference)
    assert taken == manager.samples_taken and manager.samples_ignored == len(batch) - taken
    assert len(manager.events) == 2 and manager.events.total == 2  # two registrations
    manager.register("third", schedule.with_meta(version=1))
    assert len(manager.events) == 2 and manager.events.total == 3 and manager.events[-1].communicator == "third"
    assert manager.events.since(1) == list(manager.events)  # the oldest of those two was dropped
    version, text = manager.latest("job", "allgather")
    assert version == 1 and text == schedule_binary_text(schedule)  # encoded on this first fetch, binary by default
    readable = ScheduleManager(topology, ControlConfig(schedule_format="json"))
    readable.register("job", schedule)
    assert readable.latest("job", "allgather") == (1, dumps_schedule(schedule))
    with pytest.raises(ControllerError, match="schedule_format"):
        ControlConfig(schedule_format="xml")


@pytest.mark.parametrize(("field", "value"), [
    ("absolute_rates", "false"), ("absolute_rates", 1), ("absolute_rates", None), ("guard", "no"), ("guard", 0),
    ("guard_tolerance", 1.0), ("guard_tolerance", -0.1), ("guard_tolerance", float("nan")), ("guard_tolerance", True),
    ("guard_size_bytes", 0), ("guard_size_bytes", float("inf")), ("guard_size_bytes", "1GB"),
])
def test_config_refuses_a_switch_that_is_not_a_bool_and_guard_numbers_out_of_range(field, value):
    """Every field is checked where it is written: ``absolute_rates="false"`` (a string from a config file or a
    flag) would otherwise read as on, and a NaN tolerance would make every guard comparison False."""
    with pytest.raises(ControllerError, match=field):
        ControlConfig(**{field: value})
    assert ControlConfig(absolute_rates=True, guard=False, guard_tolerance=0.0, guard_size_bytes=2**20).absolute_rates
