"""Late landing (issue 15): a version made for a fault that clears before the ranks run it.

Replayed through a real ``ScheduleManager`` (as ``tests/test_control_recorded.py``): rank 0's NIC at 50/400
(Fail2) is flagged and a new AllToAll version issued; the ranks run two more collectives on the old version,
by then on the repaired fabric, and then the new version on the repaired fabric. Before the fix its references
were learned there against a degraded base and nothing flagged it again (the emulated fabric's AllToAll
restored at 0.90 of healthy); now the manager sees the old version ran faster before the new one landed,
re-bases, and the version made for the fault is flagged and replaced on the healthy fabric.
"""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.guard import alpha_beta_seconds
from mccl.synth import optimize
from mccl.telemetry import COLLECTIVE, Sample
from mccl.topology import fail2, rail_optimized
from test_control_manager import samples  # tests/ is on sys.path under pytest

SIZE = 16 * 2**20 * 16


def _timed(seq: int, seconds: float, version: int) -> list:
    """Every rank's time of collective ``seq``, tagged with the schedule version it ran."""
    return [Sample(COLLECTIVE, "job", rank, -1, SIZE, seconds, 0.0, seq, "alltoall", version) for rank in range(16)]


@pytest.mark.parametrize("repaired_before_landing", [True, False])
def test_a_version_landing_after_its_fault_cleared_is_flagged_back(repaired_before_landing):
    hpn = rail_optimized(1, 2, 8)
    schedule = optimize(hpn, "alltoall").schedule.with_meta(version=1)
    manager = ScheduleManager(hpn, ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1))
    manager.register("job", schedule, size_bytes=SIZE)
    healthy_s, faulted_s = alpha_beta_seconds(schedule, hpn, SIZE), alpha_beta_seconds(schedule, fail2(hpn), SIZE)
    for seq in range(1, 5):
        manager.ingest(samples(16, seq) + _timed(seq, healthy_s, 1))
    for seq in range(5, 12):
        manager.ingest(samples(16, seq, slow_rank=0) + _timed(seq, faulted_s, 1))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    assert manager.versions("job") == {"alltoall": 2}
    v2 = manager._comms["job"].active[schedule.collective].schedule
    late = healthy_s if repaired_before_landing else faulted_s
    for seq in (12, 13):  # the ranks are still on v1: the fabric is repaired (or not) before v2 lands
        manager.ingest((samples(16, seq) if repaired_before_landing else samples(16, seq, slow_rank=0))
                       + _timed(seq, late, 1))
        assert manager.step() == []
    kinds = []
    truth = hpn if repaired_before_landing else fail2(hpn)
    for seq in range(14, 24):  # v2 runs, on that fabric
        slow = None if repaired_before_landing else 0
        manager.ingest(samples(16, seq, slow_rank=slow) + _timed(seq, alpha_beta_seconds(v2, truth, SIZE), 2))
        kinds += [event.kind for event in manager.step()]
    if repaired_before_landing:
        assert kinds[0] == "rebased" and "flagged" in kinds and "issued" in kinds
        assert manager.versions("job")["alltoall"] == 3
        # the version now running was chosen on the healthy fabric: as fast there as the one the job started on
        v3 = manager._comms["job"].active[schedule.collective].schedule
        assert alpha_beta_seconds(v3, hpn, SIZE) <= healthy_s * 1.01
    else:  # landed on the fabric it was made for: nothing to undo
        assert "rebased" not in kinds and manager.versions("job") == {"alltoall": 2}
        assert manager._comms["job"].base is not None and np.min(manager._comms["job"].base) < 400
