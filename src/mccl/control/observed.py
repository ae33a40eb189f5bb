"""What the ranks report about whole collectives, for the guard (:mod:`.guard`): their observed times
(:class:`CollectiveClock`, from ``"collective"`` samples) and the job's collective size (:class:`SizeMeter`,
from the bytes of path samples; :func:`size_from_bytes`). Split from :mod:`.guard`, which predicts and
chooses; this module only keeps what was observed."""

from __future__ import annotations

import math
import statistics

import numpy as np

from mccl.errors import ControllerError
from mccl.schedule import Collective, Schedule

__all__ = ["CollectiveClock", "SizeMeter", "size_from_bytes"]


def size_from_bytes(schedule: Schedule, bytes_moved: float) -> float:
    """nccl-tests S of a collective whose transfers moved ``bytes_moved`` in all (telemetry: the
    bytes of one sequence number). Every transfer moves its chunk's fraction of a block of S/n bytes,
    so S = n · bytes / Σ fractions. The runtime reports saturated windows only, so this is a lower bound."""
    weight = float(np.sum(schedule.chunks.fraction[schedule.transfers.chunk]))
    if not (weight > 0 and bytes_moved > 0):
        raise ControllerError("cannot infer a collective's size from no transfers or no bytes")
    return schedule.n_ranks * bytes_moved / weight


class CollectiveClock:
    """The observed times of a communicator's collectives, from the ranks' ``"collective"`` samples
    (:class:`~mccl.telemetry.Sample`), per (collective tag, schedule version); untagged samples are
    one series ("", -1) that the manager forgets when a new version takes over.

    One collective's time is the slowest rank's (the longest time a rank reported for it): the collective is
    done when its last rank is, and that is the time the guard's predictor (the schedule's makespan) stands
    for. It counts once every rank has reported it, or once a later collective of the series has been seen
    (ranks report asynchronously; a late report of a counted collective is dropped).

    Why not the median over the ranks (before the ninth session): the ranks of one collective finish at
    times set by the schedule, not by noise — on the emulated fabric the healthy AllToAll's 8 ranks
    finished in two groups ~100 ms apart (367–402 ms and 511–522 ms, launches within 12 ms), the degraded
    one's evenly (620–756 ms) — so the median fell in the healthy gap and moved with how many ranks were in
    each group, while the slowest rank's time did not: the observed slowdown read 1.71x by the median
    against 1.41x by the slowest rank and 1.39x launch-aligned (the last launch to the last completion),
    and the guard called a fabric that predicted 1.31x "unexplained" (r 0.75) and kept the faulty schedule
    (BENCHMARKS.md, 2026-12-02; over 6 runs the first flag's r was 0.70–0.98 by the median, 0.81–1.11 by the
    slowest rank on the same collectives). A rank that launches late is no concern for the slowest rank's time
    (its own is the shorter); an early one's wait for the others is counted, which the launch skew bounds
    (4–33 ms measured there, against 400–900 ms collectives). The price: one rank held up (measured: two ranks
    +150 ms in a collective during which the controller synthesized and pushed a candidate) moves the
    collective's time where it moved the median little — as it moves the collective.
    ``reference``: the median of a version's first ``keep`` collectives (the manager passes its
    ``warmup``: the telemetry references are learned over the same collectives); ``now``: an EWMA of
    its collectives with factor ``alpha`` — the manager passes the factor of the estimate its measured
    fabric is taken from (``alpha_level``, else ``alpha``), so observed and measured cover one window.
    The ranks' reported size S (the sample's ``bytes``) is kept too (:meth:`size`)."""

    def __init__(self, alpha: float = 1.0, keep: int = 3) -> None:
        if keep < 1 or not 0.0 < alpha <= 1.0:
            raise ControllerError(f"the collective clock needs keep >= 1 and alpha in (0, 1], got {keep}, {alpha}")
        self.alpha = alpha
        self.keep = keep
        self._open: dict[tuple[str, int], tuple[int, list[float] | None]] = {}  # None: that seq is counted
        self._first: dict[tuple[str, int], list[float]] = {}
        self._now: dict[tuple[str, int], float] = {}
        self._last: dict[tuple[str, int], float] = {}  # the last counted collective's time, unsmoothed
        self._closed: dict[tuple[str, int], int] = {}  # the seq of the last counted collective
        self._size: dict[str, float] = {}  # tag -> the last reported size S

    def size(self, collective: Collective) -> float | None:
        """The size S the ranks last reported for ``collective`` (tagged, else untagged samples), or None."""
        return self._size.get(collective.value, self._size.get(""))

    def add(self, tag: str, version: int, seq: int, seconds: float, n_ranks: int, size_bytes: float = 0.0) -> None:
        """One rank's time of collective ``seq`` (of ``n_ranks`` ranks); ``size_bytes``: its size S as reported."""
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        if size_bytes > 0 and math.isfinite(size_bytes):
            self._size[tag] = float(size_bytes)
        key = (tag, version if tag else -1)
        current = self._open.get(key)
        if current is None or seq > current[0]:
            if current is not None and current[1]:
                self._close(key, current[1], current[0])
            current = self._open[key] = (seq, [])
        times = current[1]
        if seq == current[0] and times is not None:  # an older seq arriving late is dropped
            times.append(seconds)
            if len(times) >= n_ranks:
                self._close(key, times, seq)
                self._open[key] = (seq, None)

    def _close(self, key: tuple[str, int], times: list[float], seq: int) -> None:
        self._closed[key] = seq
        value = max(times)
        first = self._first.setdefault(key, [])
        if len(first) < self.keep:
            first.append(value)
        self._last[key] = value
        previous = self._now.get(key)
        self._now[key] = value if previous is None else self.alpha * value + (1.0 - self.alpha) * previous

    def observed(self, collective: Collective, version: int) -> tuple[float, float] | None:
        """(reference, now) seconds of ``version`` of ``collective`` (tagged samples, else untagged ones),
        or None until ``keep`` of its collectives have been counted."""
        for key in ((collective.value, version), ("", -1)):
            first = self._first.get(key)
            if first is not None and len(first) == self.keep:
                return statistics.median(first), self._now[key]
        return None

    def counted_through(self, collective: Collective, version: int) -> int:
        """The sequence number of the last collective of ``version`` counted (tagged, else untagged samples);
        -1 before any."""
        return self._closed.get((collective.value, version), self._closed.get(("", -1), -1))

    def last(self, collective: Collective, version: int) -> float | None:
        """The time of the last counted collective of ``version`` (tagged samples only), or None."""
        return self._last.get((collective.value, version))

    def forget_untagged(self) -> None:
        """A new version took over: untagged samples from now on measure it, not the old one."""
        for table in (self._open, self._first, self._now, self._last, self._closed):
            table.pop(("", -1), None)


