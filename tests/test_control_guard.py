"""Never worse than what it replaces (issue 11, deliverable 3): the manager's guard before a swap.

The decisive test: on the healthy 2×8 HPN the tree-packing AllGather simulates at ~232 GB/s and
the NCCL ring at ~426 (issue 11). A manager that swaps trees back in when a fault clears makes
the job slower than NCCL; with the simulator as its predictor it issues the ring instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.guard import (
    AlphaBeta,
    CollectiveClock,
    SizeMeter,
    alpha_beta_seconds,
    choose,
    explained,
    size_from_bytes,
)
from mccl.errors import ControllerError
from mccl.schedule import Collective
from mccl.sim.analytic import evaluate
from mccl.sim.engine import simulate_schedule
from mccl.sim.inputs import SimOptions
from mccl.synth import optimize
from mccl.telemetry import COLLECTIVE, Sample
from mccl.topology import fail2, rail_optimized
from test_control_manager import samples  # tests/ is on sys.path under pytest

SIZE = 16 * 2**20 * 16  # 16 MiB per rank on 16 GPUs


def simulated_seconds(schedule, topology, size_bytes):
    """The experiments' predictor: one flow-level simulation (0.1-0.5 s CPU at 16 GPUs)."""
    return simulate_schedule(schedule, topology, size_bytes, options=SimOptions(keep_chain=False)).time_s


@pytest.fixture(scope="module")
def hpn():
    return rail_optimized(1, 2, 8)


def test_alpha_beta_default_is_the_analytic_model(hpn):
    """The default predictor restates mccl.sim.analytic.evaluate (control may not import sim)."""
    for topology in (hpn, fail2(hpn)):
        for method in (None, "ring.nccl"):
            schedule = optimize(hpn, "allgather", method=method).schedule
            for size in (2**20, SIZE):
                assert alpha_beta_seconds(schedule, topology, size) == pytest.approx(
                    evaluate(schedule, topology, size).time_s, rel=1e-12)
    with pytest.raises(ControllerError, match="positive size"):
        alpha_beta_seconds(schedule, hpn, 0.0)


def test_choose_prefers_candidate_then_active_then_baseline_within_tolerance():
    assert choose({"candidate": 1.0, "active": 0.995, "baseline": 0.996}, 0.01) == "candidate"
    assert choose({"candidate": 1.0, "active": 0.98, "baseline": 0.975}, 0.01) == "active"
    assert choose({"candidate": 1.0, "active": 0.98, "baseline": 0.5}, 0.01) == "baseline"
    assert choose({"candidate": 1.0, "baseline": 0.5}, 0.0) == "baseline"
    with pytest.raises(ControllerError):
        choose({"active": 1.0}, 0.01)


def test_size_from_telemetry_bytes_recovers_s(hpn):
    """Every transfer moves its chunk's fraction of S/n: the bytes of one collective give S back."""
    for kind in ("allgather", "alltoall"):
        schedule = optimize(hpn, kind).schedule
        fractions = schedule.chunks.fraction[schedule.transfers.chunk]
        moved = float(np.sum(fractions)) * SIZE / schedule.n_ranks
        assert size_from_bytes(schedule, moved) == pytest.approx(SIZE)
    meter = SizeMeter()
    meter.add("allgather", 5, 10.0)
    meter.add("allgather", 5, 20.0)
    assert meter.bytes_of(Collective.ALLGATHER) is None  # seq 5 may still be arriving
    meter.add("allgather", 6, 1.0)
    assert meter.bytes_of(Collective.ALLGATHER) == 30.0 and meter.bytes_of(Collective.ALLTOALL) is None


def _manager(topology, schedule, predict, size=SIZE):
    config = ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1)
    manager = ScheduleManager(topology, config, predict=predict)
    manager.register("job", schedule, size_bytes=size)
    for seq in range(1, 5):
        manager.ingest(samples(16, seq))
    return manager


