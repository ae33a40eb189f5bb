"""The bottleneck-cut drift test (mccl-paper §3.2, Algorithm 1) and the measured topology.

Algorithm 1, per schedule s with chunks-per-link ``n_a``, bottleneck cut ``K_s`` and
base slacks ``base_slack_{s,a}`` (from the synthesizer, :class:`~mccl.schedule.ScheduleMeta`),
under the current capacities ``M``:

1. ``x_min(s) = min_{a: n_a > 0} M_a / n_a`` — the per-chunk rate the most congested link allows;
2. for each ``a ∈ K_s``: slack ``(M_a − n_a·x_min) / M_a`` and its deviation
   ``δ_a = |slack_a − base_slack_{s,a}|``;
3. flag s when ``max_{a ∈ K_s} δ_a > Γ``.

Scaling every capacity by the same factor leaves every slack unchanged, and a link
off the cut that stays faster than the cut leaves ``x_min`` unchanged: neither
triggers re-synthesis — the schedule is still throughput-optimal (§6.1, Figure 9).
Cost: O(|{a: n_a > 0}|) numpy work per schedule and check.

``n_a`` is the paper's chunk count. Chunks of unequal size (a schedule whose chunk
fractions differ) are weighted by their fraction instead, which is what the base
slack in the metadata was computed with (:func:`mccl.schedule.link_load`); for
equal chunks both give the same slacks.

Measured topology (which capacities the synthesizer sees). Measurements are per
overlay link (§3.3): a rank pair across hosts, or a rank's injection into its host
fabric. Mapping onto physical links, the choice made here:

* a rank pair i → j — across hosts (an ``inter`` sample) or on one host (a per-peer
  ``intra`` sample, ``peer`` ≥ 0) — covers **every link on every route** its transfers took
  (in the active schedule and the earlier versions its measurements came from,
  :func:`merge_maps`); a rank's aggregate intra-host injection rate (``intra`` with
  ``peer`` = -1) covers the links of its intra-host routes that stay inside the host (its
  port into the host switch and the switch's ports to its peers; a same-host route through
  the NIC is left to the inter-host evidence). Why per-peer intra samples matter: with the
  aggregate, a GPU's own NVLink egress had one piece of evidence, its injection into the
  whole host, which falls whenever the peers' ingress links do; a uniform slowdown of
  every ingress link then lowered injections unevenly (0.63–0.81×, flow simulator) and the
  untouched egress links took the blame. Per pair, the egress link i → switch is exonerated
  by the best of i's pairs and each ingress link by the best pair into it;
* a path's throughput is bounded by every link on its route (``r_o ≤ C_a`` for
  ``a ∈ o``), so each measured path is a lower bound on each link it covers, and
  the tightest estimate of a link is the best path through it:
  ``factor_a = max_{o ∋ a} factor_o``. A single degraded link slows every path
  through it and is found exactly; a link that some path still crosses at full
  speed is exonerated (a slow pair is blamed on the links only it uses).
* only *fresh* evidence exonerates: an overlay link the active schedule no longer
  uses keeps its last value in the EWMA, which says nothing about the fabric now.
  When ``fresh`` is given (overlay links sampled since the active version was
  issued), a link covered by a fresh overlay link takes the max over the fresh ones
  only; a link only stale ones cover keeps the max over those (the last word on it).

Rates are compared with what the same overlay link delivered when the active schedule
version started (the :class:`~mccl.control.ewma.OverlayEWMA` references, relearned per
version), so the fabric's absolute speed does not matter (loopback in the demo, RDMA on
GPUs): ``factor_o = M_o / reference_o``. The references were taken on the fabric the
manager then believed in, ``base`` (nominal for the first version; the measured topology
a re-synthesized version was made for), so a physical link's capacity is
``min(nominal_a, base_a · factor_a)``: a factor above 1 is a recovery. Links no
measurement covers keep their base capacity. A degradation that clears raises the
factors of the paths through it, the measured topology moves back towards nominal, and
the schedule made for the degraded fabric gets flagged in its turn.

Recoveries. A schedule made for a degraded link loads it lightly, so after a repair the
pairs through it are often paced by another link and speed up by less than the link
did: ``base · factor`` then stays below nominal, the next version is made for that, its
references are learned there, and the estimate never gets back (measured: the AllToAll
after Fail3 cleared ran at 57 GB/s against 85.6 before). Gray failures clear by repair,
so a link believed degraded whose best path speeds up clearly (``recovered_factor``,
the manager passes 1 + Γ: beyond noise and beyond what the drift test ignores) is taken
back to nominal; a partial recovery smaller than that keeps ``base · factor``.

Headroom. ``base · factor`` is exact for a link its paths saturated at the reference; an executor that runs
a schedule below its bound leaves every link headroom, and a link that lost more than its paths did reads
too fast (Fail1 on the flow simulator: GPU 0's NVLink, true 800, read ~1600). Where rates are in the
topology's units, what a re-synthesis is made for reads such a link at the traffic it carries now
(:mod:`.saturation`); the drift test itself keeps this scale-free reading.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.errors import ControllerError
from mccl.schedule import Schedule, chunks_per_link, link_load
from mccl.topology import Topology

__all__ = ["CutProfile", "DriftResult", "OverlayMap", "profile", "drift_test", "overlay_map", "merge_maps",
           "measured_capacities"]


@dataclass(frozen=True)
class CutProfile:
    """What Algorithm 1 needs of one schedule, as arrays: the loaded links and their ``n_a``,
    the cut links ``K_s`` (positions into ``links``) and their base slacks."""

    links: np.ndarray  # link ids with n_a > 0, and the cut's
    n: np.ndarray  # n_a (or fraction-weighted load) for those links
    cut: np.ndarray  # positions into ``links`` of the cut links
    base_slack: np.ndarray


@dataclass(frozen=True)
class DriftResult:
    x_min: float
    slack: np.ndarray  # per cut link
    deviation: np.ndarray  # δ_a per cut link
    max_deviation: float
    flagged: bool
    worst_link: int  # link id with the largest δ (-1 without a cut)


def profile(schedule: Schedule, n_links: int) -> CutProfile:
    """The arrays of Algorithm 1 for ``schedule`` (on a topology with ``n_links`` links)."""
    fractions = schedule.chunks.fraction
    equal = len(fractions) == 0 or np.allclose(fractions, fractions[0])
    weight = chunks_per_link(schedule, n_links).astype(float) if equal else link_load(schedule, n_links)
    cut_ids = np.array([item.link for item in schedule.meta.bottleneck_cut], dtype=np.int64)
    if np.any((cut_ids < 0) | (cut_ids >= n_links)):
        raise ControllerError(f"the schedule's bottleneck cut names links outside the topology's {n_links}")
    # a proven cut may include links the rounded schedule leaves empty: n_a = 0, slack 1 (Algorithm 1 phase 2)
    links = np.union1d(np.flatnonzero(weight > 0), cut_ids)
    position = {int(link): i for i, link in enumerate(links)}
    return CutProfile(links, weight[links], np.array([position[int(link)] for link in cut_ids], dtype=np.int64),
                      np.array([item.base_slack for item in schedule.meta.bottleneck_cut], dtype=float))


def drift_test(cut: CutProfile, capacities_gbps: np.ndarray, gamma: float) -> DriftResult:
    """Algorithm 1 under ``capacities_gbps`` (M, indexed by link id); see the module docstring."""
    m = np.asarray(capacities_gbps, dtype=float)[cut.links]
    if np.any(~(m > 0)):
        raise ControllerError("measured capacities must be positive on every link the schedule uses")
    loaded = cut.n > 0
    x_min = float(np.min(m[loaded] / cut.n[loaded])) if np.any(loaded) else float("inf")  # phase 1
    if len(cut.cut) == 0:
        return DriftResult(x_min, np.zeros(0), np.zeros(0), 0.0, False, -1)
    mk = m[cut.cut]
    slack = (mk - cut.n[cut.cut] * x_min) / mk  # phase 2
    deviation = np.abs(slack - cut.base_slack)
    worst = int(np.argmax(deviation))
    max_dev = float(deviation[worst])
    return DriftResult(x_min, slack, deviation, max_dev, max_dev > gamma, int(cut.links[cut.cut[worst]]))  # phase 3


@dataclass(frozen=True)
class OverlayMap:
    """Physical links bounded by each overlay link of a schedule, in CSR form (see module docstring).

    The path of rank pair (i, j) — across hosts, or on one host for per-peer intra samples — is overlay
    ``i * n + j``; rank i's aggregate intra injection is overlay ``n * n + i``."""

    n_ranks: int
    offsets: np.ndarray
    links: np.ndarray

    def links_of(self, overlay: int) -> np.ndarray:
        return self.links[self.offsets[overlay]:self.offsets[overlay + 1]]


