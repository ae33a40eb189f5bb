"""What a simulation is asked to run: jobs of collectives, background flows, link changes.

All values are frozen dataclasses; times in seconds, capacities in Gbit/s, sizes
in bytes (nccl-tests S, DESIGN.md "Units").

* A :class:`Job` is a tenant's sequence of collectives (``ops``), run one after
  another ``iterations`` times from ``start_s``, with ``gap_s`` of compute between
  two collectives — the shape of a training loop. Its schedules may be swapped
  between two collectives by the closed-loop hook (mccl-paper §5.2, MCCS §3.2).
  ``paths`` chooses among equal-cost routes (:mod:`mccl.sim.ecmp`); ``gate`` holds its
  flows outside send windows (:mod:`mccl.sim.sendgate`, MCCS §3.3 TS).
* A :class:`BackgroundFlow` is traffic mccl does not schedule: constant-rate (it
  takes its rate first, like an inelastic or higher-priority flow: MCCS §3.3's
  75 Gbit/s flow leaves the ring 25 of 100) or greedy (it competes max-min fairly).
* A :class:`CapacityChange` sets a link's capacity from a given time on; a gray
  failure that starts and ends is two of them (:func:`gray_failure`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mccl.errors import MCCLError
from mccl.schedule import Schedule
from mccl.schedule.slicing import MAX_SLICES, SLICE_BYTES, slice_count
from mccl.sim.ecmp import AS_SCHEDULED, PathPolicy
from mccl.telemetry import SendWindows
from mccl.topology import Topology
from mccl.topology.faults import LinkRef

ENGINES = ("auto", "flows", "grouped")

__all__ = [
    "ENGINES",
    "CollectiveOp",
    "Job",
    "BackgroundFlow",
    "CapacityChange",
    "SimOptions",
    "gray_failure",
    "path_links",
]


@dataclass(frozen=True)
class CollectiveOp:
    """One collective of a job: a schedule run with a buffer of nccl-tests size S."""

    schedule: Schedule
    size_bytes: float
    name: str = ""  # defaults to the collective's name; names must differ within a job

    def __post_init__(self) -> None:
        if not (math.isfinite(self.size_bytes) and self.size_bytes > 0):
            raise MCCLError(f"collective size must be positive, got {self.size_bytes} bytes")
        if not self.name:
            object.__setattr__(self, "name", self.schedule.collective.value)


@dataclass(frozen=True)
class Job:
    """A tenant's collectives, run back to back (see module docstring)."""

    name: str
    ops: tuple[CollectiveOp, ...]
    iterations: int = 1
    start_s: float = 0.0
    gap_s: float = 0.0
    until_s: float = math.inf  # launch no collective at or after this time
    paths: PathPolicy = AS_SCHEDULED
    gate: SendWindows | None = None  # start flows only inside these windows (MCCS TS; mccl.sim.sendgate)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        if not self.ops:
            raise MCCLError(f"job {self.name!r} has no collectives")
        names = [op.name for op in self.ops]
        if len(set(names)) != len(names):
            raise MCCLError(f"job {self.name!r} has two collectives named alike: {names}; give them names")
        if self.iterations < 1:
            raise MCCLError(f"job {self.name!r}: iterations must be >= 1, got {self.iterations}")
        for label, value in (("start_s", self.start_s), ("gap_s", self.gap_s)):
            if not (math.isfinite(value) and value >= 0):
                raise MCCLError(f"job {self.name!r}: {label} must be a finite time >= 0, got {value}")

    @staticmethod
    def single(schedule: Schedule, size_bytes: float, name: str = "job", **options: object) -> Job:
        """A job that runs one collective once."""
        return Job(name, (CollectiveOp(schedule, size_bytes),), **options)  # type: ignore[arg-type]


@dataclass(frozen=True)
class BackgroundFlow:
    """Traffic on a fixed route (link ids): ``rate_gbps`` constant, or None for greedy."""

    name: str
    route: tuple[int, ...]
    rate_gbps: float | None = None
    start_s: float = 0.0
    end_s: float = math.inf

    def __post_init__(self) -> None:
        object.__setattr__(self, "route", tuple(int(link) for link in self.route))
        if not self.route:
            raise MCCLError(f"background flow {self.name!r} has an empty route")
        if self.rate_gbps is not None and not (math.isfinite(self.rate_gbps) and self.rate_gbps > 0):
            raise MCCLError(f"background flow {self.name!r}: rate must be positive Gbit/s, got {self.rate_gbps}")
        if not (self.start_s >= 0 and self.end_s > self.start_s):
            raise MCCLError(f"background flow {self.name!r}: needs 0 <= start_s < end_s, "
                            f"got {self.start_s} and {self.end_s}")


@dataclass(frozen=True)
class CapacityChange:
    """From ``time_s`` on, link ``link`` runs at ``gbps``."""

    time_s: float
    link: int
    gbps: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_s) and self.time_s >= 0):
            raise MCCLError(f"capacity change time must be a finite time >= 0, got {self.time_s}")
        if not (math.isfinite(self.gbps) and self.gbps > 0):
            raise MCCLError(f"link {self.link}: capacity must be positive Gbit/s, got {self.gbps}"
                            " (a dead link stalls every flow on it; model it as a very slow one)")


