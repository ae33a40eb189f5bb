"""The controller on the flow-level simulator (issue 11, deliverable 2).

Why this exists: the live loop (``mccl demo``) runs on 4 gloo ranks only. Here the
*real* :class:`~mccl.control.ScheduleManager` — the code the service runs, not a copy —
watches a job on the simulated fabric through virtual executors, at any size the
simulator affords, through faults that start, persist and clear.

Virtual executors (:class:`VirtualExecutors`). The engine's closed-loop hook is called
every ``interval_s`` of simulated time with per-path bytes and busy seconds (the rate a
path achieved *while sending*, :class:`~mccl.sim.closedloop.PathSample`). That is what the
runtime's passive meters measure (:mod:`mccl.runtime.telemetry`: a window is open only
while sends to the peer are in flight, and its rate is bytes / window). The executors
fold those readings into one measurement window per overlay link per collective, with the
runtime's keys: ``"inter"`` per rank pair across hosts, ``"intra"`` per rank pair on one host
(``peer`` ≥ 0: the path rank → peer, the contract of :class:`~mccl.telemetry.Sample`; or, with
``TelemetryModel(intra_per_peer=False)``, the runtime's older aggregate, one ``"intra"`` per
rank for all its same-host peers together, ``peer`` -1), and emit one
:class:`~mccl.telemetry.Sample` each when the collective completes, tagged with its
sequence number and with the collective and schedule version it ran (so the manager
compares it with that version's references). Paths used concurrently inside one hook interval count their common
busy time once (max, not sum), as one window would. Readings of an interval that spans
the end of one collective and the start of the next go to the first; keeping
``interval_s`` a small fraction of a collective (default 1/8) bounds that error.
Measurement noise is multiplicative and log-normal (σ) on each window's duration, and a
window may be hit by a telemetry microburst (probability, slowdown factor). With each
collective's windows every rank also reports the collective's own time, launch to completion
(``Sample`` kind ``"collective"``, the same noise per rank): the guard checks its measured
fabric against it (:mod:`mccl.control.guard`, "Is the measured fabric an explanation?").

Hot swap. A schedule the manager issues becomes available after its synthesis time
(the manager's own measured wall seconds, or a fixed delay for reproducible tests),
during which the job keeps running the old one; it then applies from the job's next
launch: a simulated collective launches on every rank at once, so every rank runs the
same version from the same collective on — the semantics of the runtime's
sequence-number agreement (mccl-paper §5.2). :meth:`LoopResult.check` proves from the
simulator's own run records that no collective was lost or run twice and that each ran
the version in force at its launch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mccl.control.guard import GuardDecision, Predictor
from mccl.control.manager import ControlConfig, Event, ScheduleManager
from mccl.errors import MCCLError
from mccl.schedule import Schedule
from mccl.sim.closedloop import ControlHook, ControlView
from mccl.sim.engine import simulate, simulate_schedule
from mccl.sim.inputs import CapacityChange, CollectiveOp, Job, SimOptions
from mccl.sim.results import RunResult
from mccl.telemetry import COLLECTIVE, INTER, INTRA, Sample
from mccl.topology import Topology

__all__ = ["TelemetryModel", "VirtualExecutors", "LoopDriver", "LoopEvent", "Swap", "LoopResult", "run_loop",
           "run_version"]


@dataclass(frozen=True, kw_only=True)
class TelemetryModel:
    """What the virtual executors add to the simulator's exact rates. ``noise_sigma``: σ of the
    log-normal factor on every window's duration (0.05 ≈ 5 % jitter); ``burst_probability``:
    chance that a window is hit by a telemetry microburst, which multiplies its duration by
    ``burst_slowdown``; ``seed``: the random stream (runs are reproducible); ``intra_per_peer``: one
    ``"intra"`` sample per same-host pair (True) or one per rank for its whole host (False, the
    aggregate injection; why per pair: :mod:`mccl.control.drift`, "Measured topology");
    ``collective_times``: each rank also reports each collective's launch-to-completion time (kind
    ``"collective"``, with the same noise; False: only path windows, as before)."""

    noise_sigma: float = 0.05
    burst_probability: float = 0.0
    burst_slowdown: float = 3.0
    seed: int = 0
    intra_per_peer: bool = True
    collective_times: bool = True

    def collective_samples(self, rng: np.random.Generator, communicator: str, n_ranks: int, nbytes: float,
                           seconds: float, end: float, seq: int, collective: str, version: int) -> list[Sample]:
        """One ``"collective"`` sample per rank (none unless ``collective_times``), each rank's time noisy."""
        if not self.collective_times or not seconds > 0:
            return []
        noise = rng.lognormal(0.0, self.noise_sigma, n_ranks) if self.noise_sigma > 0 else np.ones(n_ranks)
        return [Sample(COLLECTIVE, communicator, rank, -1, int(nbytes), float(seconds * noise[rank]), end, seq,
                       collective, version) for rank in range(n_ranks)]

    def __post_init__(self) -> None:
        if not (self.noise_sigma >= 0 and 0 <= self.burst_probability <= 1 and self.burst_slowdown >= 1):
            raise MCCLError(f"bad telemetry model {self}: need sigma >= 0, 0 <= p <= 1, slowdown >= 1")


