"""The rate of one receiving port's window, from its receives' arrival times (pure: no clock, no threads).

A window (:mod:`mccl.runtime.telemetry`) is a stretch of time in which receives through one port (the
NIC, or the host fabric) were in flight; what it knows of each receive is its sender, its size and the
time its last byte arrived, when that time is known (:mod:`mccl.runtime.arrivals`). The question is the
port's rate **while it was busy**, and two things make "bytes ÷ duration" wrong:

* **When a transfer started is not known at the receiver** (gloo says nothing before the last byte).
  Hence the dispersion of arrivals: from the first known arrival ``f`` to the last ``l``, count the bytes
  that arrived after ``f``. Concurrent transfers through the port are merged this way (the port's rate,
  whoever sent), and the first transfer's unknown start drops out.
* **A sender that has nothing to send** — a relay waiting for its own input, the PXN AllToAll's rail peer
  waiting for the data it forwards — leaves the port idle inside ``[f, l]``, and the port reads slow
  (measured on the emulated fabric: the degraded AllToAll's window took in a 16 ms wait of its only
  sender: −10 %). A receiver cannot tell an idle sender from a slow link in one interval, but **within
  one sender's sequence** it can: one sender's messages cross its connection one after another, so the
  time between two consecutive arrivals from it is the later message's transfer time — plus any time
  the sender had nothing to send. An interval much slower (below ``gap_factor`` × the median of that
  sender's intervals; at least ``min_intervals`` of them) holds an idle gap: its excess over the median
  pace is idle time, and the port was idle then unless another sender's transfer was in progress
  (another sender's interval covers it). Idle time is taken out of ``l − f``.

**With the NIC's counter** (the NIC's received bytes, read right after each stamped arrival and every
few ms while the window is open: :mod:`mccl.runtime.telemetry`) the window needs neither rule's guess.
The bytes between the first and the last known arrival are what the counter moved (a concurrent
transfer's bytes that had arrived before ``f`` are not in it), and the busy time is that of the steps
between readings in which the port moved traffic (:func:`_counted_rate`). Measured on the emulated
fabric (2026-12-01, fifth session): the healthy AllGather's window took in 25 ms of its port waiting
for two relays between the first arrival and the next — invisible to arrival times (one interval),
plain in the counter.

Why not more without a counter: a single interval's rate is meaningless across senders (concurrent transfers arrive
partly before an interval starts: a span between two close arrivals can read many times the port's
rate, measured on the degraded AllGather), so only the whole window's dispersion and one sender's own
sequence are used. An arrival of unknown time noticed after ``f`` is counted and ends the window no
earlier than its notice (it arrived before; without waiter threads, as on a loopback transport, most
arrivals are such: leaving them out read a paced pair at a third of its rate). With the counter they
need no rule: the counter has their bytes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Arrival", "PortRate", "port_rate", "GAP_FACTOR", "MIN_INTERVALS"]

GAP_FACTOR = 0.8
MIN_INTERVALS = 3
FIXED_POINT_STEPS = 32
MIN_STEP_S = 0.010  # ≥ 8 packets of 1514 B at 10 Mbit/s (the emulated fabric's degraded NIC)
IDLE_FACTOR = 0.8
OWN_TRAFFIC = 0.5  # a counter that grew by more than 2x the window's payload counts others' traffic too


@dataclass(frozen=True)
class Arrival:
    """One completed receive: ``peer`` sent ``nbytes``; its last byte arrived at ``at`` (None: unknown)."""


    peer: int
    nbytes: int
    at: float | None
    counted: int | None = None  # the port's byte counter right after ``at`` (mccl.runtime.arrivals)
    noticed: float | None = None  # when the executor found it complete (a bound on an unknown ``at``)


@dataclass(frozen=True)
class PortRate:
    """The port's bytes per sender counted in the window, over ``seconds`` of busy time; ``idle_s``: the
    idle time taken out of the dispersion (``last − first − seconds``)."""

    per_peer: dict[int, int]
    seconds: float
    idle_s: float


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covered(start: float, end: float, spans: list[tuple[float, float]]) -> float:
    """How much of ``[start, end]`` the (merged, disjoint) ``spans`` cover."""
    return sum(max(0.0, min(end, e) - max(start, s)) for s, e in spans)


def port_rate(arrivals: Sequence[Arrival], *, gap_factor: float = GAP_FACTOR,
              min_intervals: int = MIN_INTERVALS, base: int | None = None,
              readings: Sequence[tuple[float, int]] = (), wire_share: float | None = None) -> PortRate | None:
    """The busy rate of one port's window (module docstring); None with fewer than two known arrivals.
    ``base``: the port's byte counter when the window opened; with it and every known arrival's
    ``counted``, the counter decides (:func:`_counted_rate`), with ``readings`` — (time, counter) taken
    in between by the meters' sampler — as further points. ``wire_share``: payload per counted byte of a
    full-size data packet (:func:`mccl.runtime.arrivals.nic_payload_share`); None: the window's own
    payload over the counter's growth."""
    known = sorted((a for a in arrivals if a.at is not None), key=lambda a: a.at)
    if len(known) < 2:
        return None
    first, last = known[0].at, known[-1].at
    if last <= first:
        return None
    per_peer: dict[int, int] = {}
    for arrival in known[1:]:
        per_peer[arrival.peer] = per_peer.get(arrival.peer, 0) + arrival.nbytes
    if base is not None and all(a.counted is not None for a in known):
        counted = _counted_rate(arrivals, known, per_peer, base, readings, wire_share)
        if counted is not None:
            return counted
    for arrival in arrivals:  # unknown times noticed after the first: counted, the window ends no earlier
        if arrival.at is None and arrival.noticed is not None and arrival.noticed > first:
            per_peer[arrival.peer] = per_peer.get(arrival.peer, 0) + arrival.nbytes
            last = max(last, arrival.noticed)
    intervals: dict[int, list[tuple[float, float, int]]] = {}
    previous: dict[int, float] = {}
    for arrival in known:
        if arrival.peer in previous:
            intervals.setdefault(arrival.peer, []).append((previous[arrival.peer], arrival.at, arrival.nbytes))
        previous[arrival.peer] = arrival.at
    idle = 0.0
    unknown = {a.peer for a in arrivals if a.at is None}  # their bytes lie between known arrivals: no pace
    for peer, mine in intervals.items():
        paced = [(start, end, nbytes) for start, end, nbytes in mine if end > start]
        if len(paced) < min_intervals or peer in unknown:
            continue
        pace = statistics.median(nbytes / (end - start) for start, end, nbytes in paced)  # bytes/s while sending
        others = _merged([(s, e) for other, spans in intervals.items() if other != peer for s, e, _ in spans])
        for start, end, nbytes in paced:
            if nbytes / (end - start) < gap_factor * pace:
                gap_end = end - nbytes / pace  # the transfer took its median time at the end of the interval
                idle += (gap_end - start) - _covered(start, gap_end, others)
    seconds = (last - first) - idle
    if seconds <= 0:
        return None
    return PortRate(per_peer, seconds, idle)


