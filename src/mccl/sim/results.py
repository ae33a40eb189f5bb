"""What a simulation reports: per-collective times and bandwidths, link utilization over
time, the critical chain, and the engine's own counters.

algbw and busbw follow nccl-tests (DESIGN.md "Units"): algbw = S / t in GB/s
(10⁹ B/s), busbw = algbw × (n−1)/n, or × 2(n−1)/n for AllReduce. t runs from the
collective's launch to the arrival of its last byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from mccl.errors import MCCLError
from mccl.schedule import Collective

__all__ = ["Cause", "ChainStep", "RunResult", "LinkUtilization", "SimStats", "SimResult"]


class Cause(IntEnum):
    """Why a transfer on the critical chain started when it did."""

    LAUNCH = 0  # ready when the collective launched, its connection free
    CHUNK = 1  # waited for its chunk to arrive (the previous chain step delivered it)
    QUEUE = 2  # waited for its connection to finish the previous transfer (the previous chain step)


@dataclass(frozen=True)
class ChainStep:
    """One transfer of the critical chain, in time order (indices as in the schedule)."""

    transfer: int
    chunk: int
    sender: int
    receiver: int
    step: int
    start_s: float  # times relative to the collective's launch
    sent_s: float  # last byte left the sender
    arrive_s: float  # last byte arrived (sent + route latency)
    cause: Cause
    bottleneck_link: int  # the link that set its rate last (-1: none)


@dataclass(frozen=True)
class RunResult:
    """One collective run by one job."""

    job: str
    op: str
    iteration: int
    collective: Collective
    schedule: str  # the synthesizer that made it and its version, for the timeline
    n_ranks: int
    size_bytes: float
    start_s: float
    end_s: float
    algbw_gbs: float
    busbw_gbs: float
    n_transfers: int
    critical_chain: tuple[ChainStep, ...]

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s

    def chain_links(self) -> dict[int, float]:
        """Seconds of the critical chain spent sending at each bottleneck link."""
        seconds: dict[int, float] = {}
        for step in self.critical_chain:
            seconds[step.bottleneck_link] = seconds.get(step.bottleneck_link, 0.0) + step.sent_s - step.start_s
        return seconds


@dataclass(frozen=True, eq=False)
class LinkUtilization:
    """Bytes each link carried per time bin, and what it could have carried.

    ``edges_s``: bin edges (len bins + 1). ``link_bytes`` and ``capacity_bytes``:
    arrays (bins × links); their ratio is the utilization, exact under capacity
    changes inside a bin. Background traffic counts.
    """

    edges_s: np.ndarray
    link_bytes: np.ndarray
    capacity_bytes: np.ndarray

    def utilization(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.capacity_bytes > 0, self.link_bytes / self.capacity_bytes, 0.0)

    def mean(self) -> np.ndarray:
        """Per link, the utilization over the whole simulated time."""
        capacity = self.capacity_bytes.sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(capacity > 0, self.link_bytes.sum(axis=0) / capacity, 0.0)


@dataclass(frozen=True)
class SimStats:
    """How much work the engine did: ``events`` counts flow starts, flow finishes,
    arrivals, launches, link changes and hook calls; ``batches`` the distinct event
    times; ``rate_solves`` the max-min computations."""

    events: int
    batches: int
    rate_solves: int
    fairshare_rounds: int
    max_active_flows: int
    wall_s: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else float("inf")


@dataclass(frozen=True)
class SimResult:
    runs: tuple[RunResult, ...]
    utilization: LinkUtilization
    end_s: float
    stats: SimStats

    def runs_of(self, job: str, op: str | None = None) -> tuple[RunResult, ...]:
        return tuple(run for run in self.runs if run.job == job and (op is None or run.op == op))

    def only(self) -> RunResult:
        """The single run of a one-collective simulation."""
        if len(self.runs) != 1:
            raise MCCLError(f"the simulation ran {len(self.runs)} collectives, not one")
        return self.runs[0]