@pytest.mark.slow  # six flow-level predictions and three syntheses, ~4 s
def test_healthy_fabric_gets_the_ring_when_trees_would_be_slower(hpn):
    """NCCL ring registered; Fail2 → the trees win on the degraded fabric and are issued; the fault
    clears → healthy trees (~232 GB/s simulated) against the ring (~426): the ring comes back."""
    ring = optimize(hpn, "allgather", method="ring.nccl").schedule.with_meta(version=1)
    manager = _manager(hpn, ring, simulated_seconds)
    for seq in range(5, 12):
        manager.ingest(samples(16, seq, slow_rank=0))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    into = manager.guard.decisions[-1]
    assert into.chosen == "candidate" and into.size_source == "registered" and into.size_bytes == SIZE
    assert into.speedup("active") > 3  # trees around the 50 Gbit/s NIC against a ring through it
    for seq in range(12, 16):  # the trees run under the fault: their references
        manager.ingest(samples(16, seq, slow_rank=0))
    assert manager.step() == []
    for seq in range(16, 30):  # repaired
        manager.ingest(samples(16, seq))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    back = manager.guard.decisions[-1]
    assert back.chosen == "baseline", dict(back.predicted_s)
    assert back.speedup("candidate") > 1.5  # simulated: ring ~426 GB/s, healthy trees ~232
    issued = manager.active_result("job", "allgather").schedule
    assert issued.meta.synthesizer == "ring.nccl" and issued.meta.version == 3
    algbw = SIZE / simulated_seconds(issued, hpn, SIZE) / 1e9
    assert algbw == pytest.approx(SIZE / simulated_seconds(ring, hpn, SIZE) / 1e9, rel=0.01)  # never below NCCL
    for seq in range(30, 40):  # the ring on a healthy fabric: nothing more to do
        manager.ingest(samples(16, seq))
        assert manager.step() == []


def test_active_predicted_fastest_is_kept_and_not_flagged_again(hpn):
    """A predictor that finds the flagged schedule fastest: no swap, and the same measurements
    do not flag it again (its cut is re-based on the measured fabric)."""
    schedule = optimize(hpn, "alltoall").schedule.with_meta(version=1)
    predicted: list[str] = []

    def prefer_active(candidate, topology, size_bytes):
        predicted.append(candidate.meta.synthesizer)
        return 1.0 if candidate.meta.version == 1 else 2.0

    manager = _manager(hpn, schedule, prefer_active, size=None)
    for seq in range(5, 12):
        manager.ingest(samples(16, seq, slow_rank=0))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "kept"]
    decision = manager.guard.decisions[-1]
    assert decision.chosen == "active" and decision.size_source == "telemetry"
    assert "alltoall.direct" in predicted  # the baseline was compared too
    assert manager.versions("job") == {"alltoall": 1}
    for seq in range(12, 20):
        manager.ingest(samples(16, seq, slow_rank=0))
        assert manager.step() == []


def test_guard_off_issues_the_candidate_and_a_failing_predictor_does_too(hpn):
    schedule = optimize(hpn, "alltoall").schedule.with_meta(version=1)

    def broken(candidate, topology, size_bytes):
        return float("nan")

    for config_guard, predict in ((False, simulated_seconds), (True, broken)):
        config = ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1, guard=config_guard)
        manager = ScheduleManager(hpn, config, predict=predict)
        manager.register("job", schedule)
        for seq in range(1, 12):
            manager.ingest(samples(16, seq, slow_rank=0 if seq >= 5 else None))
        assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
        assert manager.guard.decisions == []


def test_cached_alpha_beta_equals_the_plain_model_across_capacity_changes(hpn):
    """AlphaBeta keeps loads and latencies per schedule; capacities change between calls (as the
    measured topology does), and its answers stay those of alpha_beta_seconds."""
    topology = hpn
    trees = optimize(topology, "allgather").schedule
    ring = optimize(topology, "allgather", method="ring.nccl").schedule
    predict = AlphaBeta(keep=1)  # keep=1: the two schedules evict each other
    for fabric in (topology, fail2(topology), topology.with_capacities(topology.capacities_gbps * 0.5)):
        for schedule in (trees, ring, trees):
            assert predict(schedule, fabric, SIZE) == pytest.approx(alpha_beta_seconds(schedule, fabric, SIZE),
                                                                   rel=1e-12)
    with pytest.raises(ControllerError, match="positive size"):
        predict(trees, topology, 0.0)