@dataclass(frozen=True)
class SimOptions:
    """How the engine models a schedule.

    ``serialize_connections``: transfers between the same two ranks on the same
    route form one connection that sends one transfer at a time, choosing among
    those whose chunk is held the earliest by (step, chunk) — as a NCCL channel or
    an MSCCL thread block does, and what makes a chunked schedule pipeline. False:
    every transfer is a flow of its own as soon as its chunk is held.
    ``utilization_bins``: time bins kept for per-link utilization (bins double in
    width as the simulated time grows). ``time_tolerance``: events closer than this
    relative time are processed together (floating-point noise of symmetric flows).
    ``max_time_s``: give up (an error) past this simulated time. ``keep_chain``:
    extract each collective's critical chain (a walk back over its transfers).
    ``step_priority``: weight ratio between a collective's consecutive steps when
    their flows share one hop (weighted max-min): the older step's block goes first,
    as on a FIFO connection, instead of racing the next one. 1 makes all flows equal.
    ``slices``: cut every chunk into this many slices that follow each other down its
    path (pipelined execution, :mod:`mccl.sim.compiled`); 1 forwards whole chunks only.
    ``slice_bytes``: instead of a fixed ``slices``, cut the chunks of each collective as
    the executor does for its size (:func:`mccl.schedule.slicing.slice_count` of its
    largest chunk, at most ``max_slices``). Cost grows linearly with the slices.
    ``engine``: which engine :func:`mccl.sim.simulate_schedule` uses for a collective run
    alone: ``"auto"`` the grouped one (:mod:`mccl.sim.grouped`: rates solved per hop, the
    event loop compiled; the same results, orders of magnitude faster at 128–512 GPUs) where
    it applies (``step_priority`` 1, serialized connections, no background, changes or hook),
    else the general one; ``"flows"`` always the general one; ``"grouped"`` the grouped one or
    an error.

    Two models. The defaults read the IR literally: whole chunks, store and forward,
    a hop's older step first (``step_priority`` = 1e3). :meth:`executor` is what the
    executor does (:mod:`mccl.runtime.executor`): chunks cut by its slicing rule,
    every (chunk, hop) a stream of its own, streams sharing links equally
    (``step_priority`` = 1) — the executor gives no stream precedence. Use it to
    predict a run; on the healthy 2×8 HPN at 1 GiB the tree packing is 239 GB/s in the
    literal model and 428 in the executor's (BENCHMARKS.md, 2026-11-30).
        """

    serialize_connections: bool = True
    utilization_bins: int = 256
    time_tolerance: float = 1e-9
    max_time_s: float = 1e6
    keep_chain: bool = True
    step_priority: float = 1e3
    slices: int = 1
    slice_bytes: float | None = None
    max_slices: int = MAX_SLICES
    engine: str = "auto"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise MCCLError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if not (isinstance(self.slices, int) and self.slices >= 1):
            raise MCCLError(f"slices must be an integer >= 1, got {self.slices}")
        if self.slice_bytes is not None:
            slice_count(1.0, self.slice_bytes, self.max_slices)  # checks both
        if not self.step_priority >= 1:
            raise MCCLError(f"step_priority must be >= 1, got {self.step_priority}")
        if not 0 < self.time_tolerance < 1e-3:
            raise MCCLError(f"time_tolerance must be in (0, 1e-3), got {self.time_tolerance}")

    @classmethod
    def executor(cls, **fields: object) -> SimOptions:
        """The executor's model: its slicing (:data:`~mccl.schedule.slicing.SLICE_BYTES`, ``MAX_SLICES``),
        streams sharing links equally; ``fields`` override any of it."""
        fields.setdefault("slice_bytes", SLICE_BYTES)
        fields.setdefault("step_priority", 1.0)
        return cls(**fields)  # type: ignore[arg-type]

    def slices_for(self, schedule: Schedule, size_bytes: float) -> int:
        """Slices per chunk of ``schedule`` run on a buffer of ``size_bytes`` (nccl-tests S)."""
        if self.slice_bytes is None:
            return self.slices
        fractions = schedule.chunks.fraction
        largest = float(fractions.max()) * size_bytes / schedule.n_ranks if len(fractions) else 0.0
        return slice_count(largest, self.slice_bytes, self.max_slices)


def gray_failure(
    topology: Topology,
    link: LinkRef,
    *,
    start_s: float,
    end_s: float = math.inf,
    factor: float | None = None,
    gbps: float | None = None,
    duplex: bool = False,
) -> tuple[CapacityChange, ...]:
    """A link slowed from ``start_s`` to ``end_s`` (then restored): the changes to apply.

    ``link`` is an id or a ``(src, dst)`` pair; give ``factor`` (of the healthy
    capacity) or ``gbps``; ``duplex`` slows the reverse direction too.
    """
    if (gbps is None) == (factor is None):
        raise MCCLError("gray_failure needs exactly one of gbps= or factor=")
    if not end_s > start_s:
        raise MCCLError(f"a gray failure must end after it starts, got {start_s} and {end_s}")
    if isinstance(link, tuple):
        ids = list(topology.links_between(*link))
        if not ids:
            raise MCCLError(f"topology {topology.name!r} has no link {link[0]} -> {link[1]}")
    else:
        topology.link(int(link))
        ids = [int(link)]
    if duplex:
        ids += [back for forward in list(ids)
                for back in topology.links_between(topology.links[forward].dst, topology.links[forward].src)]
    changes: list[CapacityChange] = []
    for link_id in dict.fromkeys(ids):
        healthy = topology.links[link_id].gbps
        slow = gbps if gbps is not None else healthy * factor  # type: ignore[operator]
        changes.append(CapacityChange(start_s, link_id, slow))
        if math.isfinite(end_s):
            changes.append(CapacityChange(end_s, link_id, healthy))
    return tuple(changes)


def path_links(topology: Topology, nodes: Sequence[str]) -> tuple[int, ...]:
    """The links along a node path, e.g. ``["sw0", "sw1"]`` → the id of ``sw0 → sw1``."""
    if len(nodes) < 2:
        raise MCCLError(f"a path needs at least two nodes, got {list(nodes)}")
    return tuple(topology.link_between(a, b).id for a, b in zip(nodes, nodes[1:], strict=False))

