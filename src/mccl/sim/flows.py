"""The engine's table of active flows, with rates recomputed only where something changed.

Zones. Two flows can only influence each other's max-min rate through a chain of
shared links, and every link a flow may ever use is known in advance (the routes
of the compiled schedules and of the background flows). Links that appear
together on some route are joined into a *zone* (connected components of the
"consecutive on a route" graph, scipy's ``connected_components``). A flow starting
or ending, or a link changing, can only change the rates of flows in its zone;
only those are re-solved. On a ring over an HPN fabric the zones are a host's
NVSwitch links and a few NIC/ToR links each, so an event touches tens of flows
instead of thousands; on an all-to-all every link is one zone and nothing is lost.

Remaining bytes are stored as of the last rate change (``t0``), with the
predicted finish time, so advancing the clock costs nothing per flow.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from mccl.sim.compiled import csr_gather
from mccl.sim.fairshare import max_min_rates

__all__ = ["FlowTable"]

_MAX_STEP_GAP = 4  # weights below step_priority**-4 make no difference


class FlowTable:
    """Active flows (struct of arrays): run slot (-1: greedy background), transfer or
    background index, route, step, bytes left at ``t0``, rate (bytes/s), predicted finish."""

    def __init__(self, n_links: int, step_priority: float) -> None:
        self.n_links = n_links
        self.step_priority = step_priority
        self.run = np.zeros(0, dtype=np.int64)
        self.transfer = np.zeros(0, dtype=np.int64)
        self.length = np.zeros(0, dtype=np.int64)
        self.step = np.zeros(0, dtype=np.int64)
        self.hop = np.zeros(0, dtype=np.int64)  # hop id within the run: flows of one hop send older steps first
        self.n_hops: dict[int, int] = {}  # per run slot, an upper bound of its hop ids
        self.path = np.zeros(0, dtype=np.int64)
        self.zone = np.zeros(0, dtype=np.int64)
        self.remaining = np.zeros(0)  # bytes left at t0
        self.t0 = np.zeros(0)
        self.rate = np.zeros(0)
        self.finish = np.zeros(0)  # predicted time the last byte leaves
        self.bottleneck = np.zeros(0, dtype=np.int64)
        self.links = np.zeros(0, dtype=np.int64)  # routes, concatenated in flow order
        self.link_rate = np.zeros(n_links)  # bytes/s of these flows on each link
        self.link_zone = np.arange(n_links)
        self._edges = np.zeros(0, dtype=np.int64)  # a * n_links + b for links consecutive on a route
        self.dirty = np.ones(n_links, dtype=bool)
        self.solves = self.rounds = 0

    def __len__(self) -> int:
        return len(self.run)

    # -- zones -------------------------------------------------------------------
    def add_routes(self, offsets: np.ndarray, links: np.ndarray) -> None:
        """Make sure links used together on these routes share a zone."""
        if len(links) < 2:
            return
        inner = np.ones(len(links) - 1, dtype=bool)
        ends = offsets[1:-1] - 1
        inner[ends[(ends >= 0) & (ends < len(inner))]] = False
        pairs = np.unique(links[:-1][inner] * self.n_links + links[1:][inner])
        fresh = np.setdiff1d(pairs, self._edges, assume_unique=True)
        if not len(fresh):
            return
        self._edges = np.union1d(self._edges, fresh)
        a, b = np.divmod(self._edges, self.n_links)
        graph = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(self.n_links, self.n_links))
        _, self.link_zone = connected_components(graph, directed=False)
        starts = np.cumsum(self.length) - self.length
        self.zone = self.link_zone[self.links[starts]] if len(self.run) else self.zone
        self.dirty = np.ones(self.link_zone.max() + 1, dtype=bool)

    def touch_links(self, links: np.ndarray | tuple[int, ...]) -> None:
        self.dirty[self.link_zone[np.asarray(links, dtype=np.int64)]] = True

    # -- membership ------------------------------------------------------------------
    def add(self, run: int, transfers: np.ndarray, size: np.ndarray, lengths: np.ndarray, links: np.ndarray,
            paths: np.ndarray, steps: np.ndarray, hops: np.ndarray, now: float) -> None:
        count = len(transfers)
        first = links[np.cumsum(lengths) - lengths]
        zones = self.link_zone[first]
        self.dirty[zones] = True
        self.run = np.concatenate([self.run, np.full(count, run, dtype=np.int64)])
        self.transfer = np.concatenate([self.transfer, transfers])
        self.length = np.concatenate([self.length, lengths])
        self.step = np.concatenate([self.step, steps])
        self.hop = np.concatenate([self.hop, hops])
        if len(hops):
            self.n_hops[run] = max(self.n_hops.get(run, 0), int(hops.max()) + 1)
        self.path = np.concatenate([self.path, paths])
        self.zone = np.concatenate([self.zone, zones])
        self.remaining = np.concatenate([self.remaining, size])
        self.t0 = np.concatenate([self.t0, np.full(count, now)])
        self.rate = np.concatenate([self.rate, np.zeros(count)])
        self.finish = np.concatenate([self.finish, np.full(count, np.inf)])
        self.bottleneck = np.concatenate([self.bottleneck, np.full(count, -1, dtype=np.int64)])
        self.links = np.concatenate([self.links, links])

    def remove(self, gone: np.ndarray) -> None:
        """Drop the flows of the boolean mask ``gone``; their zones need new rates."""
        per_link = np.repeat(gone, self.length)
        self.link_rate -= np.bincount(self.links[per_link], weights=np.repeat(self.rate[gone], self.length[gone]),
                                      minlength=self.n_links)
        self.dirty[self.zone[gone]] = True
        keep = ~gone
        self.links = self.links[~per_link]
        for name in ("run", "transfer", "length", "step", "hop", "path", "zone", "remaining", "t0", "rate", "finish",
                     "bottleneck"):
            setattr(self, name, getattr(self, name)[keep])

    # -- rates ---------------------------------------------------------------------------
    def recompute(self, capacity: np.ndarray, now: float) -> None:
        """New max-min rates for the flows of dirty zones, given the capacity left to them."""
        if not self.dirty.any():
            return
        chosen = self.dirty[self.zone]
        self.dirty[:] = False
        if not chosen.any():
            return
        if chosen.all():
            index = np.arange(len(self.run))
            lengths, links = self.length, self.links
        else:
            index = np.flatnonzero(chosen)
            offsets = np.zeros(len(self.run) + 1, dtype=np.int64)
            np.cumsum(self.length, out=offsets[1:])
            lengths, links = csr_gather(offsets, self.links, index)
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        share = max_min_rates(offsets, links, capacity, weights=self._weights(index))
        old = self.rate[index]
        self.link_rate += np.bincount(links, weights=np.repeat(share.rates - old, lengths), minlength=self.n_links)
        np.maximum(self.link_rate, 0.0, out=self.link_rate)
        left = self.remaining[index] - old * (now - self.t0[index])
        self.remaining[index] = left
        self.t0[index] = now
        self.rate[index] = share.rates
        self.bottleneck[index] = share.bottleneck
        with np.errstate(divide="ignore", invalid="ignore"):
            self.finish[index] = np.where(share.rates > 0, now + left / share.rates, np.inf)
        self.solves += 1
        self.rounds += share.rounds

    def _weights(self, index: np.ndarray) -> np.ndarray | None:
        """Older steps first on a hop (mccl.sim.inputs.SimOptions.step_priority): a flow weighs
        ``step_priority``⁻ᵈ, d the steps it is ahead of the oldest flow in flight on the same
        hop (sender, receiver, route) of its collective; background flows weigh 1. Flows of
        other hops share links max-min fairly whatever their steps (a tree's depth says
        nothing about another tree's)."""
        if self.step_priority == 1.0 or not len(index):
            return None
        runs, hops, steps = self.run[index], self.hop[index], self.step[index]
        behind = np.zeros(len(index), dtype=np.int64)
        for run in np.flatnonzero(np.bincount(runs + 1)) - 1:  # the few runs present, without sorting
            if run < 0:
                continue  # background flows weigh 1
            mine = runs == run
            oldest = np.full(self.n_hops[int(run)], np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(oldest, hops[mine], steps[mine])
            behind[mine] = steps[mine] - oldest[hops[mine]]
        return self.step_priority ** (-np.minimum(behind, _MAX_STEP_GAP).astype(float))

    def bytes_left(self, now: float) -> np.ndarray:
        return self.remaining - self.rate * (now - self.t0)
