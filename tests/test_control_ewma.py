"""EWMA smoothing of overlay links (mccl-paper §3.2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mccl.control.ewma import OverlayEWMA
from mccl.errors import ControllerError
from mccl.telemetry import Sample


def test_ewma_by_hand():
    """References over a window of ``warmup`` collectives (pooled rate), then a plain EWMA from there."""
    ewma = OverlayEWMA(4, 0.25, warmup=2)
    ewma.update("inter", 0, 2, 8.0, seq=5)  # the window: collectives 5 and 6
    assert ewma.inter[0, 2] == 8.0 and np.isnan(ewma.inter_reference[0, 2]) and ewma.learning == 1
    ewma.update("inter", 0, 2, 4.0, seq=6)
    assert np.isnan(ewma.inter_reference[0, 2]) and ewma.learned == 0
    ewma.update("inter", 0, 2, 3.5, seq=7)  # closes the window: reference (8 + 4) / 2 = 6, then 0.25·3.5 + 0.75·6
    assert ewma.inter_reference[0, 2] == pytest.approx(6.0) and ewma.learning == 0
    assert ewma.inter[0, 2] == pytest.approx(0.25 * 3.5 + 0.75 * 6.0)
    inter, intra = ewma.factors()
    assert inter[0, 2] == pytest.approx(5.375 / 6.0) and np.isnan(inter[2, 0]) and np.all(np.isnan(intra))
    ewma.update("intra", 3, -1, 10.0, seq=8)  # after the window: no reference for this version
    assert np.isnan(ewma.factors()[1][3]) and ewma.learned == 1


def test_a_link_sampled_late_gets_no_reference_and_holds_nothing_up():
    """The regression of 2026-12-01 (AllGather on the emulated fabric): a pair sampled once in the window
    learned its reference from samples taken after the fault started, and while it was learning no
    decision was taken. Now it gets no reference for the version, and ``learning`` is 0 once the window
    closed; a pair sampled often enough is referenced from the window's samples only."""
    ewma = OverlayEWMA(8, 0.15, warmup=3)
    for seq in (4, 5, 6):
        ewma.update("inter", 7, 0, 18.0, seq=seq)  # every collective
    ewma.update("inter", 4, 7, 40.0, seq=5)  # once in the window
    assert ewma.learning == 2 and ewma.learned == 0
    for seq in range(7, 12):  # the fault: both paths at a third
        ewma.update("inter", 7, 0, 6.0, seq=seq)
        ewma.update("inter", 4, 7, 13.0, seq=seq)
    assert ewma.learning == 0 and ewma.learned == 1
    assert ewma.inter_reference[7, 0] == pytest.approx(18.0) and np.isnan(ewma.inter_reference[4, 7])
    assert ewma.factors()[0][7, 0] < 0.7  # the fault shows (1/3 + 0.85^5 · 2/3 = 0.63) instead of being absorbed
    assert ewma.min_samples == 2 and OverlayEWMA(8, 0.15, warmup=4).min_samples == 2


def test_a_short_window_moves_the_rate_by_its_bytes_not_its_rate():
    """A window of 0.3 ms carrying one 64 KiB chunk (5–150× the NIC's rate, ~10 % of the AllGather's inter
    samples on the emulated fabric) is weighted by its duration: it adds its bytes, not its rate — the pair's
    rate moves by about 1/(1 − α) (one chunk where a window carries one), not by 90×."""
    ewma = OverlayEWMA(2, 0.15, warmup=1)
    chunk_bits = 65536 * 8 / 1e9
    ewma.update("inter", 0, 1, chunk_bits / 0.026, seq=1, weight=0.026)  # 20 Mbit/s over 26 ms
    ewma.update("inter", 0, 1, chunk_bits / 0.026, seq=2, weight=0.026)
    healthy = ewma.inter[0, 1]
    ewma.update("inter", 0, 1, chunk_bits / 0.0003, seq=3, weight=0.0003)  # ~1750 Mbit/s
    assert ewma.inter[0, 1] / healthy < 1.0 / (1 - 0.15) + 0.01
    plain = OverlayEWMA(2, 0.15, warmup=1)  # the same rates unweighted: the EWMA of rates jumps
    for seq, rate in ((1, chunk_bits / 0.026), (2, chunk_bits / 0.026), (3, chunk_bits / 0.0003)):
        plain.update("inter", 0, 1, rate, seq=seq)
    assert plain.inter[0, 1] / healthy > 10


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


