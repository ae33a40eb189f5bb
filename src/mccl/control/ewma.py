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

Samples are weighted by their window's duration (``seconds``): the EWMA keeps ``α``-smoothed bytes
and seconds, and its value is their ratio (bytes over time, the throughput of the path). Why:
a receive-side window that closed a fraction of a millisecond after it opened (two receives
noticed back to back) carries one chunk over almost no time — on the emulated fabric ~10 % of
the AllGather's inter samples read 5–150× the NIC's shaped rate (2026-12-01, fourth session,
BENCHMARKS.md). Averaged as rates, one such sample moved a pair's EWMA by tens of times its
value; weighted by its duration, it adds its bytes and almost no time (a rise of about
1/(1 − α) where it carries as many bytes as a normal window). A caller that has no
durations (``weight`` 1) gets the plain EWMA ``M ← α·x + (1 − α)·M`` of the paper. Once a link
has a reference, a sample weighs at most as much as the link's mean window in the reference
window: a slow window (a microburst) is then folded as in the plain EWMA, not amplified by its
length (measured: uncapped, the 16-GPU AllToAll of the fluid loop swapped on a microburst).

Each overlay link also learns a *reference*: its rate over a **window of ``warmup``
collectives** (by sequence number), from the first collective sampled after a reset — at
start-up, on the healthy fabric (the paper's initial probing, §3.1). The window closes when a
sample of a later collective arrives: every link sampled at least ``min_samples`` times in it
(default ⌈warmup/2⌉) gets the window's pooled rate (Σ bytes / Σ seconds) as its reference and
its EWMA restarts there; a link sampled less often gets no reference for this version and is
left out of decisions (its factor stays NaN). Why a window in collectives and not the first
``warmup`` samples of each link: receive-side samples are a pair's share of its receiving
port's window, so some pairs of a tree packing are sampled once in several collectives; their
``warmup``-th sample came after the fault had started (measured: pair 0 → 4 learned its
reference in the first degraded collective, 4 → 7 one collective after the repair), so the
reference absorbed the fault, and while any link was still learning the manager took no
decision at all (the AllGather's fault went undetected for its whole duration). The
controller compares later values with the references (``factors``), so its decisions do not
depend on the absolute speed of the fabric (loopback in the demo, NVLink/RDMA on GPUs), only on
relative change. The state is plain numpy arrays; :meth:`reset` starts over — the manager does
so whenever a new schedule version takes over, because a pair's rate depends on the schedule as
much as on the fabric (see :mod:`mccl.control.manager`, "References per version").

With :meth:`OverlayEWMA.track_ports`, the same samples also feed each receiving NIC's pooled rate in the
reference window and in the latest collectives (:mod:`.portlevel`): the evidence of a repair that the swap back
reads first, because a port's window is far less noisy than a path's share of it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from mccl.control.portlevel import PortLevels
from mccl.errors import ControllerError
from mccl.telemetry import INTER, INTRA, Sample

__all__ = ["INTER", "INTRA", "OverlayEWMA", "Sample"]

class OverlayEWMA:
    """Smoothed throughput of every overlay link of one communicator (see module docstring)."""

    def __init__(self, n_ranks: int, alpha: float, *, warmup: int = 3, min_samples: int | None = None) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ControllerError(f"the EWMA smoothing factor alpha must be in (0, 1], got {alpha}")
        if n_ranks < 2:
            raise ControllerError(f"a communicator needs at least 2 ranks, got {n_ranks}")
        if warmup < 1:
            raise ControllerError(f"warmup must be at least 1 collective, got {warmup}")
        self.min_samples = (warmup + 1) // 2 if min_samples is None else int(min_samples)
        if self.min_samples < 1:
            raise ControllerError(f"min_samples must be at least 1, got {min_samples}")
        self.n_ranks = n_ranks
        self.alpha = float(alpha)
        self.warmup = int(warmup)
        self.ports: PortLevels | None = None
        self.reset()

    def track_ports(self, inter: np.ndarray, recent: int = 2) -> None:
        """Keep each receiving NIC's pooled rate too (:mod:`.portlevel`); ``inter``: n × n, which pairs
        cross hosts (their samples measured the receiver's NIC)."""
        self.ports = PortLevels(inter, recent)

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
        self._rate_weight = np.zeros(size)  # α-smoothed rate × weight and weight (value = their ratio)
        self._weight = np.zeros(size)
        self._typical = np.zeros(size)  # a referenced link's mean window duration in its reference window
        self.inter, self.intra = self.value[:n * n].reshape(n, n), self.value[n * n:]
        self.inter_count, self.intra_count = self.count[:n * n].reshape(n, n), self.count[n * n:]
        self.inter_reference, self.intra_reference = self.reference[:n * n].reshape(n, n), self.reference[n * n:]
        self.inter_seq, self.intra_seq = self.last_seq[:n * n].reshape(n, n), self.last_seq[n * n:]
        self.ignored = 0
        self.window_start = -1  # first collective of the reference window (-1: nothing sampled yet)
        self.window_closed = False
        self._window_sum = np.zeros(size)  # Σ rate × weight, Σ weight and how many samples, in the window
        self._window_weight = np.zeros(size)
        self._window_count = np.zeros(size, dtype=np.int64)
        if self.ports is not None:
            self.ports.reset()

    @property
    def window_end(self) -> int:
        """The first collective after the reference window (-1 before any sample)."""
        return self.window_start + self.warmup if self.window_start >= 0 else -1

    def overlay_index(self, kind: str, rank: int, peer: int) -> int:
        """The flat overlay-link index of a sample, or -1 if its kind, rank or peer is not valid."""
        n = self.n_ranks
        if not 0 <= rank < n:
            return -1
        if kind == INTER or (kind == INTRA and peer != -1):  # one path rank -> peer
            return rank * n + peer if 0 <= peer < n and peer != rank else -1
        return n * n + rank if kind == INTRA else -1

    def update(self, kind: str, rank: int, peer: int, gbps: float, seq: int = 0, weight: float = 1.0) -> None:
        """Fold one sample in; samples with a bad rank, peer, rate or weight are counted in ``ignored``.
        ``seq``: the collective it measured (the reference window, :meth:`fresh`); ``weight``: its
        window's duration (module docstring; 1: a plain EWMA of rates)."""
        self.update_arrays(np.array([self.overlay_index(kind, rank, peer)]), np.array([gbps], dtype=float),
                           np.array([seq]), np.array([weight], dtype=float))

    def update_arrays(self, overlay: np.ndarray, gbps: np.ndarray, seq: np.ndarray,
                      weight: np.ndarray | None = None) -> int:
        """Fold a batch in, vectorized: ``overlay`` the flat index of each sample (-1: not valid),
        its rate, seq and weight (None: 1 each), in arrival order. The same result as :meth:`update`
        per sample, in order: the samples before the first one of a collective past the reference
        window go into the window, the window closes, the rest follow; samples of distinct overlay
        links commute, so each part is folded in rounds, round k taking every overlay link's k-th
        sample. Returns how many were taken; the others are counted in ``ignored``."""
        overlay = np.asarray(overlay, dtype=np.int64)
        gbps = np.asarray(gbps, dtype=float)
        seq = np.asarray(seq, dtype=np.int64)
        weight = np.ones(len(overlay)) if weight is None else np.asarray(weight, dtype=float)
        valid = (overlay >= 0) & (overlay < len(self.value)) & np.isfinite(gbps) & (gbps > 0) \
            & np.isfinite(weight) & (weight > 0)
        self.ignored += int(len(overlay) - np.count_nonzero(valid))
        overlay, gbps, seq, weight = overlay[valid], gbps[valid], seq[valid], weight[valid]
        if len(overlay) == 0:
            return 0
        split = 0  # where the samples after the reference window begin
        if not self.window_closed and self.window_start < 0:
            self.window_start = int(seq[0])
        if self.ports is not None:
            self.ports.add(overlay, gbps, seq, weight, self.window_start, self.window_end)
        if not self.window_closed:
            past = np.flatnonzero(seq >= self.window_end)
            split = int(past[0]) if len(past) else len(overlay)
            head = slice(0, split)
            in_window = np.flatnonzero(seq[head] >= self.window_start)  # an older straggler is not the window's
            np.add.at(self._window_sum, overlay[in_window], gbps[in_window] * weight[in_window])
            np.add.at(self._window_weight, overlay[in_window], weight[in_window])
            np.add.at(self._window_count, overlay[in_window], 1)
            self._fold(overlay[head], gbps[head], seq[head], weight[head])
            if split < len(overlay):
                self._close_window()
        if split < len(overlay):
            self._fold(overlay[split:], gbps[split:], seq[split:], weight[split:])
        return len(overlay)

    def _fold(self, overlay: np.ndarray, gbps: np.ndarray, seq: np.ndarray, weight: np.ndarray) -> None:
        """The EWMA of bytes and of seconds per overlay link, in rounds (see :meth:`update_arrays`)."""
        count = len(overlay)
        if count == 0:
            return
        order = np.argsort(overlay, kind="stable")
        ordered = overlay[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        sizes = np.diff(np.r_[starts, count])
        occurrence = np.empty(count, dtype=np.int64)  # k: how many earlier samples of the same link
        occurrence[order] = np.arange(count) - np.repeat(starts, sizes)
        typical = self._typical[overlay]  # no more than a typical window's weight: a slow window is not louder
        weight = np.where(typical > 0, np.minimum(weight, typical), weight)
        rate_weight = gbps * weight
        first = (occurrence == 0) & (self.count[overlay] == 0)
        a = self.alpha
        for k in range(int(occurrence.max()) + 1):
            pick = np.flatnonzero(occurrence == k) if k else np.flatnonzero(occurrence == 0)
            index, fresh = overlay[pick], first[pick]
            self._rate_weight[index] = np.where(fresh, rate_weight[pick],
                                                a * rate_weight[pick] + (1 - a) * self._rate_weight[index])
            self._weight[index] = np.where(fresh, weight[pick], a * weight[pick] + (1 - a) * self._weight[index])
        links = ordered[starts]
        self.value[links] = self._rate_weight[links] / self._weight[links]
        self.count[links] += sizes
        self.last_seq[links] = seq[order[starts + sizes - 1]]  # each link's last sample in arrival order

    def _close_window(self) -> None:
        """References from the window (module docstring); the EWMA of a referenced link restarts there."""
        self.window_closed = True
        learned = self._window_count >= self.min_samples
        self.reference[learned] = self._window_sum[learned] / self._window_weight[learned]
        self.value[learned] = self.reference[learned]
        mean_weight = self._window_weight[learned] / self._window_count[learned]
        self._typical[learned] = mean_weight
        self._weight[learned] = mean_weight
        self._rate_weight[learned] = self.reference[learned] * mean_weight

    def update_many(self, samples: Iterable[Sample]) -> int:
        """Fold samples in arrival order (EWMA is order-dependent), each weighted by its duration;
        returns how many were taken."""
        rows = [(self.overlay_index(s.kind, s.rank, s.peer), s.gbps, s.seq, s.seconds) for s in samples]
        if not rows:
            return 0
        overlay, gbps, seq, seconds = zip(*rows, strict=True)
        return self.update_arrays(np.array(overlay), np.array(gbps, dtype=float), np.array(seq),
                                  np.array(seconds, dtype=float))

    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """``(inter, intra)``: current value / reference per overlay link; NaN where not yet learned."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.inter / self.inter_reference, self.intra / self.intra_reference

    def fresh(self, after_seq: int) -> tuple[np.ndarray, np.ndarray]:
        """``(inter, intra)``: which overlay links were sampled in a collective after ``after_seq``."""
        return self.inter_seq > after_seq, self.intra_seq > after_seq

    @property
    def learning(self) -> int:
        """How many overlay links have samples while the reference window is still open (0 once it
        closed: a link sampled too rarely in it has no reference and never holds decisions up).

        Why: right after a reset (a new schedule version), a decision on the few links already
        learned would compare a partial picture; the manager waits until this is 0."""
        return 0 if self.window_closed else int(np.count_nonzero(self.count))

    @property
    def learned(self) -> int:
        """How many overlay links have a reference."""
        return int(np.count_nonzero(~np.isnan(self.reference)))
