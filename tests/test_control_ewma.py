"""EWMA smoothing of overlay links (mccl-paper §3.2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mccl.control.ewma import OverlayEWMA
from mccl.errors import ControllerError
from mccl.telemetry import Sample


def test_ewma_by_hand():
    ewma = OverlayEWMA(4, 0.25, warmup=2)
    ewma.update("inter", 0, 2, 8.0)  # first sample initializes
    assert ewma.inter[0, 2] == 8.0 and np.isnan(ewma.inter_reference[0, 2])
    ewma.update("inter", 0, 2, 4.0)  # 0.25·4 + 0.75·8 = 7, the warm-up's last: reference 7
    assert ewma.inter[0, 2] == pytest.approx(7.0) and ewma.inter_reference[0, 2] == pytest.approx(7.0)
    ewma.update("inter", 0, 2, 0.0 + 3.5)  # 0.25·3.5 + 0.75·7 = 6.125
    inter, intra = ewma.factors()
    assert inter[0, 2] == pytest.approx(6.125 / 7.0) and np.isnan(inter[2, 0]) and np.all(np.isnan(intra))
    ewma.update("intra", 3, -1, 10.0)
    ewma.update("intra", 3, -1, 10.0)
    assert ewma.factors()[1][3] == pytest.approx(1.0) and ewma.learned == 2


def test_bad_samples_are_counted_not_used():
    ewma = OverlayEWMA(2, 0.5)
    for kind, rank, peer, gbps in (("inter", 5, 0, 1.0), ("inter", 0, 0, 1.0), ("inter", 0, 1, float("nan")),
                                   ("inter", 0, 1, -1.0), ("bogus", 0, 1, 1.0)):
        ewma.update(kind, rank, peer, gbps)
    assert ewma.ignored == 5 and np.all(np.isnan(ewma.inter))
    taken = ewma.update_many([Sample("inter", "c", 0, 1, 1000, 1e-6, 0.0, 1),
                              Sample("inter", "c", 9, 1, 1000, 1e-6, 0.0, 1)])
    assert taken == 1 and ewma.inter[0, 1] == pytest.approx(8.0)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5])
def test_alpha_out_of_range_is_named(alpha):
    with pytest.raises(ControllerError, match="alpha"):
        OverlayEWMA(4, alpha)


@given(alpha=st.floats(0.01, 1.0), level=st.floats(0.1, 100.0), step=st.floats(0.05, 0.95), k=st.integers(1, 50))
def test_step_response_is_geometric(alpha, level, step, k):
    """After a step from ``level`` to ``step·level``, k samples leave (1-α)^k of the gap: the
    detection-latency law the benchmark measures."""
    ewma = OverlayEWMA(2, alpha, warmup=1)
    ewma.update("inter", 0, 1, level)
    for _ in range(k):
        ewma.update("inter", 0, 1, step * level)
    expected = step * level + (1 - alpha) ** k * (1 - step) * level
    assert ewma.inter[0, 1] == pytest.approx(expected, rel=1e-9)
    assert ewma.factors()[0][0, 1] == pytest.approx(expected / level, rel=1e-9)


def test_a_batch_folds_exactly_as_samples_one_by_one():
    """update_arrays (the manager's vectorized ingest) gives the state update() gives per sample, in
    arrival order: repeated overlay links (several collectives in one batch), invalid samples, warm-up."""
    rng = np.random.default_rng(3)
    n, count = 6, 400
    kinds = rng.choice(["inter", "intra", "bogus"], count, p=[0.7, 0.28, 0.02])
    ranks = rng.integers(-1, n + 1, count)
    peers = rng.integers(-1, n + 1, count)
    rates = np.where(rng.random(count) < 0.03, 0.0, rng.uniform(1.0, 20.0, count))
    seqs = np.sort(rng.integers(1, 30, count))
    one, batch = OverlayEWMA(n, 0.3, warmup=3), OverlayEWMA(n, 0.3, warmup=3)
    for kind, rank, peer, rate, seq in zip(kinds, ranks, peers, rates, seqs, strict=True):
        one.update(str(kind), int(rank), int(peer), float(rate), int(seq))
    overlay = np.array([batch.overlay_index(str(k), int(r), int(p)) for k, r, p in zip(kinds, ranks, peers, strict=True)])
    taken = batch.update_arrays(overlay, rates, seqs)
    assert taken == count - one.ignored and batch.ignored == one.ignored > 0
    for name in ("value", "count", "reference", "last_seq"):
        np.testing.assert_array_equal(getattr(batch, name), getattr(one, name))
    assert batch.count.max() > 3  # some links were folded in several rounds


def test_per_peer_intra_samples_take_the_pair_slot():
    """An intra sample with peer >= 0 is the path rank -> peer on one host: the pair's slot, as an inter
    sample's; peer -1 stays the rank's aggregate injection; the vectorized intake maps them alike."""
    from mccl.control.intake import Batch

    ewma = OverlayEWMA(4, 0.5, warmup=1)
    assert ewma.overlay_index("intra", 1, 2) == 1 * 4 + 2 == ewma.overlay_index("inter", 1, 2)
    assert ewma.overlay_index("intra", 1, -1) == 4 * 4 + 1
    assert ewma.overlay_index("intra", 1, 1) == -1 and ewma.overlay_index("intra", 1, 4) == -1
    ewma.update("intra", 1, 2, 6.0)
    assert ewma.inter[1, 2] == 6.0 and np.all(np.isnan(ewma.intra))
    rng = np.random.default_rng(5)
    samples = [Sample(str(rng.choice(["inter", "intra", "bogus"])), "c", int(rng.integers(-1, 5)),
                      int(rng.integers(-2, 5)), 1000, 1e-6, 0.0, 1) for _ in range(300)]
    expected = [ewma.overlay_index(s.kind, s.rank, s.peer) for s in samples]
    assert Batch.of(samples).overlay(4).tolist() == expected
