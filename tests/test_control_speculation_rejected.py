"""A speculation taken because the drift went further than it was made for, which the guard does not choose, is
followed by the flag's own synthesis (issue 11, eighth session; :mod:`mccl.control.manager_guard`). Before, the flag
ended "kept" and the schedule made for the capacities measured at the flag was never synthesized (flow loop, Fail1
AllGather, seed 1: no swap where one 1.21x faster existed). Real tree-packing syntheses on a 2 × 4 fabric; the guard's
predictor is α-β except for the speculations, which it is told are slow — the verdict this logic reacts to."""

from __future__ import annotations

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.guard import ACTIVE, CANDIDATE, alpha_beta_seconds
from mccl.schedule import Schedule
from mccl.synth import SynthesisResult, optimize
from mccl.topology import Topology, rail_optimized
from test_control_speculation import _round  # noqa: E402  (tests/ is on sys.path: the same telemetry helper)

TOPOLOGY = rail_optimized(1, 2, 4)


def _first_flag(nic: list[float]) -> tuple[ScheduleManager, list[SynthesisResult], list[SynthesisResult]]:
    """Rank 0's NIC at ``nic[seq]`` per collective (1.0 after the list), one check per collective, until the first
    flag's decision; the manager, the syntheses it ran ahead of the flag and those it ran at the flag."""
    ahead: list[SynthesisResult] = []
    at_flag: list[SynthesisResult] = []
    manager: ScheduleManager | None = None

    def synthesize(*args, **kwargs) -> SynthesisResult:
        made = optimize(*args, **kwargs)
        (at_flag if manager is not None and manager.reactions else ahead).append(made)
        return made

    def predict(schedule: Schedule, topology: Topology, size_bytes: float) -> float:
        if any(schedule.transfers is made.schedule.transfers for made in ahead):
            return 1.0  # a speculation: far slower than anything else here
        return alpha_beta_seconds(schedule, topology, size_bytes)

    manager = ScheduleManager(TOPOLOGY, ControlConfig(alpha=0.3, gamma=0.3, warmup=2, settle_collectives=1),
                              synthesize=synthesize, predict=predict)
    manager.register("job", optimize(TOPOLOGY, "allgather").schedule.with_meta(version=1))
    for seq in range(1, 30):
        manager.ingest(_round(seq, nic[seq] if seq < len(nic) else 1.0))
        manager.step()
        if manager.reactions:
            break
    return manager, ahead, at_flag


def test_a_rejected_speculation_made_for_a_shallower_fault_is_followed_by_the_flags_own_synthesis():
    # a speculation at δ 0.15 (NIC at 0.7), then the NIC falls to 0.2 in one collective: taken as "continued"
    manager, ahead, at_flag = _first_flag([1.0] * 6 + [0.7] * 2 + [0.2] * 22)
    reaction = manager.reactions[-1]
    assert manager._speculations.continued == 1 and len(ahead) >= 1 and len(at_flag) == 1
    rejected, chosen = manager.guard.decisions[-2:]
    assert rejected.chosen != CANDIDATE and chosen.chosen == CANDIDATE
    assert reaction.outcome == "issued" and not reaction.ahead and manager.versions("job") == {"allgather": 2}
    assert manager.active_result("job", "allgather").schedule.transfers is at_flag[0].schedule.transfers
    kinds = [event.kind for event in manager.events if event.kind != "registered"]
    assert kinds == ["flagged", "synthesized", "refused", "synthesized", "issued"]
    assert manager._speculations.refused == 1


def test_a_rejected_speculation_within_its_band_stands():
    # the NIC halves and stays: the flag's capacities are those the speculation was made for, within the band
    manager, ahead, at_flag = _first_flag([1.0] * 6 + [0.5] * 24)
    reaction = manager.reactions[-1]
    assert manager._speculations.continued == 0 and len(ahead) >= 1 and not at_flag
    assert manager.guard.decisions[-1].chosen == ACTIVE and reaction.outcome == "kept" and reaction.ahead
    assert manager.versions("job") == {"allgather": 1}