def test_size_meter_batch_equals_sample_by_sample():
    rng = np.random.default_rng(1)
    seqs = np.maximum.accumulate(rng.integers(1, 9, 300)) - rng.integers(0, 2, 300)  # mostly rising, some late
    nbytes = rng.integers(1, 1000, 300).astype(float)
    one, batch = SizeMeter(), SizeMeter()
    for seq, size in zip(seqs.tolist(), nbytes.tolist(), strict=True):
        one.add("alltoall", seq, size)
    for part in np.array_split(np.arange(300), 7):  # several batches, each continuing the last
        batch.add_many("alltoall", seqs[part], nbytes[part])
    assert batch.bytes_of(Collective.ALLTOALL) == one.bytes_of(Collective.ALLTOALL) > 0
    assert batch._open == one._open


def test_collective_clock_counts_each_collective_once_and_keeps_reference_and_level():
    """A collective's time: its slowest rank's, counted when every rank reported (or a later seq arrived);
    reference = median of a version's first `keep`, now = EWMA with the measured fabric's α."""
    clock = CollectiveClock(alpha=0.5, keep=3)
    assert clock.observed(Collective.ALLGATHER, 1) is None
    for seq, times in ((1, (1.0, 1.2, 0.4)), (2, (1.1, 1.1, 1.1)), (3, (0.9, 1.0, 1.0))):
        for seconds in times:
            clock.add("allgather", 1, seq, seconds, n_ranks=3)
    clock.add("allgather", 1, 3, 50.0, n_ranks=3)  # a duplicate after every rank reported: dropped
    assert clock.observed(Collective.ALLGATHER, 1) == (pytest.approx(1.1), pytest.approx(0.5 * 1.0 + 0.5 * 1.15))
    clock.add("allgather", 1, 4, 2.0, n_ranks=3)  # one rank of seq 4 so far: not counted yet
    assert clock.observed(Collective.ALLGATHER, 1)[1] == pytest.approx(1.075)
    clock.add("allgather", 1, 5, 3.0, n_ranks=3)  # a later seq closes seq 4 with the ranks it has
    clock.add("allgather", 1, 4, 99.0, n_ranks=3)  # seq 4 arriving late: dropped
    assert clock.observed(Collective.ALLGATHER, 1) == (pytest.approx(1.1), pytest.approx(0.5 * 2.0 + 0.5 * 1.075))
    assert clock.observed(Collective.ALLGATHER, 2) is None and clock.observed(Collective.ALLTOALL, 1) is None
    for seq in range(1, 5):  # untagged samples: one series, used for any version until forgotten
        clock.add("", -1, seq, 4.0, n_ranks=1)
    assert clock.observed(Collective.ALLTOALL, 7) == (4.0, 4.0)
    clock.forget_untagged()
    assert clock.observed(Collective.ALLTOALL, 7) is None
    with pytest.raises(ControllerError):
        CollectiveClock(alpha=0.0)


def test_explained_is_the_predicted_over_the_observed_change():
    assert explained(1.0, 2.0, 3.0, 6.0) == pytest.approx(1.0)  # predicted 2x, observed 2x: a constant bias cancels
    assert explained(1.0, 2.0, 1.0, 1.0) == pytest.approx(2.0)  # predicted 2x slower, nothing observed
    with pytest.raises(ControllerError, match="positive"):
        explained(1.0, float("nan"), 1.0, 1.0)


def _timed(seq: int, seconds: float, n: int = 16) -> list:
    """Every rank's launch-to-completion time of collective ``seq`` (Sample kind "collective")."""
    return [Sample(COLLECTIVE, "job", rank, -1, SIZE, seconds, 0.0, seq) for rank in range(n)]


