"""Each receiving NIC's rate while busy, against the rate it had when the version's references were learned:
the evidence of a repair that the swap back (:mod:`.opportunity`) reads first (issue 15).

Why not the per-path EWMA alone: a path's sample is its *share* of the receiving port's window, and the shares
follow TCP's sharing without fair queueing — measured on the emulated fabric (2026-12-01, seventh session, two
loaded runs, a sample pooled over one collective ÷ the path's reference over three): p90 1.09–1.40, p99 1.7–5.5,
2–16 % of them above 1 + Γ = 1.3 with nothing changing. An estimate quick enough to see a repair within a few
collectives would then see one every few collectives in the noise; the α = 0.15 EWMA that keeps the noise out
needs 4–8 samples of a path to move 1.3× (more where the repair speeds the path up by less than 2×, as on the
lightly loaded paths of a version made for the fault): the swap back did not fire within the 12 restored
collectives in four of six runs (sixth session). The sum of a window's samples, on the other hand, is the port's
own rate while it was busy (:mod:`mccl.runtime.windows`: the NIC's byte counter and its busy steps), within a few
per cent of the shaped rate (sixth session: −0.3…−1.8 %); measured in the same two runs, rank 0's NIC read
9.3–9.7 Mbit/s in every window of the fault and 16.5–20.6 before it and after the repair. A repair of that NIC
doubles it in the first collective after the repair.

What is kept, per receiving rank, for samples of pairs across hosts (the NIC; ``inter`` marks which pairs): the
pooled rate (Σ bytes ÷ Σ window seconds, each window's seconds counted once — the samples of one window share
them) of its windows in the version's reference window of collectives (the same one as the EWMA's, by sequence
number), and of its windows in the latest ``recent`` collectives after it. :meth:`PortLevels.factors`: recent ÷
reference per receiver (NaN where either is missing). On a fabric whose samples are one path per window (the
flow simulator), the same sums are the mean path rate into the receiver, compared with itself: still a ratio of
like with like.

Which physical links a receiver's factor stands for is the caller's (:func:`mccl.control.opportunity.port_links`:
the links every route into that receiver's NIC crosses).
"""

from __future__ import annotations

import numpy as np

from mccl.errors import ControllerError

__all__ = ["PortLevels"]


class PortLevels:
    """Per receiving rank: the pooled NIC rate in the reference window and in the latest ``recent`` collectives
    after it (module docstring). Not thread-safe: the manager folds under its lock."""

    def __init__(self, inter: np.ndarray, recent: int = 2) -> None:
        inter = np.asarray(inter, dtype=bool)
        if inter.ndim != 2 or inter.shape[0] != inter.shape[1]:
            raise ControllerError(f"the cross-host pair mask must be n x n, got shape {inter.shape}")
        if recent < 1:
            raise ControllerError(f"recent must be at least 1 collective, got {recent}")
        self.n_ranks = inter.shape[0]
        self.inter_flat = inter.reshape(-1).copy()
        self.recent = int(recent)
        self.reset()

    def reset(self) -> None:
        """Forget every window (a new version: its own reference, as the EWMA's)."""
        n = self.n_ranks
        self.reference_bytes = np.zeros(n)
        self.reference_seconds = np.zeros(n)
        self.reference_windows = np.zeros(n, dtype=np.int64)
        self._recent: list[dict[int, list[float]]] = [{} for _ in range(n)]  # seq -> [bytes, seconds]
        self._last_window: list[tuple[int, float] | None] = [None] * n  # a window split across batches counts once

    def add(self, overlay: np.ndarray, gbps: np.ndarray, seq: np.ndarray, seconds: np.ndarray,
            window_start: int, window_end: int) -> None:
        """Fold valid samples (flat overlay index, rate, seq, window seconds; arrival order) in: those of
        cross-host pairs, by receiver and window. ``[window_start, window_end)``: the reference window's
        collectives (an older straggler belongs to neither)."""
        n = self.n_ranks
        pair = overlay < n * n
        pick = np.flatnonzero(pair)
        pick = pick[self.inter_flat[overlay[pick]]]
        if len(pick) == 0:
            return
        receiver = overlay[pick] % n
        nbytes = gbps[pick] * seconds[pick]  # bytes × 8e-9: a common factor, the ratios drop it
        seqs, secs = seq[pick], seconds[pick]
        # one window: same receiver, seq and seconds, adjacent in arrival order per receiver
        order = np.lexsort((np.arange(len(pick)), receiver))
        r, q, s, b = receiver[order], seqs[order], secs[order], nbytes[order]
        new = np.r_[True, (r[1:] != r[:-1]) | (q[1:] != q[:-1]) | (s[1:] != s[:-1])]
        starts = np.flatnonzero(new)
        window_bytes = np.add.reduceat(b, starts)
        for index, start in enumerate(starts.tolist()):
            rank, collective, duration = int(r[start]), int(q[start]), float(s[start])
            key = (collective, duration)
            counted = 0.0 if self._last_window[rank] == key else duration
            self._last_window[rank] = key
            if window_start <= collective < window_end:
                self.reference_bytes[rank] += window_bytes[index]
                self.reference_seconds[rank] += counted
                self.reference_windows[rank] += counted > 0
            elif collective >= window_end >= 0:
                kept = self._recent[rank]
                if collective not in kept and len(kept) >= self.recent and collective < min(kept):
                    continue  # older than every kept collective
                entry = kept.setdefault(collective, [0.0, 0.0])
                entry[0] += window_bytes[index]
                entry[1] += counted
                while len(kept) > self.recent:
                    del kept[min(kept)]

    def rates(self) -> np.ndarray:
        """Per receiver: the pooled rate of its latest ``recent`` collectives (bytes × 8e-9 per second, the
        samples' own units), NaN until it spans ``recent`` collectives."""
        out = np.full(self.n_ranks, np.nan)
        for rank in range(self.n_ranks):
            kept = self._recent[rank]
            seconds = sum(entry[1] for entry in kept.values())
            if len(kept) >= self.recent and seconds > 0:
                out[rank] = sum(entry[0] for entry in kept.values()) / seconds
        return out

    def factors(self, min_windows: int = 2) -> np.ndarray:
        """Per receiver: the pooled rate of its latest ``recent`` collectives ÷ its reference; NaN unless the
        reference has ``min_windows`` windows and the recent part spans ``recent`` collectives."""
        known = (self.reference_windows >= min_windows) & (self.reference_seconds > 0) & (self.reference_bytes > 0)
        reference = np.where(known, self.reference_bytes / np.where(known, self.reference_seconds, 1.0), np.nan)
        return self.rates() / reference
