"""``ControlConfig.alpha_level``: a slow EWMA decides, a fast one says what the fabric is now.

Why it matters (issue 11, the controller on the simulator): with a slow α alone the first
schedule is made from an estimate that has moved only about Γ, a schedule for the wrong
depth. With ``alpha_level`` the first synthesis sees the real depth.
"""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.errors import ControllerError
from mccl.synth import optimize
from mccl.topology import rail_optimized
from test_control_manager import samples  # tests/ is on sys.path under pytest


def _run(alpha_level: float | None) -> tuple[ScheduleManager, list[np.ndarray]]:
    topology = rail_optimized(1, 2, 8)
    schedule = optimize(topology, "alltoall").schedule
    seen: list[np.ndarray] = []

    def synthesize(measured, kind, ranks, **options):  # the real synthesizer, its input recorded
        seen.append(measured.capacities_gbps.copy())
        return optimize(measured, kind, ranks, **options)

    config = ControlConfig(alpha=0.1, gamma=0.2, warmup=2, settle_collectives=1, alpha_level=alpha_level)
    manager = ScheduleManager(topology, config, synthesize=synthesize)
    manager.register("job", schedule)
    for seq in range(1, 5):
        manager.ingest(samples(16, seq))
    for seq in range(5, 30):
        manager.ingest(samples(16, seq, slow_rank=0))
        manager.step()
    return manager, seen


def test_level_estimate_gives_one_synthesis_at_the_real_depth() -> None:
    topology = rail_optimized(1, 2, 8)
    manager, seen = _run(alpha_level=1.0)
    assert manager.versions("job") == {"alltoall": 1}  # one swap for one persistent change
    assert len(seen) == 1
    slowest = seen[0] / topology.capacities_gbps
    assert slowest.min() == pytest.approx(50 / 400, rel=1e-6)  # the real Fail2 depth, not a partial one


def test_without_level_the_synthesis_sees_a_partial_depth() -> None:
    """The slow estimate flags when it has moved about Γ: the schedule is made for a NIC at more than
    half its speed, not the real 1/8. (Before references were per version it was flagged again as
    the estimate converged; now the new version's references are learned under the fault, so the
    wrong depth stays — which is why the simulator's scenarios use ``alpha_level``.)"""
    manager, seen = _run(alpha_level=None)
    assert len(seen) >= 1
    assert (seen[0] / rail_optimized(1, 2, 8).capacities_gbps).min() > 0.5  # flagged at a partial estimate


def test_alpha_level_is_checked() -> None:
    with pytest.raises(ControllerError, match="alpha"):
        ScheduleManager(rail_optimized(1, 2, 4), ControlConfig(alpha_level=0.0))
