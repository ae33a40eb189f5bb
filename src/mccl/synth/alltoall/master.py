"""The restricted master LP of the AllToAll column generation (mccl-paper §4.2, App. G.4).

Dantzig–Wolfe master over source-rooted trees::

    max z
    s.t. Σ_{T ∈ c} x_T − z ≥ 0              for every tensor c      (duals α_c ≥ 0)
         Σ_c Σ_{T ∈ c} β_a(T) x_T ≤ cap_a    for every link a        (duals α_a ≥ 0)
         x ≥ 0

x_T is the rate (Gbit/s, scaled) at which tree T carries its tensor's blocks; z
is the rate every block gets, so the AllToAll algbw is ``n · z / 8`` GB/s.
Dual feasibility of a column is ``Σ_a β_a(T) α_a ≥ α_c``; ``Σ_c α_c = 1`` from
the column of z.

The model lives in one HiGHS instance for the whole run: columns are appended
with ``addCols`` and the next solve starts from the previous basis (the new
columns enter nonbasic at zero, so the old basis stays primal feasible and
HiGHS's primal simplex, ``simplex_strategy=4``, continues from it; presolve is
off so that the basis survives). Capacities are divided by their maximum so
that the LP's numbers stay near 1.

``snapshot()`` keeps what a later warm start needs to restart this master where
it stopped (mccl-paper §4.2, warm start): its columns (CSC) and its final basis.
``Master.restart`` builds a master over new capacities from such a snapshot,
with that basis when it is still primal feasible there (a capacity change off
the tight links leaves the optimal basis optimal, so the first solve takes no
pivot), else from the slack basis, where primal simplex over the old columns
takes far fewer pivots than repairing the old basis (measured at 256 GPUs under
Fail2: 927 pivots from slack, 4.6 k dual / 10 k primal simplex from the old basis).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mccl.errors import SynthesisError
from mccl.synth import highs

__all__ = ["Master", "MasterSnapshot", "MasterSolution"]

_INF = highs.INF


@dataclass(frozen=True)
class MasterSolution:
    z: float  # the RMP optimum, in Gbit/s per block
    x: np.ndarray  # rate of each column (Gbit/s)
    tensor_duals: np.ndarray  # α_c ≥ 0, sum 1
    link_duals: np.ndarray  # α_a ≥ 0 (scale-free): Σ_a cap_a α_a = z at optimality
    link_activity: np.ndarray  # Σ β x per link, Gbit/s
    iterations: int  # simplex iterations of this solve


@dataclass(frozen=True, eq=False)
class MasterSnapshot:
    """A solved master's columns and basis, for restarting it on new capacities."""

    tensor: np.ndarray  # tensor (block) of every column
    starts: np.ndarray  # CSC: column k's entries are starts[k]:starts[k+1]
    links: np.ndarray  # network link ids
    counts: np.ndarray  # β: paths of the tree on the link
    col_status: np.ndarray | None  # HiGHS basis status of z and every column (int8); None: no basis kept
    row_status: np.ndarray | None  # of every tensor row, then every link row (int8)
    link_activity: np.ndarray  # Σ β x per link at the snapshot's solution, Gbit/s
    link_duals: np.ndarray  # α_a ≥ 0 at that solution
    n_tensors: int  # tensor rows of the master

    def without_basis(self) -> MasterSnapshot:
        """The same columns with no basis: a later restart starts from the slack basis."""
        return replace(self, col_status=None, row_status=None)


