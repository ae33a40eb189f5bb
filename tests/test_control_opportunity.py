"""Swap back when the fabric recovers (issue 15, :mod:`mccl.control.opportunity`).

The emulated fabric's situation on the per-path rate model: ``rail_optimized(1, 2, 4)`` (the demo's 8 ranks on
2 hosts), rank 0's NIC halved both ways, then restored. The AllGather made for the fault loads that NIC
lightly and its cut lies elsewhere, so the drift test never flags it after the repair: before the check it ran
on at 0.896 of the healthy rate (seed 0). With it, the lightly loaded paths through the repaired NIC show the
repair, and the healthy schedule is issued back.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from mccl.control import ControlConfig
from mccl.control.observed import CollectiveClock
from mccl.control.opportunity import Opportunities, healthy_observed_faster, recovered_links
from mccl.errors import ControllerError
from mccl.experiments.closedloop_fluid import run_fluid_loop
from mccl.experiments.closedloop_sim import TelemetryModel
from mccl.experiments.demo import synth_options
from mccl.experiments.loop_scenarios import fault_changes
from mccl.schedule import Collective
from mccl.sim.analytic import evaluate
from mccl.synth import optimize
from mccl.topology import degrade, rail_optimized

GPU0_NIC = (16, 17)  # gpu0 -> tor0.0 and back on rail_optimized(1, 2, 4)


def _nic_fault_loop(kind: str, seed: int = 0, gamma: float = 0.3):
    fabric = rail_optimized(1, 2, 4)
    faulted = fabric
    for link in GPU0_NIC:
        assert fabric.links[link].gbps == 400.0 and "gpu0" in (fabric.links[link].src, fabric.links[link].dst)
        faulted = degrade(faulted, link, factor=0.5)
    options = synth_options(4)
    schedule = optimize(fabric, kind, options=options.get(Collective(kind))).schedule
    size = (256 << 10) * 8
    healthy_s, degraded_s = evaluate(schedule, fabric, size).time_s, evaluate(schedule, faulted, size).time_s
    gap = 3 * healthy_s
    start = 8 * (healthy_s + gap)
    end = start + 16 * (degraded_s + gap)
    until = end + 16 * (healthy_s + gap)
    config = ControlConfig(alpha=0.15, gamma=gamma, warmup=3, settle_collectives=3, synth_options=options)
    loop = run_fluid_loop(fabric, schedule, size, changes=fault_changes(fabric, faulted, start, end), until_s=until,
                          gap_s=gap, config=config, model=TelemetryModel(seed=seed), synthesis_delay_s=0,
                          job=f"nic-{kind}")
    loop.check()

    def late_median(first: float, last: float) -> float:  # the second half of a window: after any swap settled
        values = [run.algbw_gbs for run in loop.runs if run.start_s >= first and run.end_s <= last]
        return statistics.median(values[len(values) // 2:])

    return loop, late_median(0.0, start), late_median(end, until), end


def test_the_allgather_made_for_a_nic_fault_is_swapped_back_to_the_healthy_rate_after_the_repair():
    loop, healthy, restored, end = _nic_fault_loop("allgather")
    assert len(loop.swaps) == 2  # one per fabric change
    assert loop.swaps[1].time_s > end  # the second after the repair
    assert restored == pytest.approx(healthy, rel=0.05)  # was 0.896 of healthy without the opportunity check
    flags = [item.event for item in loop.events_of("flagged")]
    assert "opportunity" in flags[-1].text and "back to nominal" in flags[-1].text
    issued = [item.event for item in loop.events_of("issued")]
    assert "the healthy schedule, observed faster" in issued[-1].text
    # detection: at most 10 collectives after the repair
    assert sum(1 for run in loop.runs if end <= run.end_s <= loop.events_of("flagged")[-1].time_s) <= 10


def test_recovered_links_needs_a_degraded_base_and_a_clear_recovery():
    nominal = np.array([400.0, 400.0, 2880.0])
    measured = np.array([400.0, 380.0, 2880.0])
    assert len(recovered_links(None, measured, nominal, 0.2)) == 0  # a healthy version: nothing to recover
    assert recovered_links(np.array([200.0, 200.0, 2880.0]), measured, nominal, 0.2).tolist() == [0, 1]
    # a base within Γ of nominal is not "believed degraded"; a gain within Γ is not "clearly faster"
    assert len(recovered_links(np.array([350.0, 400.0, 2880.0]), measured, nominal, 0.2)) == 0
    assert len(recovered_links(np.array([200.0, 200.0, 2880.0]), np.array([230.0, 235.0, 2880.0]), nominal,
                               0.2)) == 0
    with pytest.raises(ControllerError, match="do not match"):
        recovered_links(np.ones(2), measured, nominal, 0.2)


def test_a_judged_recovery_is_not_reopened_but_a_new_link_is():
    fabric = rail_optimized(1, 2, 4)
    result = optimize(fabric, "allgather")
    opportunities = Opportunities(0.2)
    opportunities.remember("job", result.schedule, result)
    opportunities.remember("job", result.schedule.with_meta(version=5), None)  # the first one stays the healthy one
    healthy = opportunities.healthy_result("job", Collective.ALLGATHER)
    assert healthy.schedule is result.schedule and healthy.origin is None
    nominal = fabric.capacities_gbps
    base = nominal.copy()
    base[list(GPU0_NIC)] = 200.0
    measured = base.copy()
    measured[16] = 400.0
    found = opportunities.find("job", Collective.ALLGATHER, 1, base, measured, nominal)
    assert found.links == (16,) and found.ratio == pytest.approx(2.0) and not found.back_to_nominal
    opportunities.judged("job", Collective.ALLGATHER, 1, found)
    assert opportunities.find("job", Collective.ALLGATHER, 1, base, measured, nominal) is None
    measured[17] = 400.0
    again = opportunities.find("job", Collective.ALLGATHER, 1, base, measured, nominal)
    assert again.links == (16, 17) and again.back_to_nominal
    assert opportunities.find("job", Collective.ALLGATHER, 2, base, measured, nominal) is not None  # a new version
    with pytest.raises(ControllerError, match="positive gamma"):
        Opportunities(0.0)


def test_back_to_nominal_the_healthy_schedules_observed_time_decides():
    clock = CollectiveClock(alpha=1.0, keep=3)
    for seq in (1, 2, 3):
        for _ in range(2):
            clock.add("allgather", 1, seq, 1.0, n_ranks=2)  # the healthy version 1: 1 s per collective
    assert healthy_observed_faster(clock, Collective.ALLGATHER, 1, (1.3, 1.2), 0.01) is True  # active 1.2 s now
    assert healthy_observed_faster(clock, Collective.ALLGATHER, 1, (1.3, 1.005), 0.01) is False  # within tolerance
    assert healthy_observed_faster(clock, Collective.ALLGATHER, 7, (1.3, 1.2), 0.01) is None  # never observed
    assert healthy_observed_faster(clock, Collective.ALLGATHER, 1, None, 0.01) is None  # no times for the active
