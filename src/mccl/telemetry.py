"""The telemetry sample: the contract between executors (``mccl.runtime``) and the
controller (``mccl.control``).

A leaf module like :mod:`mccl.errors`: it imports nothing of mccl, so the runtime
(which must not import the controller) and the controller (which must not import
the runtime or torch) share one definition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["COLLECTIVE", "INTER", "INTRA", "Sample", "SendWindows"]

INTER = "inter"
INTRA = "intra"
COLLECTIVE = "collective"


@dataclass(frozen=True)
class Sample:
    """One measurement window (mccl-paper §5): ``bytes`` moved in ``seconds`` while saturated.

    **What ``seconds`` is: the time the measuring port was busy** — from the window's first known
    arrival to its last, less the time the port carried nothing (its senders had nothing to send: a
    relay waiting for its input). So ``bytes / seconds`` is the path's share of the port's rate while
    busy, and the samples of one window (same receiver, kind, end time and duration) add up to the
    port's busy rate: its capacity once it was saturated in the window (:mod:`mccl.runtime.windows`).

    **Direction: a sample describes the path ``rank → peer``** (``rank`` sends, ``peer``
    receives), whichever end measured it — the runtime measures at the receiving end (a
    receive completes when its last byte has arrived, :mod:`mccl.runtime.telemetry`), so
    its samples are reported by ``peer``. ``kind``: ``"inter"`` — the two ranks are on
    different hosts; ``"intra"`` — on the same host (the host fabric, §3.3). ``peer`` is
    -1 only for ``"intra"``: the aggregate of every same-host path out of ``rank`` (the
    rank's cumulative injection into its host fabric), which the runtime no longer emits
    but a sample may still carry. ``end_time``: wall clock (s since the epoch) when the
    window closed. ``seq``: the communicator's sequence number of the collective.
    ``collective`` and ``version``: the schedule whose traffic the window measured, when the
    measuring rank knows it ("" and -1: unknown). Why: a rank pair's rate depends on the schedule
    (how many pairs share a NIC), so the controller compares a sample only with references
    learned under the same version; untagged samples are attributed by sequence number.

    ``kind="collective"`` is not a path but one rank's whole collective: ``seconds`` from its
    launch to its completion on ``rank`` (``peer`` -1, ``bytes`` the collective's nccl-tests size
    S). Why: the controller's never-worse guard checks its measured fabric against the time the
    active collective is observed to take (:mod:`mccl.control.guard`, "Is the measured fabric an
    explanation?"); per-path windows alone do not give it.
    """

    kind: str
    communicator: str
    rank: int
    peer: int
    bytes: int
    seconds: float
    end_time: float
    seq: int
    collective: str = ""
    version: int = -1

    @property
    def gbps(self) -> float:
        """The measured rate in Gbit/s (topology units)."""
        return self.bytes * 8 / self.seconds / 1e9 if self.seconds > 0 else float("inf")


@dataclass(frozen=True)
class SendWindows:
    """When a time-shared job may start sends (MCCS §3.3 TS): the controller computes them from a
    prioritized job's telemetry, the simulator's and the executor's send gates enforce them.

    Periodic: the offsets ``windows`` (``[start, end)`` seconds, sorted, disjoint, inside
    ``[0, period_s)``) repeat every ``period_s`` from ``origin_s`` on (and before it: the pattern
    is a phase). Times are on the enforcer's clock (simulated seconds, or the wall clock). Here and
    not in a package because the controller, the simulator and the runtime all read it; a leaf module
    raises ``ValueError`` (it imports nothing of mccl, not even :mod:`mccl.errors`).
    """

    origin_s: float
    period_s: float
    windows: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "windows", tuple((float(a), float(b)) for a, b in self.windows))
        if not (math.isfinite(self.period_s) and self.period_s > 0 and math.isfinite(self.origin_s)):
            raise ValueError(f"send windows need a finite origin and a positive period, got {self.origin_s}, "
                             f"{self.period_s}")
        if not self.windows:
            raise ValueError("send windows: at least one window (a gate that never opens stalls the job)")
        previous = 0.0
        for start, end in self.windows:
            if not (previous <= start < end <= self.period_s):
                raise ValueError(f"send windows must be sorted, disjoint, non-empty and inside [0, "
                                 f"{self.period_s:g}) s; got {self.windows}")
            previous = end

    def _offset(self, time_s: float) -> tuple[float, float]:
        """(start of the period that holds ``time_s``, offset of ``time_s`` in it)."""
        periods = math.floor((time_s - self.origin_s) / self.period_s)
        base = self.origin_s + periods * self.period_s
        return base, time_s - base

    def is_open(self, time_s: float) -> bool:
        _, offset = self._offset(time_s)
        return any(start <= offset < end for start, end in self.windows)

    def next_open(self, time_s: float) -> float:
        """The earliest time at or after ``time_s`` inside a window."""
        base, offset = self._offset(time_s)
        for start, end in self.windows:
            if offset < end:
                return time_s if offset >= start else base + start
        return base + self.period_s + self.windows[0][0]

    @property
    def duty(self) -> float:
        """The fraction of time open."""
        return sum(end - start for start, end in self.windows) / self.period_s
