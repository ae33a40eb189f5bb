"""gloo's traffic pinned by host pair on the routed 2-leaf × 2-spine (issue 16, deliverable 3): two tenants'
gloo jobs (hosts 0–2 and 1–3) apart on the two spines, then collided on one, under the same processes.

The uplinks' byte counters show where each phase's traffic went; the jobs' times show what it cost.
Skipped without root (network namespaces).
"""

from __future__ import annotations

import os

import pytest

from mccl.experiments.netemu.fabric import BASE_PREFIX, unsupported_reason
from mccl.experiments.netemu.gloopin import GlooJob, PairPinning, pin_pair, run_gloo_jobs, unpin_pair
from mccl.experiments.netemu.routes import RoutedFabric, RoutedSpineLeaf
from mccl.experiments.netemu.shaping import FabricError


def test_a_pair_on_one_leaf_or_off_the_fabric_is_refused():
    fabric = RoutedFabric(RoutedSpineLeaf("x-"))  # not built: the checks come first
    with pytest.raises(FabricError, match="share leaf"):
        pin_pair(fabric, 0, 1, 0)
    with pytest.raises(FabricError, match="no host pair"):
        pin_pair(fabric, 0, 9, 0)
    with pytest.raises(FabricError, match="spine 2"):
        unpin_pair(fabric, 0, 2, 2)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_tenants_gloo_jobs_pinned_apart_beat_the_same_jobs_collided():
    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    jobs = [GlooJob("a", (0, 2), 1 << 20, 3), GlooJob("b", (1, 3), 1 << 20, 3)]
    with RoutedFabric(RoutedSpineLeaf(f"{BASE_PREFIX}{os.getpid()}-g", host_mbit=200, uplink_mbit=100)) as fabric:
        pinning = PairPinning(fabric)
        apart, collided = run_gloo_jobs(fabric, jobs, [pinning.phase((0, 2, 0), (1, 3, 1)),
                                                       pinning.phase((0, 2, 0), (1, 3, 0))])
    assert apart["exact"] and collided["exact"]
    up = apart["uplinks"]
    total = up[(0, 0)] + up[(0, 1)]
    assert min(up[(0, 0)], up[(0, 1)]) > 0.35 * total, up  # apart: one job per spine
    up = collided["uplinks"]
    assert up[(0, 1)] < 0.05 * (up[(0, 0)] + up[(0, 1)]), up  # collided: spine 1 idle
    slower = {job.name: collided["seconds"][job.name] / apart["seconds"][job.name] for job in jobs}
    assert min(slower.values()) > 1.4, (slower, apart["seconds"], collided["seconds"])
