"""The controller on a recorded sample sequence: `mccl demo` on the emulated fabric (tests/data), no processes.

The recording: the AllGather's receive-side samples of collectives 1–14 of one run, rank 0's NIC halved
before collective 7 (2026-12-01, fourth session). Before the reference window and the screen of
implausible windows (:mod:`mccl.control.ewma`, :mod:`mccl.control.plausible`), the manager took no decision
during the whole fault: pair 4 → 7 was sampled twice in 12 collectives and was "still learning".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.plausible import PortRates
from mccl.schedule import loads_schedule
from mccl.telemetry import Sample
from mccl.topology import parse_topology

RECORDING = Path(__file__).parent / "data" / "netemu_allgather_fault.json"


def _replay(config: ControlConfig) -> tuple[ScheduleManager, dict[int, list], int]:
    """The manager (the demo's settings) with the recorded schedule; its decisions after each collective."""
    data = json.loads(RECORDING.read_text())
    topology = parse_topology(data["topology"])
    manager = ScheduleManager(topology, config)
    manager.register("ag", loads_schedule(data["schedule"]))
    by_seq: dict[int, list[Sample]] = {}
    for kind, sender, receiver, nbytes, seconds, end, seq in data["samples"]:
        by_seq.setdefault(seq, []).append(Sample(kind, "ag", sender, receiver, nbytes, seconds, end, seq))
    decisions = {}
    for seq in sorted(by_seq):
        manager.ingest(by_seq[seq])
        decisions[seq] = manager.check()
    return manager, decisions, data["first_degraded_seq"]


def test_the_recorded_fault_is_flagged_within_ten_collectives_and_blamed_on_rank_0s_nic():
    manager, decisions, fault = _replay(ControlConfig(alpha=0.15, gamma=0.3, warmup=3, settle_collectives=3))
    flagged = [seq for seq, made in decisions.items() if made and made[0].result.flagged]
    assert flagged and all(seq >= fault for seq in flagged)  # nothing before the fault
    assert flagged[0] - fault + 1 <= 10
    capacities = next(made[0] for seq, made in decisions.items() if seq == flagged[0]).capacities_gbps
    topology = manager.topology
    nic_links = [i for i, link in enumerate(topology.links) if "tor" in link.src + link.dst and "gpu" in link.src + link.dst]
    down0 = next(i for i in nic_links if topology.links[i].src.startswith("tor") and topology.links[i].dst == "gpu0")
    nominal = topology.capacities_gbps
    assert capacities[down0] / nominal[down0] == pytest.approx(min(capacities[nic_links] / nominal[nic_links]))
    assert capacities[down0] / nominal[down0] < 0.8


def test_port_windows_faster_than_any_port_are_dropped_slower_ones_kept():
    """Rates of windows (receiver, end, seconds): 20 healthy ones at ~20, then a 0.3 ms window at ~1750 (the
    runtime's short windows), a fault's window at 10 and a repair's at 21 — only the short one goes."""
    ports = PortRates()
    rng = np.random.default_rng(0)
    for index in range(20):
        rate = rng.uniform(15.0, 22.0)
        keep = ports.screen(np.array([0, 0]), np.array([1, 2]), np.array([0, 0]), np.full(2, float(index)),
                            np.full(2, 0.05), np.array([rate / 2, rate / 2]))  # two peers share one window
        assert keep.all()
    assert 15.0 < ports.typical(0) < 22.0
    keep = ports.screen(np.array([0, 0, 0, 1]), np.array([1, 2, 3, 4]), np.array([0, 5, 6, 0]),
                        np.array([30.0, 31.0, 32.0, 30.0]), np.array([0.0003, 0.1, 0.05, 0.0003]),
                        np.array([1750.0, 10.0, 21.0, 1750.0]))
    assert keep.tolist() == [False, True, True, True]  # the intra window has no history of its kind yet
    assert ports.dropped == 1
