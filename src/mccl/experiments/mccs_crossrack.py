"""MCCS §2: the cross-rack ratio of NCCL's rank-order rings on random placements (``mccs-crossrack``).

A job of H hosts on a spine-leaf with 2 hosts per rack (as in Meta's trace; 8 GPUs per
host). Placement (assumed; the summary gives only the outcome): **packed** — a
locality-aware scheduler gives the job H/2 whole racks, drawn at random, but the ranks
follow a random host order (the order NCCL chains hosts in, MCCS Fig. 2); a host's 8 ranks
are contiguous, as launchers number them. For contrast, **scattered**: H hosts drawn
uniformly from the whole fabric. The ratio is the cross-rack hops of NCCL's ring over those
of the locality-aware ring (:func:`mccl.synth.ring.cross_rack_ratio`). MCCS reports up to 2×
in the trace; with 2 hosts per rack the locality ring crosses racks once per rack it spans
and a ring crosses at most at every host boundary, so 2 is also the ceiling: a packed job's
random order reaches 2 (1 − 1/(H − 1)) on average.
"""

from __future__ import annotations

import random
import statistics

from mccl.experiments.mccs_common import Comparison, ComparisonReport, fmt_row
from mccl.synth.ring import cross_rack_ratio
from mccl.topology import spine_leaf

__all__ = ["cross_rack"]


def cross_rack(*, racks: int = 32, job_hosts: tuple[int, ...] = (4, 8, 16, 32), placements: int = 500,
               seed: int = 16) -> ComparisonReport:
    """``mccs-crossrack`` (module docstring)."""
    fabric = spine_leaf(racks, 2, 8, 4, 800, 800)
    hosts = [[f"gpu{8 * h + g}" for g in range(8)] for h in range(2 * racks)]
    rng = random.Random(seed)
    detail = []
    worst = 1.0
    for layout in ("packed", "scattered"):
        for size in job_hosts:
            ratios = []
            for _ in range(placements):
                if layout == "packed":
                    chosen = [2 * rack + h for rack in rng.sample(range(racks), size // 2) for h in (0, 1)]
                    rng.shuffle(chosen)
                else:
                    chosen = rng.sample(range(len(hosts)), size)  # random hosts, in a random order
                ranks = [gpu for h in chosen for gpu in hosts[h]]
                ratios.append(cross_rack_ratio(fabric, ranks))
            if layout == "packed":
                worst = max(worst, max(ratios))
            detail.append(fmt_row(layout, size, statistics.fmean(ratios), statistics.median(ratios), max(ratios)))
    return ComparisonReport("mccs-crossrack", f"MCCS §2 cross-rack ratio of NCCL's ring, random placements, 2 hosts "
                            f"per rack ({placements} per job size, {racks} racks)",
                            (Comparison("worst cross-rack ratio (packed)", worst, 2.0),), tuple(detail),
                            ("placement", "job hosts", "mean ratio", "median", "max"),
                            ("packed: H/2 whole racks at random, hosts in random rank order; scattered: H hosts "
                             "uniformly; 8 GPUs per host, a host's ranks contiguous",))
