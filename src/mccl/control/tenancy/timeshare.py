"""TS (MCCS §3.3, after CASSINI): a prioritized job's idle windows, learned from its telemetry.

A training job alternates compute and communication with a steady period. MCCS
profiles the job offline and hard-codes the schedule (mccs-summary §4); here the
controller learns it from what the job reports while it runs: the start and end of
each of its collectives (in the simulator, the completed runs the closed-loop hook
sees; live, the telemetry samples' windows). From at least ``min_periods`` + 1
consecutive busy intervals it estimates

* the **period** — the median gap between consecutive collective starts (a job with
  several collectives per iteration should be observed per iteration: pass one
  interval per iteration, first start to last end);
* the **busy span** — the longest observed interval: the part of every period from
  its start during which the job communicates;
* the **guard band** — ``guard_s`` (the provider's margin: at least the time a borrower's
  send in flight takes to drain, since a gate holds sends but cannot recall one) plus the
  spread (max − min) of the observed starts' deviation from a strict period (from the
  nearest grid point, so an iteration missing from the telemetry costs nothing), so a late
  start stays clear of the borrowers.

The idle window is ``[busy + guard, period − guard)`` of every period, phase-locked to
the observed starts (the grid through the latest start, moved to their median phase).

One outlier tolerated: from ``OUTLIER_AFTER`` (8) intervals on, the single most deviant
start and the single longest span are left out of the guard band and the busy span. A job
descheduled for one iteration on a loaded host then costs that iteration some overlap with
the borrowers, rather than closing every window for the next 16 iterations (with max − min,
one start late by the idle time is enough; the live test once got no windows in 20
iterations at load average 28 on 2 cores); two outliers still close them. A gated job starts sends only inside it
(:class:`mccl.telemetry.SendWindows`, enforced by :mod:`mccl.sim.sendgate` and
:mod:`mccl.runtime.sendgate`). When the window is too short (under ``min_window_s``)
there is nothing to share: ``None``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from mccl.errors import ControllerError
from mccl.telemetry import SendWindows

__all__ = ["idle_windows", "OUTLIER_AFTER"]

OUTLIER_AFTER = 8  # from this many busy intervals on, the most deviant start and the longest span are left out


def idle_windows(busy: Sequence[tuple[float, float]], *, guard_s: float = 1e-3, min_periods: int = 3,
                 min_window_s: float = 1e-3) -> SendWindows | None:
    """The prioritized job's idle windows from its busy intervals ``(start_s, end_s)`` (module docstring)."""
    intervals = sorted((float(a), float(b)) for a, b in busy)
    for start, end in intervals:
        if not end > start:
            raise ControllerError(f"a busy interval must end after it starts, got ({start}, {end})")
    if guard_s < 0:
        raise ControllerError(f"guard band must be >= 0 s, got {guard_s}")
    if len(intervals) < min_periods + 1:
        return None
    starts = [start for start, _ in intervals]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    period = statistics.median(gaps)
    if period <= 0:
        return None
    spans = sorted(end - start for start, end in intervals)
    origin = starts[-1]
    # each start's deviation from the nearest point of the periodic grid through the latest start (nearest,
    # not the i-th: an iteration whose telemetry was lost must not read as a whole period of jitter); the grid
    # is then moved to the median phase, so a latest start that came late does not shift every window
    drift = [(start - origin + period / 2) % period - period / 2 for start in starts]
    center = statistics.median(drift)
    origin += center
    drift = sorted((d - center for d in drift), key=abs)
    if len(intervals) >= OUTLIER_AFTER:  # one outlier tolerated (module docstring)
        drift, spans = drift[:-1], spans[:-1]
    guard = guard_s + (max(drift) - min(drift))
    open_at, close_at = spans[-1] + guard, period - guard
    if close_at - open_at < min_window_s:
        return None
    return SendWindows(origin, period, ((open_at, close_at),))
