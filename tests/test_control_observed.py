"""The collective clock (:class:`mccl.control.observed.CollectiveClock`) on per-rank collective times recorded
on the emulated fabric: what one collective's time is, and why it is the slowest rank's."""

from __future__ import annotations

import statistics

import pytest

from mccl.control.observed import CollectiveClock
from mccl.schedule import Collective

# The AllToAll's "collective" samples of one run of tests/test_netemu.py's live loop (2026-12-02, ninth session,
# load 0.6–5.4, as the controller received them), seq 4–9 of version 1 — the settle window (seq 1–3) is not
# counted; seq 4–5 healthy, 6–9 with rank 0's NIC at half rate. Per seq: (rank, seconds it reported in ms, the
# wall clock at its completion in ms from the first completion of seq 4). The healthy ranks finish in two groups
# ~100 ms apart (their launches lie within 12 ms), the degraded ones evenly.
RECORDED = {
    4: [(4, 367.0, 0.0), (0, 373.2, 9.1), (7, 372.7, 17.6), (6, 399.1, 34.1), (5, 401.6, 42.2), (2, 521.5, 159.0),
        (1, 510.8, 150.2), (3, 517.5, 161.7)],
    5: [(4, 348.9, 2026.9), (0, 367.2, 2044.6), (5, 378.0, 2042.8), (7, 381.4, 2046.9), (6, 374.5, 2053.0),
        (1, 422.2, 2086.5), (2, 432.5, 2102.3), (3, 436.4, 2103.2)],
    6: [(1, 620.5, 3715.8), (5, 626.2, 3724.6), (6, 668.4, 3782.8), (2, 693.0, 3800.9), (4, 708.4, 3815.4),
        (7, 722.6, 3816.9), (0, 733.6, 3845.1), (3, 755.7, 3849.1)],
    7: [(1, 595.9, 9939.3), (5, 613.1, 9958.1), (6, 653.1, 9999.4), (2, 681.5, 10024.5), (4, 688.4, 10036.8),
        (7, 692.6, 10036.8), (0, 719.0, 10066.1), (3, 730.6, 10073.9)],
    8: [(1, 579.2, 12369.8), (5, 592.0, 12378.7), (6, 657.5, 12429.7), (2, 684.7, 12456.9), (7, 700.0, 12483.3),
        (4, 707.9, 12482.0), (0, 724.9, 12497.8), (3, 714.9, 12498.2)],
    9: [(1, 586.4, 13986.5), (5, 592.9, 13993.9), (6, 653.7, 14041.7), (2, 684.7, 14071.9), (7, 680.9, 14083.2),
        (4, 693.8, 14082.4), (3, 716.1, 14115.1), (0, 732.7, 14119.3)],
}
KEEP = 3  # the live loop's warmup: the reference is the median of seq 4–6


def _launch_aligned_s(seq: int) -> float:
    """The collective's time from its last rank's launch to its last rank's completion (one machine's clock: the
    emulated fabric's ranks share it), seconds: what the collective took once every rank was in it."""
    ends = [end for _, _, end in RECORDED[seq]]
    starts = [end - ms for _, ms, end in RECORDED[seq]]
    return (max(ends) - max(starts)) / 1e3


def test_the_clocks_observed_slowdown_is_the_collectives_on_recorded_ranks():
    """The observed change the guard divides by (now over reference) is the collective's: within 3 % of the
    launch-aligned one on the recorded AllToAll. By the median over ranks (before) it read 1.71x against 1.39x,
    and the guard found the fabric that predicted 1.31x "unexplained" (r 0.75) and kept the faulty schedule."""
    clock = CollectiveClock(alpha=1.0, keep=KEEP)  # the live loop's alpha_level 1.0: now = the last collective
    for seq, ranks in RECORDED.items():
        for _rank, ms, _end in ranks:
            clock.add("alltoall", 1, seq, ms / 1e3, n_ranks=8)
    clock.add("alltoall", 1, 10, 0.6, n_ranks=8)  # a later seq closes seq 9
    reference, now = clock.observed(Collective.ALLTOALL, 1)
    aligned = statistics.median(_launch_aligned_s(seq) for seq in sorted(RECORDED)[:KEEP])
    assert now / reference == pytest.approx(_launch_aligned_s(9) / aligned, rel=0.03)
    assert reference == pytest.approx(0.5215)  # seq 4's slowest rank: the median of 521.5, 436.4, 755.7 ms


def test_a_collectives_time_is_its_slowest_ranks_and_a_late_launch_does_not_shorten_it():
    """A rank that launched late reports a shorter time; the collective's stays its slowest rank's. A
    collective closed by a later one (not every rank reported) is the slowest of the ranks it has."""
    clock = CollectiveClock(alpha=1.0, keep=1)
    for seconds in (0.50, 0.52, 0.31):  # the third rank launched 0.2 s late
        clock.add("allgather", 1, 1, seconds, n_ranks=3)
    assert clock.last(Collective.ALLGATHER, 1) == pytest.approx(0.52)
    clock.add("allgather", 1, 2, 0.4, n_ranks=3)
    clock.add("allgather", 1, 2, 0.45, n_ranks=3)
    clock.add("allgather", 1, 3, 0.1, n_ranks=3)  # closes seq 2 with two ranks
    assert clock.last(Collective.ALLGATHER, 1) == pytest.approx(0.45)
    assert clock.observed(Collective.ALLGATHER, 1) == (pytest.approx(0.52), pytest.approx(0.45))
