"""The solver state a warm start restarts from: the previous run's columns and master basis.

A warm start from the previous *schedule* alone (:mod:`.warm`) re-derives
columns from its routes, but the rounded routes are not the LP's solution, so
the first master solve starts from the slack basis and costs as many simplex
pivots as a cold one (measured: at 512 GPUs under Fail1 ~50 k pivots, 10× the
cold time; since bounded by a pivot budget, past which it falls back to the cold
path, :func:`.solve.warm_pivot_budget`). mccl-paper §4.2 keeps "valid routing structures from previous
iterations": the column pool and the optimal basis of the last master. That is
what :class:`SolverState` holds, taken when ``synthesize`` returns.

The Schedule IR stays as it is (a file has no solver state): the state travels
in the :class:`~mccl.synth.result.SynthesisResult` beside the schedule it was taken
with (``warm_state``), and whoever keeps the result (the controller keeps the active
one) passes it back as ``previous``. One state at 512 GPUs holds ~4 M master entries
and the pool's paths, ~100 MB, and is dropped with its result. A schedule read from a
file, or made by another synthesizer, has none: the warm start then seeds from its
routes. The state never decides the result, only where the search starts: every warm
run still prices to LP optimality and rounds and validates as usual.

The state also keeps the final LP solution per route (:class:`.build.LPFlow`)
and the rounded chunks (:class:`.rounding.Placement`): a fault on a tight link
is first repaired from them (:mod:`.repair`), which needs no master at all; the
state of a repaired schedule keeps the previous columns without a basis.

A state fits a new network when the ranks and the links (ids, ends) are the
same and only capacities changed (degradations, mccl-paper §4.1). The old basis
is kept when the old solution still fits the new capacities and no tight link
(one whose capacity row was nonbasic) changed capacity: then it stays optimal
and the first master solve takes no pivot. Otherwise the master restarts from
the slack basis with the old columns (see :mod:`.master`), under a pivot budget;
when some capacity grew, the run takes the cold path instead
(:func:`.solve.restart_pivot_budget`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mccl.synth.alltoall.build import LPFlow
from mccl.synth.alltoall.master import Master, MasterSnapshot
from mccl.synth.alltoall.network import Network
from mccl.synth.alltoall.pool import ColumnPool, make_blocks
from mccl.synth.alltoall.rounding import Placement

__all__ = ["SolverState"]

_BASIC = 1  # highspy.HighsBasisStatus.kBasic
_FIT_TOLERANCE = 1e-9  # relative: an old link load this far over the new capacity still fits


@dataclass(frozen=True, eq=False)
class SolverState:
    """An immutable snapshot of a finished column generation (restarts work on copies)."""

    ranks: tuple[str, ...]
    link_ids: np.ndarray
    tail: np.ndarray
    head: np.ndarray
    capacity: np.ndarray  # Gbit/s, what ``flow`` (and the master's basis, if kept) is optimal at
    max_steps: int | None
    grouping: str
    pool: ColumnPool  # never added to: ``restart`` copies it
    master: MasterSnapshot  # its basis may be absent (a repaired run has none)
    flow: LPFlow  # the LP optimum per route
    placement: Placement | None  # the rounded chunks (None: the schedule came from elsewhere)
    detoured: np.ndarray  # pairs re-routed by repairs since the last column generation

    @classmethod
    def take(cls, network: Network, max_steps: int | None, grouping: str, pool: ColumnPool,
             master: Master, flow: LPFlow, placement: Placement | None) -> SolverState:
        """The state after a run; it owns ``pool`` from now on (the run is over and adds nothing)."""
        return cls(network.ranks, network.link_ids, network.tail, network.head, network.capacity.copy(),
                   max_steps, grouping, pool, master.snapshot(), flow, placement, np.zeros(0, dtype=np.int64))

    def repaired(self, capacity: np.ndarray, pool: ColumnPool, flow: LPFlow, placement: Placement,
                 rerouted: np.ndarray) -> SolverState:
        """The state of a run repaired from this one: the same columns without a basis, the repair's
        pool (this one, or a copy with the routes its pricing found), the new flow and chunks, and
        the pairs it re-routed added to the detoured ones."""
        return replace(self, capacity=np.asarray(capacity, dtype=float).copy(), pool=pool,
                       master=self.master.without_basis(), flow=flow, placement=placement,
                       detoured=np.union1d(self.detoured, rerouted))

    def fits(self, network: Network, max_steps: int | None, grouping: str) -> bool:
        """Same ranks, same links between the same nodes, same pricing graph and commodity blocks:
        capacities may differ. (Fail3 moves a GPU to another host, which changes the blocks of
        ``grouping="host"``.)"""
        same = (self.ranks == network.ranks and self.max_steps == max_steps and self.grouping == grouping
                and np.array_equal(self.link_ids, network.link_ids) and np.array_equal(self.tail, network.tail)
                and np.array_equal(self.head, network.head))
        if not same or grouping == "tensor":
            return same
        blocks, old = make_blocks(network, grouping), self.pool.blocks
        return np.array_equal(blocks.offsets, old.offsets) and np.array_equal(blocks.dests, old.dests) \
            and np.array_equal(blocks.source, old.source)

    def basis_still_optimal(self, capacity: np.ndarray) -> bool:
        """Whether the old optimal basis is optimal at ``capacity`` too (see the module docstring)."""
        if self.master.row_status is None:
            return False
        changed = ~np.isclose(capacity, self.capacity, rtol=1e-12, atol=0.0)
        if not np.any(changed):
            return True
        n_tensors = self.master.n_tensors
        tight = self.master.row_status[n_tensors:] != _BASIC
        fits = self.master.link_activity <= capacity * (1 + _FIT_TOLERANCE)
        return bool(np.all(fits) and not np.any(changed & tight))

    def restart(self, capacity: np.ndarray) -> tuple[ColumnPool, Master, bool]:
        """A copy of the pool and a master over ``capacity`` with the old columns; whether the basis was kept."""
        keep = self.basis_still_optimal(capacity)
        return self.pool.copy(), Master.restart(self.master, capacity, keep_basis=keep), keep
