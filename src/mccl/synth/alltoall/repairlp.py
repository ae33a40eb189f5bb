"""The repair LP of :mod:`.repair` in HiGHS: crash basis, lazy link rows, routes added as priced.

Columns z, θ, then one per candidate route of an affected pair; rows: one per
affected pair (``Σ_r f_{p,r} − z ≥ 0``), the θ row (``θ · z_old − z ≥ 0``), then
link rows (``θ · L_a + Σ β_a f ≤ cap_a``) as they are added. Why the crash basis
and the lazy rows: see :mod:`.repair`.
"""

from __future__ import annotations

import numpy as np

from mccl.errors import SynthesisError
from mccl.synth import highs
from mccl.synth.alltoall.rounding import route_load

__all__ = ["RepairLP", "crash", "solve_with_rows"]

_INF = highs.INF
_BASIC, _LOWER, _UPPER = highs.BASIC, highs.LOWER, highs.UPPER
_OVER = 1e-9  # relative: a link this far over its capacity is violated
_MAX_ROUNDS = 25  # lazy-row rounds before giving up (each adds at least one row)


def crash(route_links: np.ndarray, first: np.ndarray, last: np.ndarray, base: np.ndarray, capacity: np.ndarray,
          demand: float, rng: np.random.Generator, batch: int = 16) -> np.ndarray:
    """One route per affected pair (index into the candidates): in random order, ``batch`` pairs at a
    time, each on the candidate whose busiest link would be least utilised by ``demand`` more."""
    load = base.copy()
    choice = np.empty(len(first), dtype=np.int64)
    order = rng.permutation(len(first))
    with np.errstate(divide="ignore", invalid="ignore"):
        for group in np.array_split(order, max(len(order) // batch, 1)):
            counts = last[group] - first[group]
            owner = np.repeat(np.arange(len(group)), counts)
            entries = np.repeat(first[group], counts) + np.arange(int(counts.sum())) - np.repeat(
                np.cumsum(counts) - counts, counts)
            links = route_links[entries]
            safe = np.maximum(links, 0)
            util = np.where(links >= 0, (load[safe] + demand) / capacity[safe], 0.0)
            util = np.nan_to_num(util, nan=np.inf).max(axis=1)
            order_in = np.lexsort((util, owner))
            head = np.ones(len(order_in), dtype=bool)
            head[1:] = owner[order_in][1:] != owner[order_in][:-1]
            picked = entries[order_in[head]]
            choice[group] = picked
            load += route_load(route_links[picked], np.full(len(picked), demand), len(load))
    return choice


class RepairLP:
    """The repair LP in HiGHS: columns z, θ, then one per candidate route; rows: one per affected
    pair, the θ row, then link rows as they are added."""

    def __init__(self, pair_row: np.ndarray, n_pairs: int, route_links: np.ndarray, unaffected_load: np.ndarray,
                 capacity: np.ndarray, z_old: float) -> None:
        self.load = unaffected_load  # L_a, Gbit/s
        self.capacity = capacity
        self.scale = float(np.max(capacity))
        self.n_pairs = n_pairs
        self.row_of_link = np.full(len(capacity), -1, dtype=np.int64)
        self.links: list[np.ndarray] = []
        self.iterations = 0
        # Presolve off keeps the crash basis; primal simplex (strategy 4) starts from it (primal feasible).
        model = highs.new_model(presolve="off", simplex_strategy=4, threads=1)
        model.setOptionValue("dual_feasibility_tolerance", 1e-9)
        model.setOptionValue("primal_feasibility_tolerance", 1e-9)
        highs.maximize(model)
        rows = n_pairs + 1
        model.addRows(rows, np.zeros(rows), np.full(rows, _INF), 0, np.zeros(0, np.int32), np.zeros(0, np.int32),
                      np.zeros(0))
        model.addCols(1, np.ones(1), np.zeros(1), np.full(1, _INF), rows, np.zeros(1, np.int32),
                      np.arange(rows, dtype=np.int32), np.full(rows, -1.0))  # z
        model.addCols(1, np.zeros(1), np.zeros(1), np.full(1, _INF), 1, np.zeros(1, np.int32),
                      np.array([n_pairs], dtype=np.int32), np.array([z_old / self.scale]))  # θ
        self.model = model
        self.theta_max = np.inf
        self.n_routes = 0
        self.route_links = np.zeros((0, route_links.shape[1]), dtype=route_links.dtype)
        self.add_routes(pair_row, route_links)

    def add_routes(self, pair_row: np.ndarray, route_links: np.ndarray) -> None:
        """Columns for more routes: 1 in their pair's row, β on the link rows present."""
        k = len(pair_row)
        width = max(self.route_links.shape[1], route_links.shape[1])
        self.route_links = np.vstack([_pad(self.route_links, width), _pad(route_links, width)])
        self.n_routes += k
        member = (route_links >= 0) & (self.row_of_link[np.maximum(route_links, 0)] >= 0)
        route = np.broadcast_to(np.arange(k)[:, None], route_links.shape)[member]
        key, counts = np.unique(route.astype(np.int64) * len(self.capacity) + route_links[member],
                                return_counts=True)
        column = np.concatenate([np.arange(k), key // len(self.capacity)])
        row = np.concatenate([pair_row, self.row_of_link[key % len(self.capacity)]])
        value = np.concatenate([np.ones(k), counts.astype(float)])
        order = np.lexsort((row, column))
        starts = np.searchsorted(column[order], np.arange(k))
        self.model.addCols(k, np.zeros(k), np.zeros(k), np.full(k, _INF), len(order), starts.astype(np.int32),
                           row[order].astype(np.int32), value[order])

    @property
    def n_link_rows(self) -> int:
        return int(sum(len(part) for part in self.links))

    def add_links(self, links: np.ndarray) -> None:
        """Rows ``θ L_a + Σ β_a f ≤ cap_a`` for ``links`` (not rows yet), then θ's bound over the rest."""
        first_row = self.n_pairs + 1 + self.n_link_rows
        self.row_of_link[links] = first_row + np.arange(len(links))
        self.links.append(links)
        new = np.zeros(len(self.capacity), dtype=bool)
        new[links] = True
        member = (self.route_links >= 0) & new[np.maximum(self.route_links, 0)]
        route = np.broadcast_to(np.arange(self.n_routes)[:, None], self.route_links.shape)[member]
        key, counts = np.unique(self.route_links[member].astype(np.int64) * (self.n_routes + 2) + route + 2,
                                return_counts=True)
        row = self.row_of_link[key // (self.n_routes + 2)]
        column = key % (self.n_routes + 2)
        with_load = links[self.load[links] > 0]
        row = np.concatenate([self.row_of_link[with_load], row])
        column = np.concatenate([np.ones(len(with_load), dtype=np.int64), column])
        value = np.concatenate([self.load[with_load] / self.scale, counts.astype(float)])
        order = np.lexsort((column, row))
        starts = np.searchsorted(row[order], first_row + np.arange(len(links)))
        self.model.addRows(len(links), np.full(len(links), -_INF), self.capacity[links] / self.scale, len(order),
                           starts.astype(np.int32), column[order].astype(np.int32), value[order])
        outside = (self.row_of_link < 0) & (self.load > 0)
        self.theta_max = float(np.min(self.capacity[outside] / self.load[outside])) if np.any(outside) else np.inf
        self.model.changeColBounds(1, 0.0, self.theta_max if np.isfinite(self.theta_max) else _INF)

    def setcrash(self, choice: np.ndarray, z_old: float) -> bool:
        """Start from the basis of the crash routes ``choice`` (see the module docstring)."""
        rows = np.concatenate(self.links)
        crossing = route_load(self.route_links[choice], np.ones(len(choice)), len(self.capacity))
        with np.errstate(divide="ignore", invalid="ignore"):
            z_limit = self.capacity[rows] / (self.load[rows] / z_old + crossing[rows])
        z_limit = np.nan_to_num(z_limit, nan=np.inf)
        column_status = [_LOWER] * (2 + self.n_routes)
        column_status[0] = _BASIC
        for route in (choice + 2).tolist():
            column_status[route] = _BASIC
        row_status = [_LOWER] * (self.n_pairs + 1) + [_BASIC] * len(rows)
        tight = int(np.argmin(z_limit))
        if z_limit[tight] / z_old < self.theta_max:
            column_status[1] = _BASIC
            row_status[self.n_pairs + 1 + tight] = _UPPER
        else:
            column_status[1] = _UPPER
        return highs.set_basis(self.model, column_status, row_status)

    def solve(self) -> np.ndarray | None:
        """Column values (z and f in Gbit/s, θ as is), or None when HiGHS did not reach optimality."""
        try:
            outcome = highs.run(self.model, "the AllToAll repair LP")
        except SynthesisError:  # infeasible or a solver failure: the caller falls back to column generation
            outcome = None
        self.iterations += int(self.model.getInfo().simplex_iteration_count)
        if outcome is not highs.Outcome.OPTIMAL:
            return None
        values = np.asarray(self.model.getSolution().col_value, dtype=float).copy()
        values[0] *= self.scale
        values[2:] *= self.scale
        return values

    def duals(self) -> tuple[np.ndarray, np.ndarray]:
        """``(pair duals α_p ≥ 0, link duals y_a ≥ 0 per network link)`` of the last solve."""
        dual = np.asarray(self.model.getSolution().row_dual, dtype=float)
        links = np.zeros(len(self.capacity))
        inside = self.row_of_link >= 0
        links[inside] = np.maximum(dual[self.row_of_link[inside]], 0.0)
        return np.maximum(-dual[: self.n_pairs], 0.0), links


def _pad(links: np.ndarray, width: int) -> np.ndarray:
    if links.shape[1] >= width:
        return links
    return np.hstack([links, np.full((len(links), width - links.shape[1]), -1, dtype=links.dtype)])


def solve_with_rows(lp: RepairLP, unaffected_load: np.ndarray, capacity: np.ndarray) -> np.ndarray | None:
    """Solve, adding the links over capacity (and those that set θ's bound when it binds) as rows
    until none is left; the column values, or None when HiGHS fails or the rounds run out."""
    for _ in range(_MAX_ROUNDS):
        values = lp.solve()
        if values is None:
            return None
        theta = float(values[1])
        load = theta * unaffected_load + route_load(lp.route_links, values[2:], len(capacity))
        join = (lp.row_of_link < 0) & (load > capacity * (1 + _OVER))
        if np.isfinite(lp.theta_max) and theta >= lp.theta_max * (1 - _OVER):
            safe = np.where(unaffected_load > 0, unaffected_load, 1.0)
            join |= (lp.row_of_link < 0) & (unaffected_load > 0) & (capacity / safe <= lp.theta_max * (1 + _OVER))
        if not np.any(join):
            return values
        lp.add_links(np.flatnonzero(join))
    return None
