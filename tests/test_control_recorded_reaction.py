"""The controller on a recorded reaction run (tests/data, no processes): detection within 10 collectives and a flag
that reuses its speculation — the reaction benchmark's controller (issue 15, eighth session).

The recording: every rank's samples of ``benchmarks/reaction.py``'s AllToAll set-up, rank 0's NIC halved. Live (α
0.15, the 10 % band) that run flagged 14 collectives after the fault and synthesized on the flag's path (72 ms). The
replay feeds it, one collective at a time in end-time order (``benchmarks/reaction_replay.py``'s procedure), into a
manager with the benchmark's controller: α 0.2 (why: ``benchmarks/reaction.py``, ``SETUPS``) and the wider band of
speculation reuse judged by the guard (:mod:`mccl.control.ahead`, "The wider band"). Real column-generation
syntheses (the speculations and the flag's)."""

from __future__ import annotations

import json
from pathlib import Path

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.drift import drift_test
from mccl.experiments.demo import synth_options
from mccl.schedule import Collective, loads_schedule
from mccl.telemetry import Sample
from mccl.topology import parse_topology

RECORDING = Path(__file__).parent / "data" / "reaction_alltoall_fault.json"


def _replay(alpha: float, band: float | None) -> tuple[ScheduleManager, list[tuple[int, str]]]:
    """The manager (the benchmark's Γ, warm-up and speculation) and each flag's (collectives after the fault,
    outcome) up to the first issued version."""
    data = json.loads(RECORDING.read_text())
    options = synth_options(data["chunks"])
    manager = ScheduleManager(parse_topology(data["topology"]),
                              ControlConfig(alpha=alpha, gamma=0.3, warmup=3, settle_collectives=3,
                                            synth_options=options), speculate=0.5, speculate_band=band)
    manager.register("a2a", loads_schedule(data["schedule"]))
    by_seq: dict[int, list[Sample]] = {}
    for kind, sender, receiver, nbytes, seconds, end, seq in data["samples"]:
        by_seq.setdefault(seq, []).append(Sample(kind, "a2a", sender, receiver, nbytes, seconds, end, seq))
    outcomes = []
    for seq in sorted(by_seq):
        manager.ingest(by_seq[seq])
        outcomes += [(seq - data["first_degraded_seq"] + 1, event.kind) for event in manager.step()
                     if event.kind in ("kept", "issued")]
        if manager.versions("a2a")["alltoall"] > 1:
            break
    return manager, outcomes


def test_the_benchmarks_controller_issues_within_ten_collectives_from_its_speculation():
    manager, outcomes = _replay(alpha=0.2, band=0.25)
    assert outcomes and outcomes[0][1] == "issued" and 1 <= outcomes[0][0] <= 10, outcomes  # none before the fault
    reaction = manager.reactions[-1]
    assert reaction.ahead  # the speculation was reused: no synthesis on the flag's path
    comm = manager._comms["a2a"]  # made up to the band away, its cut re-based on the flag's fabric (its base)
    assert drift_test(comm.active[Collective.ALLTOALL].cut, comm.base, 0.3).max_deviation < 1e-9
    # the seventh session's controller on the same samples: flagged too late (and synthesized on the path)
    _, before = _replay(alpha=0.15, band=None)
    assert before and before[0][0] > 10, before
