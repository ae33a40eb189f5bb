"""EWMA smoothing of overlay-link throughput (mccl-paper §3.2, "Schedule Manager").

Executors report raw samples; the controller keeps, per overlay link, an
exponentially weighted moving average ``M ← α·x + (1 − α)·M`` (the first sample
initializes it), which attenuates short microbursts so that only persistent
degradations move ``M`` far enough to trigger re-synthesis. A small α filters
longer bursts at the cost of slower detection (the paper's prototype: α = 0.012).

Overlay links of one communicator with n ranks (§3.3): ``inter[i, j]`` — the
point-to-point throughput of the path rank i → rank j (sender → receiver, whichever end
measured it): an ``"inter"`` sample of a pair across hosts, or a per-peer ``"intra"``
sample (``peer`` ≥ 0) of a pair on one host; ``intra[i]`` — rank i's cumulative injection
rate into its host fabric (an ``"intra"`` sample with ``peer`` = -1, the aggregate the
runtime emitted before per-peer samples). All rates in Gbit/s. Why per-peer intra samples
share the pair slots: a same-host pair and a cross-host pair are both one path, and the
measured topology (:func:`mccl.control.drift.overlay_map`) maps each slot onto the links of
that pair's routes.

Each overlay link also learns a *reference*: its smoothed value once it has seen
``warmup`` samples (at start-up, on the healthy fabric — the paper's initial
probing, §3.1). The controller compares later values with it (``factors``), so its
decisions do not depend on the absolute speed of the fabric (loopback in the demo,
NVLink/RDMA on GPUs), only on relative change. The state is plain numpy arrays;
:meth:`reset` starts over — the manager does so whenever a new schedule version takes
over, because a pair's rate depends on the schedule as much as on the fabric (see
:mod:`mccl.control.manager`, "References per version").
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from mccl.errors import ControllerError
from mccl.telemetry import INTER, INTRA, Sample

__all__ = ["INTER", "INTRA", "OverlayEWMA", "Sample"]

class OverlayEWMA:
    """Smoothed throughput of every overlay link of one communicator (see module docstring)."""

    def __init__(self, n_ranks: int, alpha: float, *, warmup: int = 3) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ControllerError(f"the EWMA smoothing factor alpha must be in (0, 1], got {alpha}")
        if n_ranks < 2:
            raise ControllerError(f"a communicator needs at least 2 ranks, got {n_ranks}")
        if warmup < 1:
            raise ControllerError(f"warmup must be at least 1 sample, got {warmup}")
        self.n_ranks = n_ranks
        self.alpha = float(alpha)
        self.warmup = int(warmup)
        self.reset()

    def reset(self) -> None:
        """Forget everything. The state is one flat array per quantity over the n·n + n overlay links
        (inter pair (i, j) at ``i·n + j``, rank i's injection at ``n·n + i``, as
        :class:`mccl.control.drift.OverlayMap` numbers them); ``inter`` / ``intra`` and the other
        per-kind names are views into it, so a batch folds in with one vectorized pass."""
        n = self.n_ranks
        size = n * n + n
        self.value = np.full(size, np.nan)
        self.count = np.zeros(size, dtype=np.int64)
        self.reference = np.full(size, np.nan)
        self.last_seq = np.zeros(size, dtype=np.int64)  # seq of the collective last sampled, per overlay link
        self.inter, self.intra = self.value[:n * n].reshape(n, n), self.value[n * n:]
        self.inter_count, self.intra_count = self.count[:n * n].reshape(n, n), self.count[n * n:]
        self.inter_reference, self.intra_reference = self.reference[:n * n].reshape(n, n), self.reference[n * n:]
        self.inter_seq, self.intra_seq = self.last_seq[:n * n].reshape(n, n), self.last_seq[n * n:]
        self.ignored = 0

    def overlay_index(self, kind: str, rank: int, peer: int) -> int:
        """The flat overlay-link index of a sample, or -1 if its kind, rank or peer is not valid."""
        n = self.n_ranks
        if not 0 <= rank < n:
            return -1
        if kind == INTER or (kind == INTRA and peer != -1):  # one path rank -> peer
            return rank * n + peer if 0 <= peer < n and peer != rank else -1
        return n * n + rank if kind == INTRA else -1

    def update(self, kind: str, rank: int, peer: int, gbps: float, seq: int = 0) -> None:
        """Fold one sample in; samples with a bad rank, peer or rate are counted in ``ignored``.
        ``seq``: the collective it measured (kept per overlay link, for :meth:`fresh`)."""
        index = self.overlay_index(kind, rank, peer)
        if index < 0 or not np.isfinite(gbps) or gbps <= 0:
            self.ignored += 1
            return
        old = self.value[index]
        self.value[index] = gbps if np.isnan(old) else self.alpha * gbps + (1 - self.alpha) * old
        self.count[index] += 1
        self.last_seq[index] = seq
        if self.count[index] == self.warmup:
            self.reference[index] = self.value[index]

    def update_arrays(self, overlay: np.ndarray, gbps: np.ndarray, seq: np.ndarray) -> int:
        """Fold a batch in, vectorized: ``overlay`` the flat index of each sample (-1: not valid),
        its rate and seq, in arrival order. The same result as :meth:`update` per sample, in order:
        samples of distinct overlay links commute, so the batch is folded in rounds, round k taking
        every overlay link's k-th sample (one round per collective the batch spans). Returns how many
        were taken; the others are counted in ``ignored``."""
        overlay = np.asarray(overlay, dtype=np.int64)
        gbps = np.asarray(gbps, dtype=float)
        seq = np.asarray(seq, dtype=np.int64)
        valid = (overlay >= 0) & (overlay < len(self.value)) & np.isfinite(gbps) & (gbps > 0)
        self.ignored += int(len(overlay) - np.count_nonzero(valid))
        overlay, gbps, seq = overlay[valid], gbps[valid], seq[valid]
        if len(overlay) == 0:
            return 0
        order = np.argsort(overlay, kind="stable")
        ordered = overlay[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        occurrence = np.empty(len(overlay), dtype=np.int64)  # k: how many earlier samples of the same link
        occurrence[order] = np.arange(len(overlay)) - np.repeat(starts, np.diff(np.r_[starts, len(overlay)]))
        a = self.alpha
        for k in range(int(occurrence.max()) + 1):
            pick = np.flatnonzero(occurrence == k)
            index, x = overlay[pick], gbps[pick]
            old = self.value[index]
            self.value[index] = np.where(np.isnan(old), x, a * x + (1 - a) * old)
            self.count[index] += 1
            self.last_seq[index] = seq[pick]
            learned = index[self.count[index] == self.warmup]
            self.reference[learned] = self.value[learned]
        return len(overlay)

    def update_many(self, samples: Iterable[Sample]) -> int:
        """Fold samples in arrival order (EWMA is order-dependent); returns how many were taken."""
        rows = [(self.overlay_index(s.kind, s.rank, s.peer), s.gbps, s.seq) for s in samples]
        if not rows:
            return 0
        overlay, gbps, seq = zip(*rows, strict=True)
        return self.update_arrays(np.array(overlay), np.array(gbps, dtype=float), np.array(seq))

    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """``(inter, intra)``: current value / reference per overlay link; NaN where not yet learned."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.inter / self.inter_reference, self.intra / self.intra_reference

    def fresh(self, after_seq: int) -> tuple[np.ndarray, np.ndarray]:
        """``(inter, intra)``: which overlay links were sampled in a collective after ``after_seq``."""
        return self.inter_seq > after_seq, self.intra_seq > after_seq

    @property
    def learning(self) -> int:
        """How many overlay links have samples but no reference yet (0 < count < warmup).

        Why: right after a reset (a new schedule version), a decision on the few links already
        learned would compare a partial picture; the manager waits until this is 0."""
        return int(np.count_nonzero((self.count > 0) & (self.count < self.warmup)))

    @property
    def learned(self) -> int:
        """How many overlay links have a reference."""
        return int(np.count_nonzero(~np.isnan(self.reference)))
