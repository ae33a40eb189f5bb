"""What a scenario reports: rows (what ran, on which fabric state, how fast), a timeline, events.

Shared by the scenarios (:mod:`mccl.experiments.scenarios`, :mod:`mccl.experiments.mccs`),
the plots (:mod:`mccl.experiments.plotting`) and the ``mccl sim`` table; it imports no
scenario, so none of them imports another to get these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mccl.schedule import Collective

__all__ = ["MiB", "NOT_YET", "ScenarioRow", "ScenarioReport"]

MiB = 2**20
NOT_YET = "not yet available"


@dataclass(frozen=True)
class ScenarioRow:
    scenario: str  # the fabric state (or time window)
    collective: Collective
    schedule: str
    fabric: str
    size_bytes: float  # nccl-tests S
    algbw_gbs: float | None
    busbw_gbs: float | None
    note: str = ""
    speedup: float | None = None  # over the scenario's baseline row
    chain: str = ""  # the critical chain, summarized: its length and the link it waited on most


@dataclass(frozen=True)
class ScenarioReport:
    name: str
    title: str
    rows: tuple[ScenarioRow, ...]
    timeline: tuple[tuple[float, float, str], ...] = ()  # (end time s, algbw GB/s, schedule) per collective
    events: tuple[tuple[float, str], ...] = field(default=())  # (time s, what happened)
