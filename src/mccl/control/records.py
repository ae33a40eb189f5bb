"""The Schedule Manager's records: what it did (:class:`Event`), what the drift test said
(:class:`Decision`), and its state per communicator and collective (private to
:mod:`mccl.control.manager`, kept here so that module holds only the decisions)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from mccl.control.drift import CutProfile, DriftResult, OverlayMap
from mccl.control.ewma import OverlayEWMA
from mccl.control.observed import CollectiveClock, SizeMeter
from mccl.control.plausible import PortRates
from mccl.schedule import Collective, Schedule, dumps_schedule, schedule_binary_text
from mccl.synth import SynthesisResult

__all__ = ["Event", "EventLog", "Decision"]


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


class EventLog:
    """The manager's most recent events, at most ``limit`` (a service runs for weeks; an unbounded list
    grew by every flag, synthesis and issue). Reads like a list of the kept events (``len``, iteration,
    indexing and slicing); ``total`` counts every event ever appended, and :meth:`since` gives the ones
    appended after a given total (those still kept)."""

    def __init__(self, limit: int) -> None:
        self._kept: deque[Event] = deque(maxlen=limit)
        self.total = 0

    def append(self, event: Event) -> None:
        self._kept.append(event)
        self.total += 1

    def since(self, total: int) -> list[Event]:
        """Events appended after ``total`` events had been (the oldest may have been dropped)."""
        count = min(self.total - total, len(self._kept))
        return list(self._kept)[len(self._kept) - count:] if count > 0 else []

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._kept)

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        return list(self._kept)[index]


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
    cut: CutProfile
    busy: bool = False
    judge_after_seq: int = 0
    _text: str | None = None
    _text_lock: threading.Lock = field(default_factory=threading.Lock)
    schedule_format: str = "binary"  # ControlConfig.schedule_format
    # set at issue when collective times are reported: (the replaced version, its observed (reference, now) seconds
    # when the flag was decided, the base before this version's); checked once this version has run (manager,
    # "Late landing")
    landing: tuple[int, tuple[float, float], object] | None = None
    # set when the guard kept this version: its cut re-based on the capacities it was kept on, and those capacities;
    # a later flag needs a change since then that deepens the fault (manager_guard._Guarded._cut_on)
    kept: tuple[CutProfile, np.ndarray] | None = None

    @property
    def text(self) -> str:
        """The schedule file the ranks fetch, encoded once, on the first fetch. Why not at issue: the
        JSON text of a 512-GPU schedule (1.7–2.1 M transfers) takes 2–3 s CPU, more than the decision
        and the synthesis together; encoding it when a rank first asks keeps it off the decision path
        (and off the manager's lock: the caller holds only this schedule's), and a version superseded
        before any rank fetched it is never encoded. ``schedule_format`` "binary": the binary file's
        text form (:func:`mccl.schedule.schedule_binary_text`, ~30× cheaper to encode at 512 GPUs);
        "json": the readable file. The ranks' ``loads_schedule`` reads either."""
        with self._text_lock:
            if self._text is None:
                self._text = schedule_binary_text(self.schedule) if self.schedule_format == "binary" \
                    else dumps_schedule(self.schedule)
            return self._text


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
    ports: PortRates = field(default_factory=PortRates)  # recent port rates, to drop implausible windows
    clock: CollectiveClock = field(default_factory=CollectiveClock)  # observed collective times (the guard)
