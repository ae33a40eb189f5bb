"""The simulator's send gate (MCCS TS): flows start only inside a job's windows; a hook's gate applies at launch."""

from __future__ import annotations

import pytest

from mccl.sim import CollectiveOp, ControlHook, Job, SimOptions, simulate
from mccl.synth.ring import naive_ring
from mccl.telemetry import SendWindows
from mccl.topology import single_switch

GB = 1e9


@pytest.fixture(scope="module")
def pair():
    fabric = single_switch(2, 100)  # 12.5 GB/s per direction
    return fabric, naive_ring(fabric, "allgather")


def test_windows_arithmetic():
    windows = SendWindows(10.0, 1.0, ((0.2, 0.5), (0.7, 0.9)))
    assert windows.is_open(10.3) and windows.is_open(9.3) and not windows.is_open(10.6)
    assert windows.next_open(10.3) == 10.3
    assert windows.next_open(10.55) == pytest.approx(10.7)
    assert windows.next_open(10.95) == pytest.approx(11.2)
    assert windows.duty == pytest.approx(0.5)
    for bad in (((0.5, 0.2),), ((0.1, 0.3), (0.2, 0.4)), ((0.0, 1.5),), ()):
        with pytest.raises(ValueError):
            SendWindows(0.0, 1.0, bad)
    with pytest.raises(ValueError):
        SendWindows(0.0, 0.0, ((0.0, 0.1),))


def test_a_gated_job_starts_only_inside_its_window_and_a_started_flow_runs_on(pair):
    fabric, ring = pair
    alone = simulate(fabric, [Job.single(ring, 2 * GB)]).only()  # 1 GB each way: 80 ms
    gate = SendWindows(0.0, 1.0, ((0.5, 0.52),))  # opens at 0.5 s for 20 ms only
    gated = simulate(fabric, [Job.single(ring, 2 * GB, gate=gate)]).only()
    assert gated.start_s == 0.0
    # held until 0.5 s; its one flow each way starts inside the window and runs past its end
    assert gated.end_s == pytest.approx(0.5 + alone.time_s, rel=1e-6)


def test_gated_slices_wait_for_the_next_window(pair):
    fabric, ring = pair
    gate = SendWindows(0.0, 0.1, ((0.0, 0.01),))  # 10 ms open in every 100 ms
    sliced = SimOptions(slices=8, keep_chain=False)  # 8 slices of 125 MB: 10 ms each at 12.5 GB/s
    result = simulate(fabric, [Job.single(ring, 2 * GB, gate=gate)], options=sliced).only()
    # a connection sends one slice at a time: one slice per window, the 8th starts at 0.7 s
    assert result.end_s == pytest.approx(0.7 + 0.01, rel=1e-3)


def test_a_gate_set_by_the_hook_applies_from_the_next_collective(pair):
    fabric, ring = pair
    gate = SendWindows(0.0, 1.0, ((0.9, 1.0),))

    def set_gate(view):
        if not view.gates:
            view.gate("t", gate)

    job = Job("t", (CollectiveOp(ring, 2 * GB),), iterations=2)
    runs = simulate(fabric, [job], hook=ControlHook(0.01, set_gate)).runs_of("t")
    assert runs[0].time_s == pytest.approx(0.08, rel=1e-3)  # in flight when the gate came: not held
    assert runs[1].start_s == pytest.approx(0.08, rel=1e-3)
    assert runs[1].end_s == pytest.approx(0.9 + 0.08, rel=1e-3)  # held until the window
