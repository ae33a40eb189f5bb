"""EWMA smoothing of overlay-link throughput (mccl-paper §3.2, "Schedule Manager").

Executors report raw samples; the controller keeps, per overlay link, an
exponentially weighted moving average ``M ← α·x + (1 − α)·M`` (the first sample
initializes it), which attenuates short microbursts so that only persistent
degradations move ``M`` far enough to trigger re-synthesis. A small α filters
longer bursts at the cost of slower detection (the paper's prototype: α = 0.012).

Overlay links of one communicator with n ranks (§3.3): ``inter[i, j]`` — the
point-to-point throughput of rank pair i → j across hosts; ``intra[i]`` — rank i's
cumulative injection rate into its host fabric. All rates in Gbit/s.

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
        n = self.n_ranks
        self.inter = np.full((n, n), np.nan)
        self.intra = np.full(n, np.nan)
        self.inter_count = np.zeros((n, n), dtype=np.int64)
        self.intra_count = np.zeros(n, dtype=np.int64)
        self.inter_reference = np.full((n, n), np.nan)
        self.intra_reference = np.full(n, np.nan)
        self.inter_seq = np.zeros((n, n), dtype=np.int64)  # seq of the collective last sampled, per overlay link
        self.intra_seq = np.zeros(n, dtype=np.int64)
        self.ignored = 0

    def update(self, kind: str, rank: int, peer: int, gbps: float, seq: int = 0) -> None:
        """Fold one sample in; samples with a bad rank, peer or rate are counted in ``ignored``.
        ``seq``: the collective it measured (kept per overlay link, for :meth:`fresh`)."""
        n = self.n_ranks
        if not (0 <= rank < n) or not np.isfinite(gbps) or gbps <= 0:
            self.ignored += 1
            return
        a = self.alpha
        if kind == INTER:
            if not (0 <= peer < n) or peer == rank:
                self.ignored += 1
                return
            old = self.inter[rank, peer]
            self.inter[rank, peer] = gbps if np.isnan(old) else a * gbps + (1 - a) * old
            self.inter_count[rank, peer] += 1
            self.inter_seq[rank, peer] = seq
            if self.inter_count[rank, peer] == self.warmup:
                self.inter_reference[rank, peer] = self.inter[rank, peer]
        elif kind == INTRA:
            old = self.intra[rank]
            self.intra[rank] = gbps if np.isnan(old) else a * gbps + (1 - a) * old
            self.intra_count[rank] += 1
            self.intra_seq[rank] = seq
            if self.intra_count[rank] == self.warmup:
                self.intra_reference[rank] = self.intra[rank]
        else:
            self.ignored += 1

    def update_many(self, samples: Iterable[Sample]) -> int:
        """Fold samples in arrival order (EWMA is order-dependent); returns how many were taken."""
        before = self.ignored
        count = 0
        for sample in samples:
            self.update(sample.kind, sample.rank, sample.peer, sample.gbps, sample.seq)
            count += 1
        return count - (self.ignored - before)

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
        return int(np.count_nonzero((self.inter_count > 0) & (self.inter_count < self.warmup))
                   + np.count_nonzero((self.intra_count > 0) & (self.intra_count < self.warmup)))

    @property
    def learned(self) -> int:
        """How many overlay links have a reference."""
        return int(np.count_nonzero(~np.isnan(self.inter_reference)) + np.count_nonzero(~np.isnan(self.intra_reference)))
