"""What a tenant registers with the provider's controller, and what the controller hands back.

A job registers its placement (ranks → GPUs), its collective profile (the collective
and buffer size it runs most, which sets its flows' volumes) and a priority (higher
wins under PFA). The controller answers with a :class:`JobPlan` per job: the ring order
(MCCS's locality-aware ring: rack, then pod, each group entered once), a route per
flow pinned into the schedule, and, for a time-shared job, its send windows. A new
plan carries a higher ``version``; executors switch between two collectives by the
runtime's (min version, max seq) agreement (MCCS §3.2), the simulator at the next launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from mccl.errors import ControllerError
from mccl.schedule import Collective, Schedule
from mccl.telemetry import SendWindows

__all__ = ["Policy", "JobProfile", "TenantJob", "JobPlan"]


class Policy(StrEnum):
    """How the controller chooses each flow's path (:mod:`mccl.control.tenancy.assign`)."""

    ECMP = "ecmp"  # switches hash 5-tuples: the provider does not choose (baseline, MCCS(-FA))
    FFA = "ffa"  # best-fit fair flow assignment
    PFA = "pfa"  # planes reserved for the highest priority
    PFA_TS = "pfa+ts"  # PFA, and the time-shared jobs borrow the reserved planes in the idle windows


@dataclass(frozen=True)
class JobProfile:
    """The collective a job runs (its flows' volumes come from its schedule) and its buffer size."""

    collective: Collective = Collective.ALLREDUCE
    size_bytes: float = 128 * 2**20
    channels: int | None = None  # ring channels; None: as NCCL, one per GPU of the widest host

    def __post_init__(self) -> None:
        object.__setattr__(self, "collective", Collective(self.collective))
        if self.collective is Collective.ALLTOALL:
            raise ControllerError("tenancy policies plan ring collectives (AllReduce, AllGather, ReduceScatter)")
        if not self.size_bytes > 0:
            raise ControllerError(f"a job's collective size must be positive, got {self.size_bytes}")


@dataclass(frozen=True)
class TenantJob:
    name: str
    ranks: tuple[str, ...]  # rank i runs on GPU ranks[i]
    profile: JobProfile = field(default_factory=JobProfile)
    priority: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if not self.name:
            raise ControllerError("a job needs a name")
        if len(self.ranks) < 2:
            raise ControllerError(f"job {self.name!r} needs at least 2 ranks, got {len(self.ranks)}")
        if len(set(self.ranks)) != len(self.ranks):
            raise ControllerError(f"job {self.name!r} places two ranks on one GPU: {self.ranks}")


@dataclass(frozen=True)
class JobPlan:
    job: str
    version: int
    schedule: Schedule  # the ring, every flow's route pinned
    routes: dict[tuple[str, str], tuple[int, ...]]  # (sender GPU, receiver GPU) -> link ids
    rings: tuple[tuple[int, ...], ...]  # rank order of every ring channel
    gate: SendWindows | None = None  # None: may send any time
    reserved: frozenset[str] = frozenset()  # PFA planes reserved for the top priority (same for every job)

    def same_strategy(self, other: JobPlan) -> bool:
        """True when ``other`` would run exactly as this plan (so it needs no new version)."""
        return (self.routes == other.routes and self.gate == other.gate and self.rings == other.rings
                and self.reserved == other.reserved)