def overlay_map(schedule: Schedule, topology: Topology) -> OverlayMap:
    """Which physical links each overlay link covers (module docstring); vectorized over transfers."""
    n = schedule.n_ranks
    host_names = [topology.node(gpu).host for gpu in schedule.ranks]
    codes = {name: code for code, name in enumerate(sorted({h for h in host_names if h is not None}))}
    rank_host = np.array([codes.get(h, -1) if h is not None else -1 for h in host_names], dtype=np.int64)
    link_host = np.array([codes.get(topology.node(link.dst).host, -2) for link in topology.links], dtype=np.int64)
    transfers = schedule.transfers
    sender = transfers.sender.astype(np.int64)
    receiver = transfers.receiver.astype(np.int64)
    route_offsets = transfers.route_offsets
    hops = int(route_offsets[-1])
    intra = (rank_host[sender] >= 0) & (rank_host[sender] == rank_host[receiver])
    pair = sender * n + receiver  # the path's own slot: every link of every route (inter, per-peer intra)
    # the transfer of every hop: a running count of the route starts (cheaper than np.repeat of an arange)
    hop_transfer = np.cumsum(np.bincount(route_offsets[1:-1], minlength=hops + 1)[:hops])
    links = transfers.route_links.astype(np.int64)
    intra_hops = np.flatnonzero(intra[hop_transfer])
    owner = hop_transfer[intra_hops]
    outside = link_host[links[intra_hops]] != rank_host[sender[owner]]
    leaves_host = np.zeros(len(transfers), dtype=bool)  # same host, through the NIC
    leaves_host[owner[outside]] = True
    injection_hops = intra_hops[~leaves_host[owner]]  # the rank's aggregate injection: routes inside the host
    n_links = len(topology.links)
    keys = np.sort(np.concatenate([pair[hop_transfer] * n_links + links,
                                   (n * n + sender[hop_transfer[injection_hops]]) * n_links + links[injection_hops]]))
    keys = keys[np.r_[True, keys[1:] != keys[:-1]]] if len(keys) else keys  # unique: a sort beats np.unique's hash
    owners, covered = keys // n_links, keys % n_links
    offsets = np.zeros(n * n + n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owners, minlength=n * n + n), out=offsets[1:])
    return OverlayMap(n, offsets, covered)