class SizeMeter:
    """The job's collective size from telemetry: the bytes of one sequence number, summed over every
    sample (per collective tag; "" for untagged samples), converted by :func:`size_from_bytes`.
    Only a sequence number that is complete (a later one has been seen) counts."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[int, float]] = {}  # tag -> (seq being summed, bytes so far)
        self._last: dict[str, float] = {}  # tag -> bytes of the last complete seq

    def add(self, tag: str, seq: int, nbytes: float) -> None:
        seq_open, total = self._open.get(tag, (seq, 0.0))
        if seq > seq_open:
            self._last[tag] = total
            seq_open, total = seq, 0.0
        if seq == seq_open:
            self._open[tag] = (seq_open, total + nbytes)

    def add_many(self, tag: str, seqs: np.ndarray, nbytes: np.ndarray) -> None:
        """:meth:`add` for a batch of one tag in arrival order, vectorized: the open seq is the running
        maximum, a sample counts iff its seq equals it, and each open seq's bytes are summed."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if len(seqs) == 0:
            return
        seq_open, total = self._open.get(tag, (int(seqs[0]), 0.0))
        running = np.maximum.accumulate(np.concatenate([[seq_open], seqs]))[1:]
        counted = np.where(seqs == running, np.asarray(nbytes, dtype=float), 0.0)
        values, first = np.unique(running, return_index=True)  # running never decreases: sorted groups
        sums = np.add.reduceat(counted, first)
        if values[0] == seq_open:
            sums[0] += total
        else:
            self._last[tag] = total
        if len(values) > 1:
            self._last[tag] = float(sums[-2])
        self._open[tag] = (int(values[-1]), float(sums[-1]))

    def bytes_of(self, collective: Collective) -> float | None:
        """Bytes moved by the last complete collective of this kind (tagged), else of any (untagged)."""
        return self._last.get(collective.value, self._last.get(""))
