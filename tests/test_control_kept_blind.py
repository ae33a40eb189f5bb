"""A schedule the guard kept must still be flagged by a fault that deepens after the keep (the pacer demo's lost
loop, 2026-12-01: flagged at once, kept by the guard while the collective clock still read the healthy time —
"observed 40 -> 4x ms" — and never flagged again in the 26 degraded collectives left).

Why it was lost: a kept schedule's cut was re-based by recomputing the bottleneck cut on the measured fabric, where
the one link the evidence blamed was the only binding link. A cut of one link has slack 0 whatever that link's
capacity is, so the drift test (Algorithm 1) could never see it deepen from the first reading (one window of the
fault, EWMA α 0.5: ~0.56 of nominal) to the fault itself (1/8), nor recover. Now the re-based cut keeps the
schedule's own cut links beside the newly binding ones, their base slacks taken on the measured fabric.

Replayed through a real ``ScheduleManager`` with the pacer demo's settings on its fabric (4 ranks on 2 hosts,
rank 0's NIC at 1/8): the first faulty collective's path windows read slow while its time, counted on every rank,
is still the healthy one (the fault began late in it); the collectives after it are slow in both.
"""

from __future__ import annotations

from mccl.control import ControlConfig, ScheduleManager
from mccl.synth import optimize
from mccl.telemetry import COLLECTIVE, Sample
from mccl.topology import rail_optimized
from test_control_manager import samples  # tests/ is on sys.path under pytest

SIZE = 4 * 2**20  # the pacer demo's AllGather: 1 MiB per rank, 4 ranks
HEALTHY_S, FAULTED_S = 0.045, 0.185  # the pacer demo's collective times, healthy and under the fault


def _timed(seq: int, seconds: float) -> list[Sample]:
    """Every rank's launch-to-completion time of collective ``seq``."""
    return [Sample(COLLECTIVE, "job", rank, -1, SIZE, seconds, 0.0, seq) for rank in range(4)]


def test_a_fault_that_deepens_after_the_guard_kept_the_schedule_is_flagged_again_and_swapped():
    pacer = rail_optimized(1, 2, 2)
    schedule = optimize(pacer, "allgather").schedule.with_meta(version=1)
    manager = ScheduleManager(pacer, ControlConfig(alpha=0.5, gamma=0.2, warmup=4, settle_collectives=4))
    manager.register("job", schedule, size_bytes=SIZE)
    for seq in range(1, 11):
        manager.ingest(samples(4, seq) + _timed(seq, HEALTHY_S))
        assert manager.step() == []
    # the first collective of the fault: its path windows read slow, its time (counted on every rank) is the healthy one
    manager.ingest(samples(4, 11, slow_rank=0) + _timed(11, HEALTHY_S))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "kept"]
    kept = manager.guard.decisions[-1]
    assert not kept.trusted and kept.observed_s == (HEALTHY_S, HEALTHY_S)  # the clock had not caught up
    kinds = []
    for seq in range(12, 30):  # the fault, seen by paths and clock alike
        manager.ingest(samples(4, seq, slow_rank=0) + _timed(seq, FAULTED_S))
        kinds += [event.kind for event in manager.step()]
        if "issued" in kinds:
            break
    assert kinds[:3] == ["flagged", "synthesized", "issued"], kinds
    assert manager.versions("job") == {"allgather": 2} and manager.guard.decisions[-1].observed_s[1] > 2 * HEALTHY_S