def merge_maps(first: OverlayMap, second: OverlayMap) -> OverlayMap:
    """Per overlay link, the union of the links both maps say it covers (same communicator)."""
    if first.n_ranks != second.n_ranks:
        raise ControllerError(f"overlay maps of {first.n_ranks} and {second.n_ranks} ranks cannot be merged")
    overlays = len(first.offsets) - 1
    owners = np.concatenate([np.repeat(np.arange(overlays), np.diff(first.offsets)),
                             np.repeat(np.arange(overlays), np.diff(second.offsets))])
    both = np.concatenate([first.links, second.links]).astype(np.int64)
    width = int(both.max()) + 1 if len(both) else 1
    keys = np.sort(owners * width + both)  # sorted by overlay, then link: each overlay's union, in CSR
    keys = keys[np.r_[True, keys[1:] != keys[:-1]]] if len(keys) else keys  # a sort beats np.unique's hash
    offsets = np.zeros(overlays + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // width, minlength=overlays), out=offsets[1:])
    links = keys % width
    return OverlayMap(first.n_ranks, offsets, links)


def measured_capacities(mapping: OverlayMap, inter_factor: np.ndarray, intra_factor: np.ndarray,
                        nominal_gbps: np.ndarray,
                        fresh: tuple[np.ndarray, np.ndarray] | None = None, *,
                        base_gbps: np.ndarray | None = None, recovered_factor: float | None = None) -> np.ndarray:
    """Per link, ``min(nominal, base · max factor)`` over the overlay links that cover it (module
    docstring); ``base_gbps``: the capacities the references were learned on (None: nominal, which
    makes it ``nominal · min(1, max factor)``); ``fresh``: ``(inter, intra)`` masks of the overlay
    links sampled since the active version was issued. Uncovered links keep their base capacity.
    ``recovered_factor``: a link believed degraded (base below nominal) whose best path now runs
    more than this many times faster than its reference is taken as repaired, back to nominal
    (module docstring, "Recoveries").

    Factors are NaN where an overlay link has no reference yet; those are skipped."""
    n = mapping.n_ranks
    factors = np.concatenate([np.asarray(inter_factor, dtype=float).reshape(n * n),
                              np.asarray(intra_factor, dtype=float).reshape(n)])
    counts = np.diff(mapping.offsets)
    per_entry = np.repeat(factors, counts)
    known = ~np.isnan(per_entry) & (per_entry > 0)
    best = np.full(len(nominal_gbps), -np.inf)
    np.maximum.at(best, mapping.links[known], per_entry[known])
    if fresh is not None:
        new = np.concatenate([np.asarray(fresh[0], dtype=bool).reshape(n * n),
                              np.asarray(fresh[1], dtype=bool).reshape(n)])
        current = known & np.repeat(new, counts)
        best_fresh = np.full(len(nominal_gbps), -np.inf)
        np.maximum.at(best_fresh, mapping.links[current], per_entry[current])
        best = np.where(np.isfinite(best_fresh), best_fresh, best)
    nominal = np.asarray(nominal_gbps, dtype=float)
    result = np.array(nominal if base_gbps is None else base_gbps, dtype=float)
    if result.shape != nominal.shape:
        raise ControllerError(f"base capacities for {result.shape} links, nominal for {nominal.shape}")
    touched = np.isfinite(best)
    result[touched] = np.minimum(result[touched] * best[touched], nominal[touched])
    if recovered_factor is not None:
        repaired = touched & (best > recovered_factor)
        result[repaired] = nominal[repaired]
    return np.minimum(result, nominal)
