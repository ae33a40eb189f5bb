"""Never worse than what it replaces (issue 11, deliverable 3): the manager's guard before a swap.

The decisive test: on the healthy 2×8 HPN the tree-packing AllGather simulates at ~232 GB/s and
the NCCL ring at ~426 (issue 11). A manager that swaps trees back in when a fault clears makes
the job slower than NCCL; with the simulator as its predictor it issues the ring instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.guard import AlphaBeta, SizeMeter, alpha_beta_seconds, choose, size_from_bytes
from mccl.errors import ControllerError
from mccl.schedule import Collective
from mccl.sim.analytic import evaluate
from mccl.sim.engine import simulate_schedule
from mccl.sim.inputs import SimOptions
from mccl.synth import optimize
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
