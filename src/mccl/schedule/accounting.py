"""Link-load accounting of a schedule: what each link carries, and which links pace it.

Loads are in blocks (a block is S/n bytes, see :mod:`mccl.schedule.ir`): a transfer
of a chunk with fraction f adds f to every link of its route. ``n_a`` (chunks per
link, mccl-paper Algorithm 1) counts chunk crossings instead.

Steady state: if every link a runs at capacity C_a (GB/s) the collective cannot
finish before ``max_a load_a · (S/n) / C_a``, so its algbw (S / t) is at most
``n · min_a C_a / load_a``. The bottleneck cut K_s is the set of links that
attain that minimum; a link's base slack is the share of it left unused when the
bottleneck runs full.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mccl.schedule.ir import CutLink, Schedule
from mccl.topology import Topology

__all__ = [
    "link_load",
    "chunks_per_link",
    "steady_state_algbw",
    "bottleneck_cut",
    "link_slack",
    "gbps_to_gbs",
]


def gbps_to_gbs(gbps: np.ndarray | float) -> np.ndarray | float:
    """Gbit/s to GB/s (10⁹ bytes per second)."""
    return gbps / 8.0


def link_load(schedule: Schedule, n_links: int) -> np.ndarray:
    """Blocks carried by each link (fraction-weighted chunk crossings)."""
    return schedule.transfers.link_sums(schedule.chunks.fraction, n_links)


def chunks_per_link(schedule: Schedule, n_links: int) -> np.ndarray:
    """n_a: how many chunk transfers cross each link."""
    return schedule.transfers.link_sums(None, n_links)


def steady_state_algbw(load: np.ndarray, capacities_gbps: np.ndarray, n_ranks: int) -> float:
    """The algbw bound in GB/s: ``n · min_a C_a / load_a`` over loaded links."""
    used = load > 0
    if not np.any(used):
        return float("inf")
    return float(n_ranks * np.min(gbps_to_gbs(capacities_gbps[used]) / load[used]))


def link_slack(load: np.ndarray, capacities_gbps: np.ndarray) -> np.ndarray:
    """Per link, the share of capacity left unused when the most loaded link runs full.

    ``slack_a = (C_a - load_a · x) / C_a`` with ``x = min_b C_b / load_b`` (rate per
    block); 1 for unused links.
    """
    used = load > 0
    slack = np.ones_like(capacities_gbps, dtype=float)
    if np.any(used):
        rate = np.min(capacities_gbps[used] / load[used])
        slack[used] = 1.0 - load[used] * rate / capacities_gbps[used]
    return np.clip(slack, 0.0, 1.0)


def bottleneck_cut(
    schedule: Schedule,
    topology: Topology,
    *,
    tolerance: float = 1e-6,
    cut_links: Sequence[int] | None = None,
    load: np.ndarray | None = None,
) -> tuple[CutLink, ...]:
    """K_s with base slacks: the links that pace the schedule.

    Without ``cut_links`` these are the links whose slack is within ``tolerance``
    of zero (the links the schedule saturates). A synthesizer that proved a
    saturated cut (e.g. the LP's) passes it as ``cut_links``, and gets the slack
    its rounded schedule leaves on each of those links. ``load``: the schedule's
    :func:`link_load`, when the caller has it already (~10⁶ transfers at 512 GPUs).
    """
    load = link_load(schedule, len(topology.links)) if load is None else load
    slack = link_slack(load, topology.capacities_gbps)
    links = np.flatnonzero((load > 0) & (slack <= tolerance)) if cut_links is None else np.asarray(cut_links, dtype=int)
    return tuple(CutLink(int(link), float(slack[link])) for link in links)
