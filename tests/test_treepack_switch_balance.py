"""The lower-rate search of switch removal straightens only the split it keeps (issue 17: it straightened
every trial split, which at 512 GPUs made Phase 2 as costly as tree construction)."""

from __future__ import annotations

import numpy as np

from mccl.schedule import validate
from mccl.synth import optimize
from mccl.synth.treepack import switch_removal
from mccl.topology import rail_optimized

# rail_optimized(1, 2, 4) factors where the split at the rounded rate keeps too few trees, so the search
# tries lower rates (the same case as tests/test_treepack_unbalanced.py::LOWER_RATE).
LOWER_RATE = [1.0] * 6 + [0.2159] + [1.0] * 5 + [0.6149] + [1.0] * 5 + [0.3397] + [1.0] * 5 + [0.1809, 0.1944] + \
    [1.0] * 7 + [0.2452, 1.0, 1.0, 0.3594, 0.2161, 1.0, 1.0, 0.1604] + [1.0] * 7


def test_only_the_kept_split_is_straightened(monkeypatch) -> None:
    calls: list[int] = []
    real = switch_removal.straighten_routes

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(switch_removal, "straighten_routes", counting)
    base = rail_optimized(1, 2, 4)
    topology = base.with_capacities(base.capacities_gbps * np.array(LOWER_RATE))
    schedule = optimize(topology, "allgather").schedule
    stats = dict(schedule.meta.stats)
    assert stats["switch_balance_retries"] >= 1  # several splits tried
    assert len(calls) == 1  # one straightened
    validate(schedule, topology)  # whose routes are simple paths (the validator refuses a repeated node)
    assert schedule.transfers.route_lengths.max() <= 4
