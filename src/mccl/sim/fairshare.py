"""Max-min fair rates of flows on links: progressive filling, vectorized.

Every flow crosses a route of links; every link has a capacity. The max-min fair
allocation (Bertsekas & Gallager, *Data Networks*, §6.5.2) raises all rates
together and freezes a flow when a link on its route saturates. It is the
flow-level model of TCP/RoCE congestion control that SimAI's and NS-3's
flow-level modes approximate, and the rate model of mccl-paper §2.3's simulator.

Algorithm (parallel progressive filling). Let ``share_l = remaining_l / unfrozen_l``
be link l's fair share. A link whose share is no larger than the bottleneck share of
every flow crossing it is a *local minimum*; all its unfrozen flows get exactly
``share_l`` in the max-min allocation, because freezing other flows at lower levels
only raises the shares of the links they leave. Each round freezes the flows of all
local minima at once (the global minimum is always one, so every round makes
progress), subtracts their rates, and repeats. Rounds are bounded by the longest
chain of bottleneck dependencies, usually a handful, and each round is a few
``bincount`` / ``reduceat`` passes over the flow-link incidences: O(rounds · hops).

A per-flow ``cap`` (a demand limit) acts as a private link of that capacity.
Per-flow ``weights`` give weighted max-min fairness: shares are per unit of weight
and a flow gets its weight times its bottleneck's share (the engine weights a
collective's earlier steps far above its later ones, so that a hop sends the
older block first, as a FIFO connection does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FairShare", "max_min_rates"]

# Relative tolerance for ties between shares (floating-point noise of the subtractions).
_TIE = 1e-12


@dataclass(frozen=True)
class FairShare:
    """Rates per flow (units of the capacities) and, per flow, the link that froze it
    (-1 when its cap did, or when its route is empty)."""

    rates: np.ndarray
    bottleneck: np.ndarray
    rounds: int


def max_min_rates(
    offsets: np.ndarray,
    links: np.ndarray,
    capacity: np.ndarray,
    caps: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> FairShare:
    """Max-min fair rates of flows whose routes are ``links[offsets[f]:offsets[f+1]]``.

    ``capacity`` is indexed by link id. Flows with an empty route get their cap (inf
    without one). A link listed twice on one route counts twice (the flow crosses it
    twice).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    links = np.asarray(links, dtype=np.int64)
    n_flows = len(offsets) - 1
    n_links = len(capacity)
    cap = np.full(n_flows, np.inf) if caps is None else np.asarray(caps, dtype=float)
    weight = np.ones(n_flows) if weights is None else np.asarray(weights, dtype=float)
    rates = cap.copy()
    cap = cap / weight  # caps as levels (per unit of weight)
    bottleneck = np.full(n_flows, -1, dtype=np.int64)
    if n_flows == 0 or len(links) == 0:
        return FairShare(rates, bottleneck, 0)

    lengths = np.diff(offsets)
    flows = np.flatnonzero(lengths > 0)  # unfrozen flows (with a route), ascending
    flow_len = lengths[flows]
    inc_link = links.copy() if len(flows) == n_flows else links[_gather_positions(offsets, flows)]
    remaining = np.asarray(capacity, dtype=float).copy()
    rounds = 0
    while len(flows):
        rounds += 1
        starts = np.zeros(len(flows), dtype=np.int64)
        np.cumsum(flow_len[:-1], out=starts[1:])
        flow_weight = weight[flows]
        inc_weight = np.repeat(flow_weight, flow_len)
        count = np.bincount(inc_link, weights=inc_weight, minlength=n_links)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, np.maximum(remaining, 0.0) / count, np.inf)
        inc_share = share[inc_link]
        flow_min = np.minimum(np.minimum.reduceat(inc_share, starts), cap[flows])
        inc_flow_min = np.repeat(flow_min, flow_len)
        # A link is a local minimum when no flow on it is held below its share elsewhere.
        below = inc_flow_min < inc_share * (1.0 - _TIE)
        blocked = np.bincount(inc_link, weights=below, minlength=n_links)
        local_min = (count > 0) & (blocked == 0)
        inc_frozen = local_min[inc_link]
        frozen = np.logical_or.reduceat(inc_frozen, starts) | (cap[flows] <= flow_min * (1.0 + _TIE))
        if not frozen.any():  # cannot happen in exact arithmetic; freeze the global minimum
            frozen = flow_min <= flow_min.min() * (1.0 + _TIE)
        chosen = flows[frozen]
        rates[chosen] = flow_min[frozen] * flow_weight[frozen]
        # Name the saturated link that froze each flow (cap-frozen flows keep -1).
        at_link = inc_frozen & (inc_share <= inc_flow_min * (1.0 + _TIE))
        owner = np.repeat(flows, flow_len)
        bottleneck[owner[at_link]] = inc_link[at_link]
        inc_frozen_flow = np.repeat(frozen, flow_len)
        remaining -= np.bincount(inc_link[inc_frozen_flow], weights=(inc_flow_min * inc_weight)[inc_frozen_flow],
                                 minlength=n_links)
        keep = ~inc_frozen_flow
        inc_link = inc_link[keep]
        flows = flows[~frozen]
        flow_len = flow_len[~frozen]
    return FairShare(rates, bottleneck, rounds)


def _gather_positions(offsets: np.ndarray, flows: np.ndarray) -> np.ndarray:
    """Positions in the incidence array of the routes of ``flows`` (in order)."""
    starts = offsets[flows]
    lengths = offsets[flows + 1] - starts
    out_starts = np.zeros(len(flows), dtype=np.int64)
    np.cumsum(lengths[:-1], out=out_starts[1:])
    return np.repeat(starts - out_starts, lengths) + np.arange(int(lengths.sum()))
