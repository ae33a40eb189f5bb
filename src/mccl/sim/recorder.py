"""Accumulators the engine feeds between two events: link bytes over time, path throughput.

Link utilization is kept in a bounded number of time bins whose width doubles
whenever the simulated time outgrows them (pairs of bins merge), so memory stays
``bins × links`` whether a run lasts a microsecond or a minute, and every byte is
counted exactly once.
"""

from __future__ import annotations

import math

import numpy as np

from mccl.sim.results import LinkUtilization

__all__ = ["UtilizationRecorder", "PathMeter"]

_FIRST_BIN_S = 1e-7


class UtilizationRecorder:
    """Link bytes per time bin, fed between two events; capacity is integrated only when it
    changes (rarely), so an event costs one vector update of the link bytes."""

    def __init__(self, n_links: int, bins: int, capacity: np.ndarray | None = None) -> None:
        self.bins = max(2, bins - bins % 2)
        self.width = _FIRST_BIN_S
        self.link_bytes = np.zeros((self.bins, n_links))
        self.capacity_bytes = np.zeros((self.bins, n_links))
        self.capacity = np.zeros(n_links) if capacity is None else np.array(capacity, dtype=float)
        self.capacity_since = 0.0  # self.capacity holds from then on, not yet in capacity_bytes
        self.end = 0.0

    def _grow(self, until: float) -> None:
        while until > self.bins * self.width:
            half = self.bins // 2
            for array in (self.link_bytes, self.capacity_bytes):
                array[:half] = array.reshape(half, 2, -1).sum(axis=1)
                array[half:] = 0.0
            self.width *= 2

    def _spread(self, target: np.ndarray, t0: float, t1: float, rates: np.ndarray) -> None:
        """Add ``rates`` (per second) over [t0, t1) into the bins of ``target``."""
        first = int(t0 // self.width)
        last = min(int(math.ceil(t1 / self.width)) - 1, self.bins - 1)
        if first == last:
            target[first] += rates * (t1 - t0)
            return
        for index in range(first, last + 1):
            overlap = min(t1, (index + 1) * self.width) - max(t0, index * self.width)
            if overlap > 0:
                target[index] += rates * overlap

    def add(self, t0: float, t1: float, rates: np.ndarray) -> None:
        """Links ran at ``rates`` (bytes/s) over [t0, t1)."""
        if t1 <= t0:
            return
        if t1 > self.bins * self.width:
            self._grow(t1)
        if t1 > self.end:
            self.end = t1
        self._spread(self.link_bytes, t0, t1, rates)

    def set_capacity(self, now: float, capacity: np.ndarray) -> None:
        """Capacities (bytes/s) from ``now`` on."""
        self._settle(now)
        self.capacity = np.array(capacity, dtype=float)

    def _settle(self, now: float) -> None:
        if now > self.capacity_since:
            self._grow(now)
            self._spread(self.capacity_bytes, self.capacity_since, now, self.capacity)
            self.capacity_since = now

    def result(self) -> LinkUtilization:
        self._settle(self.end)
        used = max(1, min(self.bins, int(math.ceil(self.end / self.width))))
        edges = np.arange(used + 1) * self.width
        edges[-1] = max(self.end, edges[-2]) if used > 0 else self.end
        return LinkUtilization(edges, self.link_bytes[:used].copy(), self.capacity_bytes[:used].copy())


class PathMeter:
    """Bytes and busy time per path (a job's GPU-to-GPU connection route) since the last read.

    Busy time counts the seconds in which the path had a flow sending, so
    ``bytes / busy`` is the rate the path achieved while in use — what mccl's
    passive measurement reports for a path (mccl-paper §5.1).
    """

    def __init__(self) -> None:
        self.keys: list[tuple[str, str, str, tuple[int, ...]]] = []
        self.index: dict[tuple[str, str, str, tuple[int, ...]], int] = {}
        self.bytes = np.zeros(0)
        self.busy = np.zeros(0)

    def path_id(self, job: str, src: str, dst: str, route: tuple[int, ...]) -> int:
        key = (job, src, dst, route)
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.keys)
            self.keys.append(key)
        return found

    def add(self, paths: np.ndarray, rates: np.ndarray, dt: float) -> None:
        if dt <= 0 or not len(paths):
            return
        size = len(self.keys)
        if len(self.bytes) < size:
            self.bytes = np.concatenate([self.bytes, np.zeros(size - len(self.bytes))])
            self.busy = np.concatenate([self.busy, np.zeros(size - len(self.busy))])
        self.bytes += np.bincount(paths, weights=rates * dt, minlength=size)
        self.busy[np.unique(paths)] += dt

    def read(self) -> list[tuple[tuple[str, str, str, tuple[int, ...]], float, float]]:
        """``(key, bytes, busy_s)`` of every path used since the last read; then reset."""
        used = np.flatnonzero(self.busy > 0)
        out = [(self.keys[i], float(self.bytes[i]), float(self.busy[i])) for i in used]
        self.bytes[:] = 0.0
        self.busy[:] = 0.0
        return out
