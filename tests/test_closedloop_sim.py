"""The controller on the simulator (issue 11, deliverable 2): the swap-count bar on 16 GPUs.

The real ScheduleManager watches an AllToAll stream (column generation) on
rail_optimized(1,2,8) through the virtual executors; synthesis is applied with no
simulated delay so the runs are reproducible. Bar: one swap when Fail2 starts and one
back when it clears; none for a microburst, a failure off the cut, a uniform slowdown
of the cut; every collective ran once, on the version in force at its launch.
"""

from __future__ import annotations

import dataclasses

import pytest

from mccl.errors import MCCLError
from mccl.experiments.closedloop_sim import LoopResult, TelemetryModel, VirtualExecutors
from mccl.experiments.loop_scenarios import EXPECTED_SWAPS, run_scenario
from mccl.sim.closedloop import ControlView, PathSample
from mccl.synth import optimize
from mccl.telemetry import COLLECTIVE, INTER, INTRA
from mccl.topology import rail_optimized


@pytest.mark.slow  # four whole loop scenarios, ~9 s together: kept out of the fast loop, run by CI
@pytest.mark.parametrize("name", ["fail2", "microburst", "offcut", "uniform"])
def test_swap_count_bar_alltoall_16(name: str) -> None:
    outcome = run_scenario(name, "alltoall", healthy=10, persist=16, after=16, synthesis_delay_s=0.0, min_gap_s=0.0)
    outcome.loop.check()
    assert outcome.swaps == EXPECTED_SWAPS[name], [(s.time_s, s.version) for s in outcome.loop.swaps]
    if name == "fail2":
        into, back = outcome.loop.swaps
        assert outcome.start_s < into.time_s < outcome.end_s < back.time_s
        degraded_old = outcome.algbw(outcome.start_s, into.time_s, version=0)
        assert outcome.algbw(into.time_s, outcome.end_s, version=1) > 3 * degraded_old


@pytest.mark.slow
def test_swap_count_bar_allgather_fail2_16() -> None:
    """Was a strict xfail (3 swaps during one fault): v1 shares GPU 0's degraded NIC among fewer pairs,
    which read "healthy" against references learned under v0. References are now per version."""
    outcome = run_scenario("fail2", "allgather", healthy=10, persist=14, after=14, synthesis_delay_s=0.0, min_gap_s=0.0)
    outcome.loop.check()
    assert outcome.swaps == 2
    into, back = outcome.loop.swaps
    assert outcome.start_s < into.time_s < outcome.end_s < back.time_s  # one in, one back when it clears


def test_check_catches_lost_and_wrong_version() -> None:
    outcome = run_scenario("microburst", "alltoall", healthy=4, after=4, synthesis_delay_s=0.0, min_gap_s=0.0)
    loop = outcome.loop
    loop.check()
    with pytest.raises(MCCLError, match="lost"):
        dataclasses.replace(loop, runs=loop.runs[:3] + loop.runs[4:]).check()
    with pytest.raises(MCCLError, match="twice"):
        dataclasses.replace(loop, runs=loop.runs + loop.runs[-1:]).check()
    late = dataclasses.replace(loop.runs[-1], schedule=loop.runs[-1].schedule + " v1")
    with pytest.raises(MCCLError, match="expected 0"):
        LoopResult(loop.runs[:-1] + (late,), (), (), 0, loop.launched, loop.interval_s).check()


@pytest.mark.parametrize("per_peer", [True, False])
def test_virtual_executors_emit_runtime_keys(per_peer: bool) -> None:
    """Inter samples per rank pair across hosts; intra samples per same-host pair (the path rank -> peer),
    or, with the older aggregate, one per rank for its whole host (peer -1)."""
    fabric = rail_optimized(1, 2, 2)
    schedule = optimize(fabric, "alltoall").schedule
    executors = VirtualExecutors("j", "comm", schedule, fabric,
                                 TelemetryModel(noise_sigma=0.0, intra_per_peer=per_peer))
    g = schedule.ranks
    paths = (PathSample("j", g[0], g[1], (1,), 1e6, 1e-3), PathSample("j", g[0], g[1], (2,), 1e6, 5e-4),
             PathSample("j", g[0], g[2], (3,), 2e6, 2e-3), PathSample("other", g[0], g[2], (3,), 9e9, 1.0))
    assert executors.observe(ControlView(0.1, paths, (), {})) == []
    run = type("Run", (), {"job": "j", "schedule": "alltoall.cg v2", "start_s": 0.05, "end_s": 0.2,
                           "size_bytes": 4e6})()  # a finished collective on version 2
    samples = executors.observe(ControlView(0.2, (), (run,), {}))  # type: ignore[arg-type]
    whole = [s for s in samples if s.kind == COLLECTIVE]  # every rank's launch-to-completion time
    assert [(s.rank, s.peer, s.seconds, s.seq, s.version) for s in whole] == [(r, -1, pytest.approx(0.15), 1, 2)
                                                                             for r in range(4)]
    samples = [s for s in samples if s.kind != COLLECTIVE]
    same_host = fabric.node(g[0]).host == fabric.node(g[1]).host
    assert same_host and fabric.node(g[0]).host != fabric.node(g[2]).host
    by_kind = {(s.kind, s.peer): s for s in samples}
    intra = by_kind[(INTRA, 1 if per_peer else -1)]
    assert intra.rank == 0 and intra.bytes == 2_000_000 and intra.seconds == pytest.approx(1e-3)
    assert len(samples) == 2
    assert by_kind[(INTER, 2)].bytes == 2_000_000 and by_kind[(INTER, 2)].seq == 1
    assert {(s.collective, s.version) for s in samples} == {("alltoall", 2)}  # compared with v2's references


@pytest.mark.slow  # two whole AllGather loops with flow-simulated guard predictions, ~5 s each
@pytest.mark.parametrize("name", ["uniform", "fail1"])
def test_uniform_slowdown_is_not_swapped_but_a_local_fault_is_allgather_16(name: str) -> None:
    """Uniform halving of every GPU ingress link: per-pair rates of the tree packing blame links that were
    never slowed, the drift test flags, but the measured fabric does not explain the collective's observed
    time (the guard's check), so no swap. Fail1 (local, same observed slowdown ~1.8x): explained, one swap
    in and one back."""
    outcome = run_scenario(name, "allgather", healthy=10, persist=14, after=14, synthesis_delay_s=0.0, min_gap_s=0.0)
    outcome.loop.check()
    assert outcome.swaps == EXPECTED_SWAPS[name], [(d.chosen, d.explained) for d in outcome.guard]
    first = outcome.guard[0]
    assert first.observed_s[1] > 1.5 * first.observed_s[0]  # both slow the trees down, and both are flagged
    assert first.trusted is (name == "fail1")
