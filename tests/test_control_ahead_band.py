"""The wider band of speculation reuse, judged by the guard (issue 15, eighth session; :mod:`mccl.control.ahead`,
"The wider band"): a speculation whose capacities are outside the 10 % band of the flag's but within the wider one
is offered at the flag and issued only where the guard chooses it on the flag's capacities; otherwise it is refused
and the flag synthesizes on its own capacities. Real tree-packing syntheses on a 2 × 4 fabric."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.ahead import Speculations
from mccl.control.drift import drift_test
from mccl.control.prepared import prepare_update
from mccl.errors import ControllerError
from mccl.schedule import Collective
from mccl.synth import optimize
from mccl.topology import rail_optimized
from test_control_speculation import _round  # noqa: E402  (tests/ is on sys.path: the same telemetry helper)

TOPOLOGY = rail_optimized(1, 2, 4)
NOMINAL = np.array([10.0, 10.0, 10.0, 10.0])


def _nic(rank: int, factor: float) -> np.ndarray:
    """Nominal capacities with ``rank``'s NIC (both directions: GPU → ToR and ToR → GPU) at ``factor``."""
    capacities = TOPOLOGY.capacities_gbps.copy()
    gpu = TOPOLOGY.gpus[rank]
    for index, link in enumerate(TOPOLOGY.links):
        if gpu in (link.src, link.dst) and "tor" in f"{link.src}{link.dst}":
            capacities[index] *= factor
    return capacities


def _flag_with_held(held_for: np.ndarray, band: float | None) -> ScheduleManager:
    """A manager (Γ 0.2, α 0.3, no speculation of its own) holding a speculation made for ``held_for``; rank 0's
    NIC then halves, and the EWMA reaches the flag at about 0.75 of nominal on its links."""
    manager = ScheduleManager(TOPOLOGY, ControlConfig(alpha=0.3, gamma=0.2, warmup=2, settle_collectives=1),
                              speculate=None, speculate_band=band)
    active = optimize(TOPOLOGY, "allgather").with_version(1)
    manager.register("job", active.schedule, result=active)
    result = optimize(TOPOLOGY.with_capacities(held_for), "allgather", previous=active)
    manager._speculations.keep(("job", Collective.ALLGATHER), 1, held_for, result, 0.01,
                               prepare_update(active.schedule, result, TOPOLOGY))
    for seq in range(1, 30):
        manager.ingest(_round(seq, 1.0 if seq < 6 else 0.5))
        manager.step()
        if manager.reactions:
            break
    return manager


def test_the_wider_band_offers_and_validates():
    speculations = Speculations(NOMINAL, 0.1, 0.3)
    speculations.keep("k", 1, np.array([6.0, 10.0, 10.0, 10.0]), result=None, seconds=0.01)
    held, how = speculations.take_with("k", 1, np.array([8.0, 9.0, 10.0, 10.0]))  # back 0.2: not near, not further
    assert held is not None and how == "band" and speculations.offered == 1
    speculations.keep("k", 1, np.array([6.0, 10.0, 10.0, 10.0]), result=None, seconds=0.01)
    assert speculations.take_with("k", 1, np.array([9.5, 10.0, 10.0, 10.0])) == (None, "")  # 0.35 back: outside
    speculations.keep("k", 1, np.array([6.0, 10.0, 10.0, 10.0]), result=None, seconds=0.01)
    assert speculations.take("k", 1, np.array([8.0, 9.0, 10.0, 10.0])) is None  # take: no band (no guard to judge)
    for band in (0.1, 0.05, 1.0, True):
        with pytest.raises(ControllerError, match="speculate_band"):
            Speculations(NOMINAL, 0.1, band)


@pytest.mark.slow  # ~3 s: three real tree-packing syntheses
def test_a_band_reuse_the_guard_would_not_issue_is_refused_and_synthesized():
    """The held speculation was made for rank 1's NIC at 0.75, the flag finds rank 0's at about 0.75 (every link
    within 0.3 of it): on the flag's capacities it is no faster than the active schedule, so reusing it would keep
    the active one through the fault. Refused: synthesized on the flag's capacities, and that one is issued."""
    held_for = _nic(1, 0.75)
    manager = _flag_with_held(held_for, band=0.3)
    reaction = manager.reactions[-1]
    assert manager.speculation_reuse == {"continued": 0, "offered": 1, "refused": 1}
    assert reaction.outcome == "issued" and not reaction.ahead
    steps = [(e.kind, e.text) for e in manager.events if e.kind in ("refused", "synthesized", "issued")]
    assert [kind for kind, _ in steps] == ["synthesized", "refused", "synthesized", "issued"]
    assert steps[0][1].startswith("ahead of the flag") and steps[2][1].startswith("after a refused speculation")
    issued = manager.latest_schedule("job", "allgather")[1]
    speculated = optimize(TOPOLOGY.with_capacities(held_for), "allgather",
                          previous=optimize(TOPOLOGY, "allgather")).schedule
    assert not np.array_equal(issued.transfers.route_links, speculated.transfers.route_links)


@pytest.mark.slow  # ~3 s: three real tree-packing syntheses
def test_a_band_reuse_the_guard_chooses_is_issued_ahead_of_the_flag():
    """Made for rank 0's NIC at 0.55, the flag's reading (~0.75) went back 0.2 × nominal: outside the 10 % band,
    and not "kept going"; within the wider band the guard chooses it — issued without a synthesis on the path.
    Without the wider band the same flag synthesizes."""
    manager = _flag_with_held(_nic(0, 0.55), band=0.3)
    reaction = manager.reactions[-1]
    assert manager.speculation_reuse == {"continued": 0, "offered": 1, "refused": 0}
    assert reaction.outcome == "issued" and reaction.ahead
    # its cut taken on the flag's fabric, which its references stand for: the new version's drift test starts at 0
    comm = manager._comms["job"]
    assert drift_test(comm.active[Collective.ALLGATHER].cut, comm.base, 0.2).max_deviation == pytest.approx(0, abs=1e-9)
    without = _flag_with_held(_nic(0, 0.55), band=None)
    assert without.reactions[-1].outcome == "issued" and not without.reactions[-1].ahead
