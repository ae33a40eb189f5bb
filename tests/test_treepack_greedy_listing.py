"""The greedy's live-arc listing (one compiled pass) against the numpy formula it replaced (issue 17)."""

from __future__ import annotations

import numpy as np

from mccl.synth.treepack.growkernel import FastGrower, _starts


def test_live_listing_matches_numpy_gather_on_random_graphs() -> None:
    """Same arcs, same relative order, same CSR offsets by tail and by head, for random residuals (some
    ranks with no arc at all, some with every arc spent)."""
    rng = np.random.default_rng(7)
    for n, arcs in ((1, 0), (5, 12), (40, 600), (64, 3000)):
        tails = rng.integers(0, max(n - 1, 1), arcs).astype(np.int64)
        heads = rng.integers(0, n, arcs).astype(np.int64)
        grower = FastGrower(n, tails, heads, latency_aware=False)
        for spent in (0.0, 0.5, 1.0):
            residual = rng.integers(1, 5, arcs).astype(np.int64)
            residual[rng.random(arcs) < spent] = 0
            grower._refresh(residual)
            live = residual > 0
            by_tail = grower.all_by_tail[live[grower.all_by_tail]]
            by_head = grower.all_by_head[live[grower.all_by_head]]
            assert np.array_equal(grower.by_tail, by_tail)
            assert np.array_equal(grower.by_head, by_head)
            assert np.array_equal(grower.start, _starts(tails, by_tail, n))
            assert np.array_equal(grower.head_start, _starts(heads, by_head, n))
