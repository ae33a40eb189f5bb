"""The closed-loop hook: what a controller sees and may do while a simulation runs.

Every ``interval_s`` of simulated time the engine calls ``callback(view)``. The
view carries per-path throughput samples since the previous call — for every
job and every GPU-to-GPU connection route its collectives used, the bytes sent
and the seconds the path was busy, so ``gbps`` is the rate achieved while sending,
which is what mccl's passive telemetry measures (mccl-paper §5.1) — and the
collectives that finished. The callback may swap a job's schedule for one of its
collectives; the swap takes effect at that collective's next launch, never in
flight, as mccl's hot swap does (mccl-paper §5.2; MCCS §3.2). The controller
issue drives this hook; the MCCS ring-reversal scenario uses it directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from mccl.errors import MCCLError
from mccl.schedule import Schedule
from mccl.sim.results import RunResult
from mccl.telemetry import SendWindows

__all__ = ["PathSample", "ControlHook", "ControlView"]


@dataclass(frozen=True)
class PathSample:
    """A path's throughput over one hook interval."""

    job: str
    src: str  # sender GPU
    dst: str  # receiver GPU
    route: tuple[int, ...]  # link ids
    bytes: float
    busy_s: float

    @property
    def gbps(self) -> float:
        """Rate achieved while sending, in Gbit/s."""
        return self.bytes * 8 / self.busy_s / 1e9 if self.busy_s > 0 else math.nan


class ControlView:
    """Handed to the hook's callback; collects its swaps for the engine."""

    def __init__(self, time_s: float, samples: tuple[PathSample, ...], completed: tuple[RunResult, ...],
                 current: dict[tuple[str, str], Schedule]) -> None:
        self.time_s = time_s
        self.samples = samples
        self.completed = completed
        self._current = current
        self.swaps: dict[tuple[str, str], Schedule] = {}
        self.gates: dict[str, SendWindows | None] = {}

    def schedule(self, job: str, op: str) -> Schedule:
        """The schedule the job's collective ``op`` will use at its next launch."""
        key = (job, op)
        if key in self.swaps:
            return self.swaps[key]
        if key not in self._current:
            raise MCCLError(f"no collective {op!r} in job {job!r}; known: {sorted(self._current)}")
        return self._current[key]

    def swap(self, job: str, op: str, schedule: Schedule) -> None:
        """Run ``schedule`` for the job's collective ``op`` from its next launch on."""
        old = self.schedule(job, op)
        if schedule.collective is not old.collective or schedule.ranks != old.ranks:
            raise MCCLError(f"cannot swap job {job!r} {op!r}: the new schedule is a {schedule.collective.value} "
                            f"over {schedule.n_ranks} ranks, the old a {old.collective.value} over {old.n_ranks}; "
                            "a swap keeps the collective and its ranks")
        self.swaps[(job, op)] = schedule

    def gate(self, job: str, windows: SendWindows | None) -> None:
        """Gate ``job``'s sends with ``windows`` (None: lift its gate) from its next collective on
        (:mod:`mccl.sim.sendgate`)."""
        if job not in {name for name, _ in self._current}:
            raise MCCLError(f"no job {job!r} to gate; known: {sorted({name for name, _ in self._current})}")
        self.gates[job] = windows


@dataclass(frozen=True)
class ControlHook:
    interval_s: float
    callback: Callable[[ControlView], None]

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise MCCLError(f"hook interval must be a positive time, got {self.interval_s}")