class VirtualExecutors:
    """The passive meters of one job's ranks inside the simulator (module docstring)."""

    def __init__(self, job: str, communicator: str, schedule: Schedule, topology: Topology,
                 model: TelemetryModel) -> None:
        self.job = job
        self.communicator = communicator
        self.model = model
        self.rank_of = {gpu: rank for rank, gpu in enumerate(schedule.ranks)}
        self.collective = schedule.collective.value
        self.initial_version = int(schedule.meta.version)
        self.host = [topology.node(gpu).host for gpu in schedule.ranks]
        self.rng = np.random.default_rng(model.seed)
        self.seq = 0  # collectives completed, as the runtime's communicator counts them
        self.emitted = 0
        self._bytes: dict[tuple[int, int], float] = {}  # (rank, peer or -1) -> bytes in the open window
        self._busy: dict[tuple[int, int], float] = {}  # -> seconds the overlay link was sending

    def _same_host(self, rank: int, peer: int) -> bool:
        return self.host[rank] is not None and self.host[rank] == self.host[peer]

    def _key(self, rank: int, peer: int) -> tuple[int, int]:
        return (rank, -1) if not self.model.intra_per_peer and self._same_host(rank, peer) else (rank, peer)

    def observe(self, view: ControlView) -> list[Sample]:
        """Fold this interval's path readings in; return the samples of collectives that completed."""
        interval_bytes: dict[tuple[int, int], float] = {}
        interval_busy: dict[tuple[int, int], float] = {}
        for path in view.samples:
            if path.job != self.job or path.busy_s <= 0:
                continue
            key = self._key(self.rank_of[path.src], self.rank_of[path.dst])
            interval_bytes[key] = interval_bytes.get(key, 0.0) + path.bytes
            interval_busy[key] = max(interval_busy.get(key, 0.0), path.busy_s)  # concurrent paths: one window
        for key, size in interval_bytes.items():
            self._bytes[key] = self._bytes.get(key, 0.0) + size
            self._busy[key] = self._busy.get(key, 0.0) + interval_busy[key]
        completed = [run for run in view.completed if run.job == self.job]
        if not completed:
            return []
        self.seq += len(completed)
        return self._emit(view.time_s, completed[-1])

    def _emit(self, now: float, run: RunResult) -> list[Sample]:
        found = _VERSION.search(run.schedule)
        version = int(found.group(1)) if found else self.initial_version
        samples = self.model.collective_samples(self.rng, self.communicator, len(self.rank_of), run.size_bytes,
                                                run.end_s - run.start_s, now, self.seq, self.collective, version)
        for (rank, peer), size in sorted(self._bytes.items()):
            seconds = self._busy[(rank, peer)]
            if size <= 0 or seconds <= 0:
                continue
            if self.model.noise_sigma > 0:
                seconds *= float(self.rng.lognormal(0.0, self.model.noise_sigma))
            if self.model.burst_probability > 0 and self.rng.random() < self.model.burst_probability:
                seconds *= self.model.burst_slowdown
            kind = INTRA if peer == -1 or self._same_host(rank, peer) else INTER
            samples.append(Sample(kind, self.communicator, rank, peer, int(size), seconds, now, self.seq,
                                  self.collective, version))
        self._bytes.clear()
        self._busy.clear()
        self.emitted += len(samples)
        return samples


