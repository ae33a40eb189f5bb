"""A speculation is reused when the drift only went further its way (issue 15, sixth session; :mod:`mccl.control.ahead`,
"The drift that kept going"): on short collectives the EWMA often crosses from ½ Γ to Γ between two checks, past
the band of the last speculation, and the flag then synthesized on its own path."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.ahead import Speculations
from mccl.synth import optimize
from mccl.topology import rail_optimized
from test_control_speculation import _round  # noqa: E402  (tests/ is on sys.path: the same telemetry helper)

NOMINAL = np.array([10.0, 10.0, 10.0, 10.0])


def _held(speculations: Speculations, capacities: list[float]) -> None:
    speculations.keep("k", 1, np.array(capacities), result=None, seconds=0.01)  # the result is not looked at


def test_a_deeper_fault_on_the_same_links_takes_the_speculation():
    speculations = Speculations(NOMINAL, 0.1)
    _held(speculations, [7.0, 10.0, 7.5, 10.2])  # links 0 and 2 left nominal (by more than 1.0), the rest noise
    assert speculations.take("k", 1, np.array([4.0, 9.5, 5.1, 10.0])) is not None
    assert speculations.continued == 1


def test_a_drift_back_a_new_link_or_another_version_synthesizes():
    cases = {"link 0 went back towards nominal": [9.0, 10.0, 7.5, 10.0],
             "link 1 left nominal after the speculation": [4.0, 8.0, 5.0, 10.0],
             "link 0 crossed to the other side": [11.5, 10.0, 7.5, 10.0]}
    for why, capacities in cases.items():
        speculations = Speculations(NOMINAL, 0.1)
        _held(speculations, [7.0, 10.0, 7.5, 10.0])
        assert speculations.take("k", 1, np.array(capacities)) is None, why
    speculations = Speculations(NOMINAL, 0.1)
    _held(speculations, [7.0, 10.0, 7.5, 10.0])
    assert speculations.take("k", 2, np.array([4.0, 10.0, 5.0, 10.0])) is None  # made for version 1
    noise = Speculations(NOMINAL, 0.1)
    _held(noise, [9.5, 10.0, 10.4, 10.0])  # nothing left nominal: noise has no direction
    assert noise.take("k", 1, np.array([5.0, 10.0, 10.0, 10.0])) is None
    exact = Speculations(NOMINAL, 0.0)  # no band: only equality
    _held(exact, [7.0, 10.0, 7.5, 10.0])
    assert exact.take("k", 1, np.array([4.0, 10.0, 5.0, 10.0])) is None and exact.continued == 0


@pytest.mark.slow  # 3.6 s at load 20 (two real tree-packing syntheses)
def test_the_flag_after_a_jump_past_the_band_reuses_the_speculation():
    """The manager end to end: a speculation at δ 0.15 (rank 0's NIC at 0.7), then the NIC falls to 0.2 in one
    collective: the flag's capacities are far outside the band, the drift only went further — taken."""
    topology = rail_optimized(1, 2, 4)
    manager = ScheduleManager(topology, ControlConfig(alpha=0.3, gamma=0.3, warmup=2, settle_collectives=1))
    manager.register("job", optimize(topology, "allgather").schedule.with_meta(version=1))
    for seq in range(1, 20):
        manager.ingest(_round(seq, 1.0 if seq < 6 else 0.7 if seq < 8 else 0.2))
        manager.step()
        if manager.versions("job")["allgather"] > 1:
            break
    reaction = manager.reactions[-1]
    assert manager.speculations == 1 and reaction.outcome == "issued" and reaction.ahead
    assert manager._speculations.continued == 1
