"""What every synthesizer returns: the schedule, what it is proven to be worth, and its warm state.

A :class:`~mccl.schedule.Schedule` is the contract between packages and a file format,
so it holds no solver state. The synthesis *result* is the value around it that the
caller keeps as long as it may re-synthesize: the bound and gap as typed fields (not
string-keyed stats), the method's own statistics as a typed dataclass, and what a warm
start needs (``warm_state``: for column generation the columns, the master's basis and
the LP solution; see :mod:`mccl.synth.alltoall.state`). Passing the result back as
``previous`` restarts from that state; passing only its schedule (e.g. read from a
file) warm-starts from the schedule's routes. Copies of the result keep the state:
it is a field, not a registry entry keyed by object identity.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from mccl.schedule import Schedule

if TYPE_CHECKING:
    from mccl.schedule.incremental import TransferOrigin
    from mccl.synth.alltoall.state import SolverState

__all__ = [
    "SynthesisResult",
    "TreePackStats",
    "AllToAllStats",
    "AllToAllWarmStats",
    "BaselineStats",
    "ComposedStats",
    "stats_from_pairs",
]


@dataclass(frozen=True, kw_only=True)
class TreePackStats:
    """Spanning-tree packing: phase times (s), the rounding and the trees (mccl-paper §4.1).

    ``fractional_rate_gbps``: x* per source; ``integral_rate_gbps``: the rounded rate k·x;
    ``trees_per_source``: k; ``max_flows``: max-flow solves; ``switch_balance_loss``: the share
    lost to splitting unbalanced switches. Warm fields (None when cold): ``kept_fraction`` of
    the previous trees' arcs, ``warm_repair`` (1 if the previous trees were repaired in
    place), ``repaired_trees``, ``reused_trees_fraction``, ``warm_prefer_dropped`` (1 when the
    previous trees' arcs misled the packer and it started over as cold).
    """

    solve_time_s: float
    phase1_s: float
    rounding_s: float
    phase2_s: float
    phase3_s: float
    phase1_rounds: int
    max_flows: int
    trees_per_source: int
    tree_groups: int
    max_depth: int
    fractional_rate_gbps: float
    integral_rate_gbps: float
    switch_balance_loss: float
    switch_balance_retries: int
    switch_removal_careful: int
    rounding_gap: float
    kept_fraction: float | None = None
    warm_repair: bool | None = None
    repaired_trees: int | None = None
    reused_trees_fraction: float | None = None
    warm_prefer_dropped: bool | None = None


@dataclass(frozen=True, kw_only=True)
class AllToAllWarmStats:
    """How a warm AllToAll run started (see :mod:`mccl.synth.alltoall.pipeline`)."""

    kept_fraction: float
    warm_columns: int
    reused_previous: bool
    restarted: bool
    warm_fallback: bool
    warm_abandoned_pivots: int
    repaired: bool
    repaired_pairs: int
    rerounded_pairs: int
    repair_declined: bool


@dataclass(frozen=True, kw_only=True)
class AllToAllStats:
    """Column generation: ``iterations`` are simplex pivots (the repair LP's when repaired),
    ``rounds`` pricing rounds, ``lp_gbs`` the LP optimum found as algbw, ``lp_gap`` its proven
    distance to the bound, ``rounding_gap`` the rounded schedule's loss against it."""

    solve_time_s: float
    columns: int
    iterations: int
    rounds: int
    dives: int
    lp_gbs: float
    lp_gap: float
    rounding_gap: float
    warm: AllToAllWarmStats | None = None


@dataclass(frozen=True, kw_only=True)
class BaselineStats:
    """A constructed baseline (ring, direct): nothing is solved, so only its build time."""

    solve_time_s: float


@dataclass(frozen=True, kw_only=True)
class ComposedStats:
    """AllReduce as ReduceScatter + AllGather: the two phases' own results."""

    solve_time_s: float
    reducescatter: SynthesisResult
    allgather: SynthesisResult


Stats = TreePackStats | AllToAllStats | BaselineStats | ComposedStats


def stats_from_pairs(stats_type: type, pairs: Any) -> Any:
    """A typed stats value from ``(name, value)`` pairs (a schedule's ``meta.stats``): each field
    converted to its declared int / bool / float; pairs the type does not declare are left out."""
    values = dict(pairs)
    chosen: dict[str, Any] = {}
    for item in fields(stats_type):
        if item.name not in values:
            continue
        kind = str(item.type).split(" ")[0]
        value = values[item.name]
        chosen[item.name] = int(value) if kind == "int" else bool(value) if kind == "bool" else float(value)
    return stats_type(**chosen)


@dataclass(frozen=True, kw_only=True)
class SynthesisResult:
    """One synthesizer's answer (see the module docstring).

    ``bound_gbs``: the proven upper bound on algbw (GB/s) of any schedule the method could
    make (its LP / fractional optimum; None for baselines, which prove nothing).
    ``achieved_gbs``: the emitted schedule's steady-state algbw on the topology it was made for.
    ``optimal``: the bound is the method's optimum (LP solved to optimality), so ``gap`` is
    the rounding's loss alone. ``method``: the registry name of the synthesizer.
    """

    schedule: Schedule
    method: str
    bound_gbs: float | None
    achieved_gbs: float
    optimal: bool
    stats: Stats
    warm_state: SolverState | None = None
    # A warm start's schedule: which transfers copy the previous schedule's (``previous``), so the
    # controller validates and maps only the rest (:mod:`mccl.schedule.incremental`). None: all new.
    origin: TransferOrigin | None = None

    @property
    def gap(self) -> float | None:
        """1 − achieved / bound (proven), or None without a bound."""
        if self.bound_gbs is None or self.bound_gbs <= 0:
            return None
        return max(0.0, 1.0 - self.achieved_gbs / self.bound_gbs)

    def with_version(self, version: int) -> SynthesisResult:
        """The same result with its schedule re-versioned (the warm state is kept)."""
        return replace(self, schedule=self.schedule.with_meta(version=version))

    @classmethod
    def of_baseline(cls, schedule: Schedule, method: str, solve_time_s: float) -> SynthesisResult:
        """A baseline's result: no bound, not optimal."""
        return cls(schedule=schedule, method=method, bound_gbs=None,
                   achieved_gbs=float(schedule.meta.achieved_gbs or 0.0), optimal=False,
                   stats=BaselineStats(solve_time_s=solve_time_s))