class LoopDriver:
    """The part of a closed loop both evaluators share (the flow-level :func:`run_loop` and the rate
    model's :func:`~mccl.experiments.closedloop_fluid.run_fluid_loop`): feed one batch of samples to
    the real manager, record its events at simulated time, and turn each issued version into a
    pending swap that becomes available after its synthesis (plus the guard's predictions) or a
    fixed delay; :meth:`due` hands the newest pending version over once its time has come (older
    pending ones are superseded), and the loop records the swap at the time it applies it."""

    def __init__(self, manager: ScheduleManager, communicator: str, schedule: Schedule,
                 synthesis_delay_s: float | None) -> None:
        self.manager = manager
        self.communicator = communicator
        self.collective = schedule.collective
        self.synthesis_delay_s = synthesis_delay_s
        self.events: list[LoopEvent] = []
        self.swaps: list[Swap] = []
        self.pending: list[tuple[float, float, Schedule]] = []  # (ready at, issued at, schedule)

    def observe(self, time_s: float, samples: list[Sample]) -> None:
        """Ingest ``samples`` at ``time_s``, run the manager's step, queue what it issued."""
        if not samples:
            return
        self.manager.ingest(samples)
        synthesis = 0.0
        for event in self.manager.step():
            self.events.append(LoopEvent(time_s, event))
            if event.kind == "synthesized":
                synthesis = event.value
            if event.kind == "issued":
                result = self.manager.active_result(self.communicator, self.collective)
                if result is None or result.schedule.meta.version != event.version:
                    raise MCCLError("the manager issued a version it does not hold")
                guard = self.manager.guard.decisions[-1].seconds if self.manager.guard.decisions else 0.0
                delay = synthesis + guard if self.synthesis_delay_s is None else self.synthesis_delay_s
                self.pending.append((time_s + delay, time_s, result.schedule))

    def due(self, time_s: float, *, strictly: bool = False) -> tuple[float, float, Schedule] | None:
        """The newest pending version if it is available at ``time_s`` (``strictly``: after it), else None."""
        if not self.pending:
            return None
        ready = self.pending[-1][0]
        if (time_s > ready) if strictly else (time_s >= ready):
            item = self.pending.pop()
            self.pending.clear()
            return item
        return None

    def swapped(self, time_s: float, issued_s: float, schedule: Schedule) -> None:
        version = int(schedule.meta.version)
        self.swaps.append(Swap(time_s, issued_s, version, f"{schedule.meta.synthesizer} v{version}", schedule))


@dataclass(frozen=True)
class LoopEvent:
    """A manager event at simulated time ``time_s`` (its ``value`` as the manager gives it)."""

    time_s: float
    event: Event


@dataclass(frozen=True)
class Swap:
    """A schedule version put in force at ``time_s`` (it runs from the next launch after)."""

    time_s: float
    issued_s: float
    version: int
    label: str
    schedule: Schedule | None = field(default=None, compare=False, repr=False)  # what was put in force


_VERSION = re.compile(r" v(\d+)$")


def run_version(run: RunResult) -> int:
    """The schedule version a simulated collective ran (its label ends in `` vN``; none: 0)."""
    found = _VERSION.search(run.schedule)
    return int(found.group(1)) if found else 0


