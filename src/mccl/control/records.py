"""The Schedule Manager's records: what it did (:class:`Event`), what the drift test said
(:class:`Decision`), and its state per communicator and collective (private to
:mod:`mccl.control.manager`, kept here so that module holds only the decisions)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mccl.control.drift import CutProfile, DriftResult, OverlayMap
from mccl.control.ewma import OverlayEWMA
from mccl.control.guard import SizeMeter
from mccl.schedule import Collective, Schedule
from mccl.synth import SynthesisResult

__all__ = ["Event", "Decision"]


@dataclass(frozen=True)
class Event:
    """One thing the manager did (wall-clock ``time``, s since the epoch). ``kind``: registered,
    flagged, synthesized, issued, kept (the guard found the active schedule fastest), aborted,
    unavailable, failed. ``value``: max δ (flagged), synthesis seconds (synthesized, aborted),
    achieved GB/s on the measured topology (issued), predicted speedup of the active schedule
    over the candidate (kept)."""

    time: float
    kind: str
    communicator: str
    collective: str
    version: int
    value: float = 0.0
    text: str = ""


@dataclass(frozen=True)
class Decision:
    """The drift test of one active schedule under the current measurements."""

    communicator: str
    collective: Collective
    version: int
    result: DriftResult
    capacities_gbps: np.ndarray


@dataclass
class _Active:
    schedule: Schedule
    result: SynthesisResult | None  # what the controller synthesized it with (warm state); None when registered
    version: int
    text: str
    cut: CutProfile
    busy: bool = False
    judge_after_seq: int = 0


@dataclass
class _Communicator:
    ewma: OverlayEWMA
    level: OverlayEWMA | None = None  # the faster estimate synthesis uses (ControlConfig.alpha_level)
    active: dict[Collective, _Active] = field(default_factory=dict)
    coverage: OverlayMap | None = None  # overlay link -> physical links, over every version so far
    base: np.ndarray | None = None  # capacities the current references stand for (see mccl.control.manager)
    last_seq: int = 0
    startup_through: int = 0  # samples of collectives up to this seq are start-up transients
    ignore_through: int = 0  # untagged samples of collectives up to this seq are ignored (older versions)
    sizes: dict[Collective, float] = field(default_factory=dict)  # registered collective sizes (bytes)
    meter: SizeMeter = field(default_factory=SizeMeter)
