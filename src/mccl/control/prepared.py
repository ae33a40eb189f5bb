"""What registering a schedule computes from the schedule and the topology alone, computed ahead.

Why its own type: for a 38 MiB schedule (1.2 M transfers) ``validate`` takes ~0.3 s and
``overlay_map`` ~0.45 s of numpy work that holds the GIL in long C calls (measured,
2026-12-01). Done on the controller service's heavy-message thread, that delayed another
client's poll beyond 100 ms in 8 of 20 registrations even on a quiet machine (issue 13).
So the service's parser process (:mod:`.parser`) does it next to parsing, and hands the
manager the results as a :class:`PreparedSchedule` — a few numpy arrays, milliseconds to
unpickle — which :meth:`~mccl.control.manager.ScheduleManager.register` takes instead of
computing them.

What the manager trusts: that ``prepare`` ran on this schedule and on a topology of the same
links (the parser process gets the manager's own topology when it starts). It checks what is
cheap to check (ranks, link count, the overlay map's shape) and refuses a mismatch.

A warm re-synthesis (:func:`prepare_update`) copies most of the active schedule: its result says
which transfers (:class:`~mccl.schedule.incremental.TransferOrigin`), so only the rest is validated
per chunk, and the overlay map covers only the transfers that copy none of the active schedule's.
That map is a *delta*: merged into the communicator's map (which holds the active schedule's),
the union is the new schedule's — an overlay map is a union over transfers. At 512 GPUs under
Fail2 this took the manager's dispatch (validation, overlay map, profile, guard) from 1.75–2.1 s
to 0.61 s for AllToAll and from 1.3–1.8 s to 0.49–0.64 s for AllGather (BENCHMARKS.md, fourth session).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.control.drift import CutProfile, OverlayMap, overlay_map, profile
from mccl.errors import ControllerError
from mccl.schedule import Schedule, validate
from mccl.schedule.incremental import restricted, validate_update
from mccl.synth import SynthesisResult
from mccl.topology import Topology

__all__ = ["PreparedSchedule", "prepare", "prepare_update"]


@dataclass(frozen=True)
class PreparedSchedule:
    """A validated schedule's overlay map (:func:`~mccl.control.drift.overlay_map`) and Algorithm 1
    profile (:func:`~mccl.control.drift.profile`) on a topology of ``n_links`` links."""

    n_ranks: int
    n_links: int
    coverage: OverlayMap
    cut: CutProfile
    delta: bool = False  # coverage holds only routes the previous schedule lacks (merge it, never use it alone)

    def check(self, schedule: Schedule, topology: Topology) -> None:
        """ControllerError unless this could be ``prepare(schedule, topology)`` (cheap checks only)."""
        n = schedule.n_ranks
        if (self.n_ranks != n or self.n_links != len(topology.links) or self.coverage.n_ranks != n
                or len(self.coverage.offsets) != n * n + n + 1):
            raise ControllerError(f"a prepared registration of {self.n_ranks} ranks on {self.n_links} links does not "
                                  f"match the schedule ({n} ranks) on the manager's topology ({len(topology.links)} links)")
        if len(self.cut.links) and int(np.max(self.cut.links)) >= self.n_links:
            raise ControllerError("a prepared registration names links outside the topology")


def prepare(schedule: Schedule, topology: Topology) -> PreparedSchedule:
    """Validate ``schedule`` on ``topology`` (InvalidSchedule naming the first problem) and compute what the
    manager keeps of it."""
    validate(schedule, topology)
    return PreparedSchedule(schedule.n_ranks, len(topology.links), overlay_map(schedule, topology),
                            profile(schedule, len(topology.links)))


def prepare_update(previous: Schedule, result: SynthesisResult, topology: Topology) -> PreparedSchedule:
    """:func:`prepare` of a re-synthesis of ``previous`` (the active schedule, validated on ``topology``):
    validated where it changed (:func:`~mccl.schedule.incremental.validate_update`), the overlay map of
    its new routes only (``delta``; module docstring). Without ``result.origin``: :func:`prepare`."""
    schedule = result.schedule
    fresh = validate_update(schedule, topology, previous, result.origin)
    n_links = len(topology.links)
    if fresh is None:
        return PreparedSchedule(schedule.n_ranks, n_links, overlay_map(schedule, topology), profile(schedule, n_links))
    return PreparedSchedule(schedule.n_ranks, n_links, overlay_map(restricted(schedule, fresh), topology),
                            profile(schedule, n_links), delta=True)
