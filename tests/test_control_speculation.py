"""Synthesis ahead of the flag: a drifting schedule's candidate is made before the drift test flags it,
so the flag's own path skips synthesis (issue 15, the reaction path). Real tree-packing synthesis on a
2 × 4 fabric; the telemetry drifts one step per check, as an EWMA sees a NIC halve."""

from __future__ import annotations

import pytest

from mccl.control import ControlConfig, Sample, ScheduleManager
from mccl.errors import ControllerError
from mccl.synth import optimize
from mccl.topology import rail_optimized

TOPOLOGY = rail_optimized(1, 2, 4)


def _round(seq: int, factor: float, communicator: str = "job") -> list[Sample]:
    """One collective's telemetry: every cross-host pair at 10 Gbit/s, pairs through rank 0's NIC at ``factor``."""
    out = [Sample("intra", communicator, i, -1, 10**9, 0.8, 0.0, seq) for i in range(8)]
    for i in range(8):
        for j in range(8):
            if (i < 4) != (j < 4):
                rate = 10.0 * (factor if 0 in (i, j) else 1.0)
                out.append(Sample("inter", communicator, i, j, int(rate * 1e9 / 8 * 0.01), 0.01, 0.0, seq))
    return out


def _drive(**knobs) -> tuple[ScheduleManager, list[int]]:
    """Healthy rounds, then rank 0's NIC at half, one round and one check at a time, until a version is issued;
    the manager and the number of syntheses run before each check."""
    calls: list[int] = []

    def counting(*args, **kwargs):
        calls.append(1)
        return optimize(*args, **kwargs)

    manager = ScheduleManager(TOPOLOGY, ControlConfig(alpha=0.3, gamma=0.3, warmup=2, settle_collectives=1),
                              synthesize=counting, **knobs)
    manager.register("job", optimize(TOPOLOGY, "allgather").schedule.with_meta(version=1))
    seen = []
    for seq in range(1, 40):
        manager.ingest(_round(seq, 1.0 if seq < 6 else 0.5))
        seen.append(len(calls))
        manager.step()
        if manager.versions("job")["allgather"] > 1:
            break
    return manager, seen


def test_a_drifting_schedule_is_synthesized_before_its_flag_and_the_flag_reuses_it():
    manager, _ = _drive()
    assert manager.versions("job") == {"allgather": 2}
    reaction = manager.reactions[-1]
    assert reaction.outcome == "issued" and reaction.issued_version == 2
    assert reaction.ahead and manager.speculations >= 1 and reaction.ahead_synth_s > 0
    # what the flag itself spent on synthesis: checking the speculation, far less than the synthesis it replaced
    assert reaction.synth_end - reaction.synth_start < reaction.ahead_synth_s
    assert reaction.evidence_at is not None and reaction.evidence_at <= reaction.flagged_at <= reaction.issued_at
    synthesized = [e for e in manager.events if e.kind == "synthesized"]
    assert synthesized[-1].text.startswith("ahead of the flag")


def test_without_speculation_or_outside_the_tolerance_the_flag_synthesizes_itself():
    for knobs in ({"speculate": None}, {"speculate_tolerance": 0.0}):
        manager, _ = _drive(**knobs)
        reaction = manager.reactions[-1]
        assert reaction.outcome == "issued" and not reaction.ahead, knobs
    assert manager.speculations >= 1  # tolerance 0: it speculated, and the drift moved on before the flag


def test_bad_speculation_settings_are_refused():
    with pytest.raises(ControllerError, match="speculate"):
        ScheduleManager(TOPOLOGY, speculate=1.5)
    with pytest.raises(ControllerError, match="speculate_tolerance"):
        ScheduleManager(TOPOLOGY, speculate_tolerance=-0.1)


def test_an_issued_version_is_handed_on_before_the_step_speculates_for_another_schedule():
    """The service pushes on ``on_issue``; a speculation for another communicator in the same step must not
    hold that back (measured: 38 ms of push delay on the emulated fabric before the order was fixed)."""
    order: list[str] = []

    def logging_synthesis(topology, *args, **kwargs):
        order.append("synthesis")
        return optimize(topology, *args, **kwargs)

    manager = ScheduleManager(TOPOLOGY, ControlConfig(alpha=0.3, gamma=0.3, warmup=2, settle_collectives=1),
                              synthesize=logging_synthesis)
    schedule = optimize(TOPOLOGY, "allgather").schedule.with_meta(version=1)
    for name in ("drifting", "flagged"):  # the drifting one is checked first
        manager.register(name, schedule)
        for seq in range(1, 6):
            manager.ingest(_round(seq, 1.0, name))
    manager.ingest(_round(6, 0.5, "drifting"))  # δ 0.15: half of Γ
    for seq in range(6, 14):
        manager.ingest(_round(seq, 0.5, "flagged"))
    manager.step(on_issue=lambda: order.append("issued"))
    assert manager.versions("flagged") == {"allgather": 2} and manager.versions("drifting") == {"allgather": 1}
    assert order == ["synthesis", "issued", "synthesis"] and manager.speculations == 1