# No deadline: the law checked is arithmetic (the value after k samples), not speed; an example folds up to
# 51 samples one call each (~5 ms idle) and under load a descheduled process overran hypothesis' 200 ms.
@settings(deadline=None)
@given(alpha=st.floats(0.01, 1.0), level=st.floats(0.1, 100.0), step=st.floats(0.05, 0.95), k=st.integers(1, 50))
def test_step_response_is_geometric(alpha, level, step, k):
    """After a step from ``level`` to ``step·level``, k samples leave (1-α)^k of the gap: the
    detection-latency law the benchmark measures."""
    ewma = OverlayEWMA(2, alpha, warmup=1)
    ewma.update("inter", 0, 1, level, seq=1)  # the reference window: collective 1
    for index in range(k):
        ewma.update("inter", 0, 1, step * level, seq=2 + index)
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
    seqs[[40, 41]] = seqs[[41, 40]]  # a straggler: arrival order is not quite seq order
    weights = np.where(rng.random(count) < 0.02, -1.0, rng.uniform(1e-4, 0.2, count))
    one, batch = OverlayEWMA(n, 0.3, warmup=3), OverlayEWMA(n, 0.3, warmup=3)
    for kind, rank, peer, rate, seq, weight in zip(kinds, ranks, peers, rates, seqs, weights, strict=True):
        one.update(str(kind), int(rank), int(peer), float(rate), int(seq), float(weight))
    overlay = np.array([batch.overlay_index(str(k), int(r), int(p)) for k, r, p in zip(kinds, ranks, peers, strict=True)])
    taken = batch.update_arrays(overlay, rates, seqs, weights)
    assert taken == count - one.ignored and batch.ignored == one.ignored > 0
    for name in ("value", "count", "reference", "last_seq"):
        np.testing.assert_allclose(getattr(batch, name), getattr(one, name), rtol=1e-12)
    assert batch.learned > 0 and batch.window_closed
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


def test_a_batch_is_its_samples_field_by_field():
    """``Batch.of`` (one pass per field) holds each sample's fields, as ``np.array`` of each column would;
    a field of the wrong type raises, for the manager to fold the good samples one by one."""
    from mccl.control.intake import Batch

    rng = np.random.default_rng(11)
    for tags in (["alltoall"], ["", "allgather", "alltoall"]):
        samples = [Sample(str(rng.choice(["inter", "intra", "collective", "bogus"])), "c", int(rng.integers(-1, 9)),
                          int(rng.integers(-2, 9)), int(rng.integers(0, 1 << 40)), float(rng.random()),
                          float(rng.random() * 1e9), int(rng.integers(0, 50)), str(rng.choice(tags)),
                          int(rng.integers(-1, 4))) for _ in range(500)]
        batch = Batch.of(samples)
        code = {"inter": 0, "intra": 1, "collective": 2}
        assert batch.kind.tolist() == [code.get(s.kind, -1) for s in samples]
        for field, name in (("rank", "rank"), ("peer", "peer"), ("nbytes", "bytes"), ("seconds", "seconds"),
                            ("end", "end_time"), ("seq", "seq"), ("tag", "collective"), ("version", "version")):
            assert getattr(batch, field).tolist() == [getattr(s, name) for s in samples], field
        assert batch.tag.dtype.kind == "U"
    with pytest.raises((TypeError, ValueError)):
        Batch.of([Sample("inter", "c", 0, 1, "many", 0.01, 0.0, 5)])