@pytest.mark.parametrize("slowdown", ["as predicted", "overstated", "none"])
def test_guard_keeps_the_schedule_when_the_measured_fabric_does_not_explain_the_collective_time(hpn, slowdown):
    """Telemetry says rank 0's NIC is at 50/400 (Fail2). If the collective really slowed as that fabric
    predicts, the re-synthesis is issued; if it slowed 1.3x less, the fabric is not an explanation but the
    candidate's ~7x gain is far beyond that error: issued; if it runs as fast as before, the candidate
    would only win back a slowdown nobody observes: the active schedule is kept, and not flagged again on
    that evidence."""
    slows = slowdown != "none"
    schedule = optimize(hpn, "alltoall").schedule.with_meta(version=1)
    manager = ScheduleManager(hpn, ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1))
    manager.register("job", schedule, size_bytes=SIZE)
    healthy_s = alpha_beta_seconds(schedule, hpn, SIZE)
    for seq in range(1, 5):  # seq 1 is start-up; every sample of the later ones is taken, collective times too
        assert manager.ingest(samples(16, seq) + _timed(seq, healthy_s)) == (len(samples(16, seq)) + 16) * (seq > 1)
    faulted_s = alpha_beta_seconds(schedule, fail2(hpn), SIZE) / (1.3 if slowdown == "overstated" else 1.0) \
        if slows else healthy_s
    for seq in range(5, 12):
        manager.ingest(samples(16, seq, slow_rank=0) + _timed(seq, faulted_s))
    events = manager.step()
    decision_events = [event.kind for event in events]
    decision = manager.guard.decisions[-1]
    verdict = "explained" if decision.trusted else "unexplained"
    assert f"{verdict} (r {decision.explained:.3f}, best predicted gain" in events[-1].text  # the check, reported
    assert decision.observed_s == (pytest.approx(healthy_s), pytest.approx(faulted_s, rel=0.02))  # EWMA, α 0.5
    if slows:
        assert decision_events == ["flagged", "synthesized", "issued"]
        assert decision.trusted is (slowdown == "as predicted")
        assert decision.explained == pytest.approx(1.0 if decision.trusted else 1.3, abs=0.15)
        assert manager.versions("job") == {"alltoall": 2}
    else:
        assert decision_events == ["flagged", "synthesized", "kept"] and not decision.trusted
        assert decision.explained > 1.2 and decision.chosen == "active"
        assert manager.versions("job") == {"alltoall": 1}
        for seq in range(12, 18):
            manager.ingest(samples(16, seq, slow_rank=0) + _timed(seq, faulted_s))
            assert manager.step() == []
    assert manager._comms["job"].meter.bytes_of(Collective.ALLTOALL) == sum(  # "collective" samples are no path
        s.bytes for s in samples(16, 10, slow_rank=0))


def test_a_flag_ahead_of_the_clock_is_judged_again_once_the_slowed_collectives_are_counted(hpn):
    """The pacer demo's lost swap: the fabric was measured from the first samples of a fault before any slowed
    collective had completed on every rank, so the clock still read the healthy time; the guard found the
    fabric unexplained and kept the schedule. Kept, but not re-based on that fabric: once the clock has counted
    the slowed collectives the same fault is flagged again, explained, and the re-synthesis issued."""
    schedule = optimize(hpn, "alltoall").schedule.with_meta(version=1)
    manager = ScheduleManager(hpn, ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1))
    manager.register("job", schedule, size_bytes=SIZE)
    healthy_s, faulted_s = alpha_beta_seconds(schedule, hpn, SIZE), alpha_beta_seconds(schedule, fail2(hpn), SIZE)
    for seq in range(1, 5):
        manager.ingest(samples(16, seq) + _timed(seq, healthy_s))
    for seq in range(5, 8):  # the fault's path samples; the ranks' collective times of these not in yet
        manager.ingest(samples(16, seq, slow_rank=0))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "kept"]
    assert not manager.guard.decisions[-1].trusted and manager.versions("job") == {"alltoall": 1}
    kinds = []
    for seq in range(8, 14):  # now every collective's time comes in with its samples
        manager.ingest(samples(16, seq, slow_rank=0) + _timed(seq, faulted_s))
        kinds += [event.kind for event in manager.step()]
    assert kinds == ["flagged", "synthesized", "issued"] and manager.versions("job") == {"alltoall": 2}
    assert manager.guard.decisions[-1].trusted
