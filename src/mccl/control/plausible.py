"""Which telemetry samples could have been measured at all: a receiving port's rate against its peers'.

Why: the runtime times a receive-side window from its first exactly-timed arrival to its last
(:mod:`mccl.runtime.telemetry`); when a receive that had arrived meanwhile is noticed right after
the first, the window lasts a fraction of a millisecond and carries a whole chunk. On the emulated
fabric (2026-12-01, fourth session) ~10 % of the AllGather's inter samples read 5–150× the NIC's
shaped rate (windows of 0.2–3 ms where the others last 30–170 ms), and some pairs' samples were
mostly such windows. A pair whose reference is learned from them reads "degraded" as soon as a
real sample comes, and the drift test blamed links no fault touched (the post-repair swap into a
schedule made for a slow gpu1 downlink).

The test, scale-free (the controller does not know whether the fabric runs at 400 Gbit/s or
20 Mbit/s): the samples of one window (same receiver, kind, end time and duration) add up to the
rate of the receiving port while it was saturated, and no port of a kind (NIC, host fabric) can
receive much faster than the others of that kind — they have the same capacity on the fabrics
mccl builds. A window whose port rate exceeds ``factor`` (4) × the median of the last ``history``
windows of its kind is dropped (counted as ignored). Faults only lower port rates, and a repair
brings a port back to its peers' rate, so neither is filtered; the first ``min_history`` windows of
a kind pass unchecked (the median needs them).
"""

from __future__ import annotations

import numpy as np

__all__ = ["PortRates"]


class PortRates:
    """Recent port rates per sample kind (0 inter, 1 intra) and the screen of the module docstring."""

    def __init__(self, *, factor: float = 4.0, history: int = 256, min_history: int = 16) -> None:
        self.factor = float(factor)
        self.history = int(history)
        self.min_history = int(min_history)
        self._recent: dict[int, np.ndarray] = {0: np.empty(0), 1: np.empty(0)}
        self.dropped = 0

    def typical(self, kind: int) -> float | None:
        """The median port rate of the last windows of ``kind`` (None while fewer than ``min_history``)."""
        recent = self._recent.get(kind)
        return float(np.median(recent)) if recent is not None and len(recent) >= self.min_history else None

    def screen(self, kind: np.ndarray, rank: np.ndarray, peer: np.ndarray, end: np.ndarray, seconds: np.ndarray,
               gbps: np.ndarray) -> np.ndarray:
        """Which samples to keep (bool per sample); remembers the kept windows' port rates."""
        count = len(kind)
        keep = np.ones(count, dtype=bool)
        if count == 0:
            return keep
        receiver = np.where(peer >= 0, peer, -2 - rank)  # an aggregate (peer -1) is a window of its own
        port = receiver.astype(np.int64) * 4 + kind  # (receiver, kind) as one key (kind: -1, 0 or 1)
        order = np.lexsort((end, port))  # a window's samples share their end (and duration): adjacent
        p, e, s = port[order], end[order], seconds[order]
        new = np.r_[True, (p[1:] != p[:-1]) | (e[1:] != e[:-1]) | (s[1:] != s[:-1])]
        k = kind[order]
        starts = np.flatnonzero(new)
        rate = np.add.reduceat(np.where(np.isfinite(gbps[order]), gbps[order], 0.0), starts)  # per window
        window_kind = k[starts]
        window_keep = np.ones(len(starts), dtype=bool)
        for code in (0, 1):
            mine = window_kind == code
            if not mine.any():
                continue
            typical = self.typical(code)
            if typical is not None:
                window_keep[mine] = rate[mine] <= self.factor * typical
            kept = rate[mine & window_keep]
            self._recent[code] = np.concatenate([self._recent[code], kept])[-self.history:]
        per_sample = np.repeat(window_keep, np.diff(np.r_[starts, count]))
        keep[order] = per_sample
        self.dropped += int(count - np.count_nonzero(keep))
        return keep