class Master:
    """The restricted master problem; columns are only ever appended."""

    def __init__(self, n_tensors: int, capacity: np.ndarray, *, threads: int = 1) -> None:
        self.n_tensors = n_tensors
        self.n_links = len(capacity)
        self.scale = float(np.max(capacity))
        self._capacity = np.asarray(capacity, dtype=float) / self.scale
        self.column_tensor: list[np.ndarray] = []
        self._csc: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (starts, links, counts) per append
        self._last: MasterSolution | None = None
        self.n_columns = 0
        self.iterations = 0
        self.solves = 0
        self.abandoned_iterations = 0  # pivots of solves stopped by a limit (not in ``iterations``)
        self.stopped: str | None = None  # why the last solve returned None
        # simplex_strategy 4 (primal): warm re-solves after adding columns; presolve off keeps the basis.
        model = highs.new_model(presolve="off", simplex_strategy=4, threads=threads)
        # Reduced costs below -1e-9 must make HiGHS pivot, or pricing and master disagree on optimality.
        model.setOptionValue("dual_feasibility_tolerance", 1e-9)
        model.setOptionValue("primal_feasibility_tolerance", 1e-9)
        highs.maximize(model)
        n, m = n_tensors, self.n_links
        model.addRows(n, np.zeros(n), np.full(n, _INF), 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        model.addRows(m, np.full(m, -_INF), self._capacity, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        # z: objective 1, coefficient -1 in every tensor row.
        model.addCols(1, np.ones(1), np.zeros(1), np.full(1, _INF), n, np.zeros(1, np.int32),
                      np.arange(n, dtype=np.int32), np.full(n, -1.0))
        self._model = model

    def add_columns(self, tensor: np.ndarray, starts: np.ndarray, links: np.ndarray, counts: np.ndarray) -> None:
        """Append trees: column k belongs to ``tensor[k]`` and has ``counts`` paths on ``links``
        in ``starts[k]:starts[k+1]`` (CSC layout, network link ids)."""
        k = len(tensor)
        if k == 0:
            return
        nnz = int(starts[-1])
        index = np.empty(nnz + k, dtype=np.int32)
        value = np.empty(nnz + k, dtype=float)
        col_of_entry = np.repeat(np.arange(k), np.diff(starts))
        new_starts = starts[:-1] + np.arange(k)  # one extra entry (the tensor row) per column
        index[new_starts] = tensor
        value[new_starts] = 1.0
        position = np.arange(nnz) + col_of_entry + 1
        index[position] = self.n_tensors + links
        value[position] = counts
        self._model.addCols(k, np.zeros(k), np.zeros(k), np.full(k, _INF), nnz + k,
                            new_starts.astype(np.int32), index, value)
        self.column_tensor.append(np.asarray(tensor, dtype=np.int64))
        self._csc.append((np.asarray(starts, dtype=np.int64), np.asarray(links, dtype=np.int32),
                          np.asarray(counts, dtype=float)))
        self.n_columns += k

    def tensors(self) -> np.ndarray:
        return np.concatenate(self.column_tensor) if self.column_tensor else np.zeros(0, dtype=np.int64)

    def solve(self, time_limit_s: float | None = None, iteration_limit: int | None = None) -> MasterSolution | None:
        """Re-solve from the last basis; None when ``time_limit_s`` or ``iteration_limit`` (simplex
        pivots of this solve) ran out first, and ``stopped`` then says which ("time" / "iterations")."""
        model = self._model
        highs.set_limits(model, time_limit_s=time_limit_s, iteration_limit=iteration_limit)
        self.stopped = None
        outcome = highs.run(model, "the AllToAll master LP")
        if outcome is not highs.Outcome.OPTIMAL:
            self.stopped = outcome.value  # "time" or "iterations"
            self.abandoned_iterations += int(model.getInfo().simplex_iteration_count)
            return None
        info = model.getInfo()
        iterations = int(info.simplex_iteration_count)
        self.iterations += iterations
        self.solves += 1
        solution = model.getSolution()
        col = np.asarray(solution.col_value)
        dual = np.asarray(solution.row_dual)
        activity = np.asarray(solution.row_value)
        n = self.n_tensors
        # HiGHS row duals are d(objective)/d(row bound): +α_a on the link rows (≤ cap), −α_c on the
        # tensor rows (a larger lower bound on Σx − z costs objective). Clipped at 0 against round-off.
        tensor_duals = np.maximum(-dual[:n], 0.0)
        link_duals = np.maximum(dual[n:], 0.0)
        self._last = MasterSolution(
            z=float(col[0]) * self.scale,
            x=col[1:] * self.scale,
            tensor_duals=tensor_duals,
            link_duals=link_duals,
            link_activity=activity[n:] * self.scale,
            iterations=iterations,
        )
        return self._last

    # -- warm restarts -------------------------------------------------------------------------
    def snapshot(self) -> MasterSnapshot:
        """The columns and the basis of the last solve (which must exist)."""
        if self._last is None:
            raise SynthesisError("the master has not been solved; there is no basis to keep")
        basis = self._model.getBasis()
        starts, links, counts = [], [], []
        offset = 0
        for part_starts, part_links, part_counts in self._csc:
            starts.append(part_starts[:-1] + offset)
            links.append(part_links)
            counts.append(part_counts)
            offset += int(part_starts[-1])
        return MasterSnapshot(
            tensor=self.tensors(),
            starts=np.concatenate(starts + [np.array([offset])]).astype(np.int64),
            links=np.concatenate(links) if links else np.zeros(0, np.int32),
            counts=np.concatenate(counts) if counts else np.zeros(0),
            col_status=np.array([int(status) for status in basis.col_status], dtype=np.int8),
            row_status=np.array([int(status) for status in basis.row_status], dtype=np.int8),
            link_activity=self._last.link_activity.copy(),
            link_duals=self._last.link_duals.copy(),
            n_tensors=self.n_tensors,
        )

    @classmethod
    def restart(cls, snapshot: MasterSnapshot, capacity: np.ndarray, *, keep_basis: bool,
                threads: int = 1) -> Master:
        """A master over ``capacity`` with the snapshot's columns, from its basis if ``keep_basis``."""
        master = cls(snapshot.n_tensors, capacity, threads=threads)
        master.add_columns(snapshot.tensor, snapshot.starts, snapshot.links, snapshot.counts)
        if keep_basis:
            if snapshot.col_status is None or snapshot.row_status is None:
                raise SynthesisError("the previous master's snapshot kept no basis to restart from")
            if not highs.set_basis(master._model, snapshot.col_status, snapshot.row_status):
                raise SynthesisError("HiGHS refused the previous master's basis")
        return master
