"""The Schedule Manager's reaction path (issue 15, Fig. 13b): synthesis ahead of the flag, and one record per flag.

Synthesis ahead of the flag. A schedule whose drift test is not flagged yet but whose max δ has
reached ``speculate`` × Γ (:class:`~mccl.control.manager.ScheduleManager`) is drifting: the manager
synthesizes for the measured topology now, on its check thread, and keeps the result here
(:class:`Speculations`, counted in ``made``). When the flag comes and the measured capacities are still
within ``tolerance`` × nominal of those it synthesized for (every link), that result is the candidate
and synthesis leaves the path from detection to the swap (event "synthesized" with the seconds the
decision spent on it, ~0, and "ahead of the flag" in its text); otherwise it synthesizes as before. A
drift that keeps moving is re-speculated once it leaves the tolerance. Why a tolerance and not
equality: the EWMA moves by α × the gap with every sample, so the capacities at the flag are never
exactly those of the check before; a 10 % of nominal band is the telemetry's own noise here, and the
guard still compares the candidate on the capacities measured at the flag. What it costs: one
synthesis per drifting schedule per tolerance band crossed, on the check thread (a microburst that
crosses ``speculate`` × Γ and clears costs one synthesis, no swap).

Instrumentation. Besides the events, every flag leaves one :class:`Reaction` in
``ScheduleManager.reactions`` (bounded; wall-clock times): when the telemetry batch folded last before
the flag arrived, the flag, synthesis start and end (whether it was made ahead, its CPU time), the
guard's seconds, the issue. Kept apart from the event log, whose sequence of kinds other code and
tests read; the service returns both in ``status``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mccl.errors import ControllerError
from mccl.synth import SynthesisResult

__all__ = ["Reaction", "Speculation", "Speculations"]


@dataclass
class Reaction:
    """One flag's way to an issued version (wall clock, s since the epoch; None: not reached). ``evidence_at``:
    when the telemetry batch folded last before the flag arrived; ``ahead``: the candidate was synthesized
    before the flag; ``outcome``: issued, kept, aborted, failed or unavailable."""

    communicator: str
    collective: str
    version: int  # the flagged one
    evidence_at: float | None
    flagged_at: float
    synth_start: float | None = None
    synth_end: float | None = None
    ahead: bool = False
    ahead_synth_s: float | None = None  # the synthesis made ahead of the flag
    synth_cpu_s: float | None = None  # CPU time of this thread during synthesis (wall ≫ CPU: starved, not slow)
    guard_s: float | None = None
    issued_at: float | None = None
    issued_version: int | None = None
    outcome: str = ""

    @staticmethod
    def log(limit: int = 256) -> deque[Reaction]:
        """The manager's bounded record of reactions."""
        return deque(maxlen=limit)


@dataclass(frozen=True)
class Speculation:
    """A synthesis made ahead of the flag: for ``version`` on ``capacities`` (Gbit/s per link)."""

    version: int
    capacities: np.ndarray
    result: SynthesisResult
    seconds: float
    at: float  # wall clock, when it was done
    serial: int = 0  # the how-manyth speculation of the manager: tells a re-speculation from the one before
    # validated and prepared against the active schedule it was made for (mccl.control.prepared.prepare_update):
    # the flag that reuses the speculation reuses this too (3–4 ms of CPU off the flag's path at 8 ranks)
    prepared: Any = None


class Speculations:
    """The held speculations, one per (communicator, collective); ``tolerance`` × ``nominal`` per link is near."""

    def __init__(self, nominal: np.ndarray, tolerance: float) -> None:
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 <= tolerance < 1:
            raise ControllerError(f"speculate_tolerance must be in [0, 1), got {tolerance!r}")
        self.band = float(tolerance) * np.asarray(nominal, dtype=float)
        self._held: dict[Hashable, Speculation] = {}
        self.made = 0

    def _near(self, held: Speculation | None, version: int, capacities: np.ndarray) -> bool:
        return held is not None and held.version == version and bool(np.all(np.abs(held.capacities - capacities)
                                                                            <= self.band))

    def wanted(self, key: Hashable, version: int, capacities: np.ndarray) -> bool:
        """Whether a speculation for these capacities is worth making (none held near them)."""
        return not self._near(self._held.get(key), version, capacities)

    def keep(self, key: Hashable, version: int, capacities: np.ndarray, result: SynthesisResult, seconds: float,
             prepared: Any = None) -> None:
        self.made += 1
        self._held[key] = Speculation(version, np.array(capacities, dtype=float), result, seconds, time.time(), self.made,
                                      prepared)

    def held(self) -> dict[Hashable, Speculation]:
        """The speculations held now, by (communicator, collective): what the service pushes to the ranks as
        candidates before the flag (:mod:`mccl.control.candidates`)."""
        return dict(self._held)

    def take(self, key: Hashable, version: int, capacities: np.ndarray) -> Speculation | None:
        """The held speculation for ``key`` if it was made for ``version`` near ``capacities`` (it is dropped
        either way: a flag consumes it)."""
        held = self._held.pop(key, None)
        return held if self._near(held, version, capacities) else None