@dataclass(frozen=True)
class LoopResult:
    """One closed-loop run: the collectives, the swaps, the manager's events, the samples."""

    runs: tuple[RunResult, ...]
    swaps: tuple[Swap, ...]
    events: tuple[LoopEvent, ...]
    samples: int
    launched: int  # collectives the job asked for
    interval_s: float
    initial_version: int = 0
    notes: dict[str, float] = field(default_factory=dict)
    guard: tuple[GuardDecision, ...] = ()  # the manager's never-worse comparisons, in order

    def check(self) -> None:
        """Raise unless every collective ran exactly once, in order, on the version in force at its launch."""
        iterations = [run.iteration for run in self.runs]
        if sorted(iterations) != list(range(self.launched)):
            missing = sorted(set(range(self.launched)) - set(iterations))
            twice = sorted({i for i in iterations if iterations.count(i) > 1})
            raise MCCLError(f"collectives lost {missing[:5]} or run twice {twice[:5]} of {self.launched}")
        for run in self.runs:
            expected = self.initial_version
            for swap in self.swaps:
                if swap.time_s < run.start_s:
                    expected = swap.version
            if run_version(run) != expected:
                raise MCCLError(f"collective {run.iteration} launched at {run.start_s:.6g} s ran version "
                                f"{run_version(run)}, expected {expected}")

    def first_on(self, version: int) -> RunResult | None:
        """The first collective that ran ``version``."""
        return next((run for run in self.runs if run_version(run) == version), None)

    def events_of(self, kind: str) -> list[LoopEvent]:
        return [item for item in self.events if item.event.kind == kind]


def run_loop(
    topology: Topology,
    schedule: Schedule,
    size_bytes: float,
    *,
    changes: Sequence[CapacityChange] = (),
    collectives: int | None = None,
    until_s: float = math.inf,
    gap_s: float | None = None,
    interval_s: float | None = None,
    config: ControlConfig | None = None,
    model: TelemetryModel | None = None,
    synthesis_delay_s: float | None = None,
    options: SimOptions | None = None,
    predict: Predictor | None = None,
    job: str = "job",
) -> LoopResult:
    """Run ``collectives`` collectives of ``schedule`` (or as many as launch before ``until_s``)
    under ``changes``, watched by a
    real :class:`ScheduleManager` through :class:`VirtualExecutors` (module docstring).

    ``gap_s``: compute between two collectives (default 3× the healthy collective time: a
    training step's communication is a fraction of it); ``interval_s``: the hook period
    (default 1/8 of the healthy collective time); ``synthesis_delay_s``: simulated time
    from an issue to the new version being available (None: the synthesis's measured wall
    seconds, plus the guard's predictions; 0 for reproducible tests); ``predict``: the manager's
    guard predictor (:mod:`mccl.control.guard`; None: its α-β default).
    """
    options = options or SimOptions(keep_chain=False)
    healthy_s = simulate_schedule(schedule, topology, size_bytes, options=options).time_s
    gap_s = 3 * healthy_s if gap_s is None else gap_s
    interval_s = healthy_s / 8 if interval_s is None else interval_s
    manager = ScheduleManager(topology, config, predict=predict)
    communicator = job
    manager.register(communicator, schedule, size_bytes=size_bytes)
    executors = VirtualExecutors(job, communicator, schedule, topology, model or TelemetryModel())
    driver = LoopDriver(manager, communicator, schedule, synthesis_delay_s)
    op = schedule.collective.value

    def controller(view: ControlView) -> None:
        due = driver.due(view.time_s)
        if due is not None:
            view.swap(job, op, due[2])
            driver.swapped(view.time_s, due[1], due[2])
        driver.observe(view.time_s, executors.observe(view))

    if collectives is None and not math.isfinite(until_s):
        raise MCCLError("run_loop needs collectives= or a finite until_s=")
    ops = (CollectiveOp(schedule, size_bytes, op),)
    iterations = collectives if collectives is not None else 10**9
    result = simulate(topology, [Job(job, ops, iterations=iterations, gap_s=gap_s, until_s=until_s)], changes=changes,
                      hook=ControlHook(interval_s, controller), options=options)
    runs = result.runs_of(job)
    launched = collectives if collectives is not None else len(runs)
    if collectives is None and runs and runs[-1].end_s + gap_s < until_s:  # a launch went missing
        launched += 1
    return LoopResult(runs, tuple(driver.swaps), tuple(driver.events), executors.emitted, launched, interval_s,
                      int(schedule.meta.version), {"healthy_s": healthy_s, "gap_s": gap_s,
                                                   "sim_wall_s": result.stats.wall_s}, tuple(manager.guard.decisions))