def _steps(points: list[tuple[float, int]], min_step_s: float) -> list[tuple[float, int]]:
    """(seconds, counter growth) between the points, each step at least ``min_step_s`` long (the last one
    may be shorter): a step of a few packets reads their count's rounding, not the port."""
    steps: list[tuple[float, int]] = []
    start_t, start_c = points[0]
    for t, c in points[1:]:
        if t - start_t >= min_step_s * (1 - 1e-9):
            steps.append((t - start_t, max(0, c - start_c)))
            start_t, start_c = t, c
    if points[-1][0] > start_t:
        steps.append((points[-1][0] - start_t, max(0, points[-1][1] - start_c)))
    return steps


def _counted_rate(arrivals: Sequence[Arrival], known: list[Arrival], per_peer: dict[int, int], base: int,
                  readings: Sequence[tuple[float, int]], wire_share: float | None = None) -> PortRate | None:
    """The port's rate from its byte counter (module docstring, "With the NIC's counter").

    Bytes: the counter's growth from the first known arrival to the last (every packet in between, whoever
    sent it, and none from before). Busy time: over steps of at least :data:`MIN_STEP_S` between the points
    (arrivals and ``readings``), the fixed point ``R = bytes / Σ busy_i``, where a step that moved less than
    :data:`IDLE_FACTOR` × R × its length was busy only ``bytes_i / R`` of it (the rest idle, or the port
    underfed: its senders waited, or sent at the pace of a link of theirs shared with other flows) and any
    other step all of it. So R is the port's rate while it carried traffic at its pace — its capacity once it
    was saturated at all in the window.

    **The largest such R**: the iteration starts at the fastest step and descends to the first fixed point.
    Why: started from the window's average (as until the sixth session), it stopped at the lowest one, and
    where the port was underfed most of the window — the healthy AllGather on the emulated fabric, where
    the senders' uplinks each carry two flows, so rank 0's downlink ran at 0.4–0.7 of its rate for most steps
    and at its rate in one or two — the underfed steps counted as busy and the port read 15–31 % low
    (BENCHMARKS.md, 2026-12-01 sixth session).

    In payload bytes: ``R × wire_share`` (what the port carries as payload while it carries data only:
    headers out, the ACKs of this rank's own sends not charged to it — they share the port's time, so
    scaling by the window's own payload ÷ growth read 1–3 % below the shaped goodput whenever this rank
    was sending too); without a ``wire_share``, that window's payload ÷ growth."""
    first, last = known[0], known[-1]
    grown = last.counted - base
    carried = last.counted - first.counted
    if grown <= 0 or carried <= 0:
        return None
    payload = sum(a.nbytes for a in arrivals if a.at is None or a.at <= last.at)
    if payload < OWN_TRAFFIC * grown:
        return None  # the NIC carried much more than this window's receives: not this rank's own NIC
    points = sorted([(a.at, a.counted) for a in known] +
                    [(t, c) for t, c in readings if first.at < t < last.at])
    steps = [(dt, moved) for dt, moved in _steps(points, MIN_STEP_S) if dt > 0]
    span = last.at - first.at
    whole = [moved / dt for dt, moved in steps if dt >= MIN_STEP_S * (1 - 1e-9)]
    rate = max(whole) if whole else carried / span  # the fastest step: from above, to the largest fixed point
    for _ in range(FIXED_POINT_STEPS):  # R = the mean rate of the steps at ≥ IDLE_FACTOR × R; descends, settles
        busy_steps = [(dt, moved) for dt, moved in steps if moved >= IDLE_FACTOR * rate * dt]
        full_s, full_bytes = sum(dt for dt, _ in busy_steps), sum(moved for _, moved in busy_steps)
        if full_s <= 0 or full_bytes <= 0:
            return None
        updated = full_bytes / full_s
        if updated >= rate * (1 - 1e-12):
            break
        rate = updated
    busy = sum(dt if moved >= IDLE_FACTOR * rate * dt else moved / rate for dt, moved in steps)
    port_payload_rate = rate * (wire_share if wire_share else payload / grown)  # bytes/s of payload while busy
    counted = sum(per_peer.values())
    if counted <= 0 or port_payload_rate <= 0:
        return None
    seconds = counted / port_payload_rate  # so that the window's samples add up to the port's rate
    return PortRate(per_peer, seconds, max(0.0, span - busy))
