"""The link that slowed the collective, read at the traffic it carries now (issue 11: never worse than what
it replaces).

Why. The measured topology (:func:`mccl.control.drift.measured_capacities`) is scale-free: a link's
capacity is its base times the best factor among the paths through it, which is exact only if those
paths were bound by that link when their references were learned. An executor that runs a schedule
below its bound leaves every link headroom, so a link that lost more than its paths did reads too fast.
Measured (flow simulator, 16 GPUs, Fail1 AllGather): the tree packing runs at ~0.49 of its bound, GPU 0's
NVLink egress (true 800 Gbit/s) reads 1530–1630, and the schedule made for that fabric is a predicted tie
that runs 3–7 % slower than the one it replaces on the true fabric. The schedule's own link loads cannot
see that headroom (by them the link is on the bottleneck, u = 0.997: the sixth session's reverted
attempt); what can is the collective's observed time in absolute units: a link carries
``load_a · S / n`` bytes per collective, so over an observed time ``T`` it carried on average
``traffic_a = load_a · S / n / T`` — never more than its capacity (a lower bound, exact for a link busy
the whole collective, as the one a fault made the bottleneck is). At the reference the same quantity over
the base capacity is the link's absolute utilisation (the LP's utilisation times the executor's
efficiency: 0.49 for that NVLink).

The reading (:func:`saturated_reading`). When the collective itself slowed beyond the drift threshold
(its observed time now over its reference > 1 + Γ: a capacity was lost on its critical links, not only
shuffled between paths), each clearly slowed path (factor < 1/(1 + Γ)) names one culprit: among the links
of its routes that the scale-free reading already believes degraded (below base/(1 + Γ)), the one with
the highest absolute utilisation at the reference. A culprit whose paths slowed as much as the
collective did (its scale-free factor times the collective's slowdown within Γ of 1: it paces the
collective) is read at the traffic it carries now, never above the scale-free reading: the larger of
``traffic_a`` over the observed time now and its reference traffic times its scale-free factor (they agree
for such a link). A culprit whose paths slowed far more or less than the collective keeps the scale-free
reading: it does not set the collective's time, so its traffic says little of its capacity (measured,
Fail3: GPU 0's NIC ingress, true 100, carries 7 over the collective's time; a version made for a reading of
it this low finds its paths faster than its base and is flagged again within the same fault — a third swap).
Measured at Fail1's first flag: GPU 0's NVLink egress 1631 → 807 (true 800), its ingress 926 → 807 (800).
Why only then: after a repair the fault's version speeds up as a whole while some of its paths slow by
contention (gpu7's NIC read at 101–125 of 400 by the reverted rule, which broke the swap back); the gate
on the collective's own time keeps those out. Why only suspects: a link the scale-free reading exonerates
was seen at full speed by some path; its traffic now is no estimate of its capacity.

Units. The rule needs the samples' and collective times' units to be the topology's (the flow simulator
and the per-path rate model: the topology is the fabric). The emulated fabric runs at 1/20000 of its
topology's units and the live runtime at whatever the hardware gives, so it is off unless the executor
says so (``ControlConfig.absolute_rates``). Even then, rates in larger units are refused (a link's
reference traffic above its base capacity by more than Γ cannot be), and rates in smaller units (the
emulated fabric's) would read every culprit far too slow, a fabric that predicts a slowdown nobody observes:
:func:`adopted` keeps the scale-free reading unless the read fabric explains the collective's observed
time within Γ, and better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from mccl.control.config import ControlConfig
from mccl.control.drift import OverlayMap
from mccl.control.ewma import OverlayEWMA
from mccl.control.guard import Guard
from mccl.control.records import _Communicator
from mccl.errors import ControllerError, MCCLError
from mccl.schedule import Collective, Schedule
from mccl.topology import Topology

__all__ = ["SaturatedReading", "adopted", "saturated_for", "saturated_reading", "traffic_gbps"]


@dataclass(frozen=True)
class SaturatedReading:
    """The capacities after the reading, which links were read at their traffic (culprits, link ids), and why
    nothing was read when nothing was (``reason``: "" when the reading applied). ``judged``: what
    :func:`adopted` needs to check it against the collective's observed time (set by :func:`saturated_for`):
    the active schedule, its version, the size S, the observed (reference, now) s and its base (None: nominal)."""

    capacities_gbps: np.ndarray
    culprits: np.ndarray
    reason: str = ""
    judged: tuple[Schedule, int, float, tuple[float, float], np.ndarray | None] | None = None


def traffic_gbps(load: np.ndarray, size_bytes: float, n_ranks: int, seconds: float) -> np.ndarray:
    """Per link, the average rate (Gbit/s) at which a collective of nccl-tests size ``size_bytes`` moved its
    bytes over ``seconds``: ``load_a · S / n`` bytes each (``load``: :func:`mccl.schedule.link_load`)."""
    if not (size_bytes > 0 and seconds > 0 and n_ranks > 0):
        raise ControllerError(f"traffic needs a positive size, time and rank count, got {size_bytes}, {seconds}, "
                              f"{n_ranks}")
    return np.asarray(load, dtype=float) * (size_bytes / n_ranks) * 8.0 / seconds / 1e9


def saturated_reading(mapping: OverlayMap, inter_factor: np.ndarray, intra_factor: np.ndarray,
                      measured_gbps: np.ndarray, base_gbps: np.ndarray, load: np.ndarray, size_bytes: float,
                      observed_s: tuple[float, float], gamma: float) -> SaturatedReading:
    """The module docstring's reading of ``measured_gbps`` (the scale-free measured topology) for the active
    schedule with per-link ``load``, a collective of ``size_bytes`` observed at (reference, now) seconds
    ``observed_s``; ``base_gbps``: the capacities its references stand for; factors as
    :func:`~mccl.control.drift.measured_capacities` takes them."""
    measured = np.asarray(measured_gbps, dtype=float)
    base = np.asarray(base_gbps, dtype=float)
    load = np.asarray(load, dtype=float)
    if not (measured.shape == base.shape == load.shape):
        raise ControllerError(f"saturated_reading: {measured.shape} measured, {base.shape} base, {load.shape} loads")
    none = np.zeros(0, dtype=np.int64)
    reference_s, now_s = observed_s
    if not now_s > reference_s * (1.0 + gamma):
        return SaturatedReading(measured, none, "the collective did not slow beyond the drift threshold")
    traffic_ref = traffic_gbps(load, size_bytes, mapping.n_ranks, reference_s)
    if np.any(traffic_ref > base * (1.0 + gamma)):
        return SaturatedReading(measured, none, "reference traffic above base capacity: not the topology's units")
    traffic_now = traffic_gbps(load, size_bytes, mapping.n_ranks, now_s)
    n = mapping.n_ranks
    factors = np.concatenate([np.asarray(inter_factor, dtype=float).reshape(n * n),
                              np.asarray(intra_factor, dtype=float).reshape(n)])
    counts = np.diff(mapping.offsets)
    owner = np.repeat(np.arange(len(counts)), counts)
    links = mapping.links.astype(np.int64)
    slowed_path = np.nan_to_num(factors, nan=np.inf) < 1.0 / (1.0 + gamma)
    suspect = (measured < base / (1.0 + gamma)) & (traffic_ref > 0)
    # per slowed path, the suspect link of its routes with the highest absolute utilisation at the reference
    entry = slowed_path[owner] & suspect[links]
    if not entry.any():
        return SaturatedReading(measured, none, "no clearly slowed path crosses a link read as degraded")
    utilisation = np.where(entry, traffic_ref[links] / base[links], -np.inf)
    best = np.full(len(counts), -np.inf)
    np.maximum.at(best, owner[entry], utilisation[entry])
    culprits = np.unique(links[entry & (utilisation >= best[owner])])
    # it paces the collective: its paths slowed as much as the collective did (within Γ), so its traffic now is
    # what it can carry; read two ways (over the collective's time, and by its paths), the larger
    factor = measured[culprits] / base[culprits]
    pace = factor * (now_s / reference_s)
    culprits = culprits[(pace >= 1.0 / (1.0 + gamma)) & (pace <= 1.0 + gamma)]
    if culprits.size == 0:
        return SaturatedReading(measured, none, "no culprit's paths slowed as much as the collective")
    by_paths = traffic_ref[culprits] * measured[culprits] / base[culprits]
    result = measured.copy()
    result[culprits] = np.minimum(measured[culprits], np.maximum(traffic_now[culprits], by_paths))
    return SaturatedReading(result, culprits)


def saturated_for(guard: Guard, config: ControlConfig, comm: _Communicator, ewma: OverlayEWMA, kind: Collective,
                  measured_gbps: np.ndarray) -> SaturatedReading:
    """:func:`saturated_reading` for ``kind``'s active schedule of ``comm`` (the manager calls it under its lock,
    for what a re-synthesis is made for): its loads, the job's size, its observed (reference, now) times; the
    reading is skipped (``reason`` says why) before the clock has a reference or without an overlay map."""
    measured = np.asarray(measured_gbps, dtype=float)
    active = comm.active.get(kind)
    observed = comm.clock.observed(kind, active.version) if active is not None else None
    if active is None or observed is None or comm.coverage is None:
        return SaturatedReading(measured, np.zeros(0, dtype=np.int64), "no observed collective times yet")
    if not observed[1] > observed[0] * (1.0 + config.gamma):  # before the loads: most checks stop here
        return SaturatedReading(measured, np.zeros(0, dtype=np.int64),
                                "the collective did not slow beyond the drift threshold")
    size = guard.size(comm.sizes.get(kind), comm.meter, kind, active.schedule, comm.clock)[0]
    base = guard.nominal.capacities_gbps if comm.base is None else comm.base
    reading = saturated_reading(comm.coverage, *ewma.factors(), measured, base, guard.link_load(active.schedule), size,
                                observed, config.gamma)
    judged = (active.schedule, active.version, size, observed, None if comm.base is None else comm.base.copy())
    return replace(reading, judged=judged)


def adopted(guard: Guard, config: ControlConfig, communicator: str, kind: Collective, scale_free_gbps: np.ndarray,
            reading: SaturatedReading) -> tuple[np.ndarray, str]:
    """The capacities a re-synthesis is made for, and why: the reading where the scale-free one explains the
    active collective's observed time within Γ and the reading explains it within Γ and better by more than the
    guard's tolerance (the guard's r, :meth:`~mccl.control.guard.Guard.explains`: one prediction on each
    fabric); the reading also where the scale-free one does not explain but the reading is *exact* (r within the
    guard's tolerance, below); else the scale-free one. Called outside the manager's lock.

    Why the scale-free reading must explain first: the reading takes its capacities from the very collective
    time it is then checked against, so on its own the check is partly circular — it can fit a slowdown the
    attribution does not understand. Measured (flow simulator, uniform halving of every GPU ingress, bar 0
    swaps): scale-free r 0.75 (unexplained: the guard keeps the schedule), with a reading of the culprits that
    pace the collective r within Γ, and two swaps. The reading refines a fabric that already explains the
    fault; it does not make one explain.

    Except where the reading is exact (eighth session). A culprit read at its traffic is a lower bound on its
    capacity, exact for a link busy the whole collective; so on the read fabric the active schedule is predicted no
    faster than observed (r ≥ 1 for a predictor that models the executor, up to the telemetry's noise), and as fast (r = 1 within the guard's
    tolerance) only when every culprit read was busy the whole collective — a test the uniform halving's readings
    fail (r 1.12–1.15 read, 3–10 culprits: some were not busy the whole time) and Fail1's pass (GPU 0's NVLink egress,
    r 1.000). Why it matters: the scale-free r of one fault moves with the noise from check to check (Fail1, flow loop:
    0.80–0.95 within one fault, seed 11), and a flag at r 0.796 dropped the exact reading, the schedule made for the
    scale-free fabric ran 2.317 ms on the true one against the active 2.219, the guard kept v0 and the fault was never
    swapped (seeds 1 and 11 of 0–11); with it, 1.166x and 1.186x.

    Why the check: the reading is a hypothesis (these links are saturated now); where many paths slowed for
    reasons of their own it is as wrong as the scale-free reading, the other way. Measured (flow simulator,
    uniform halving of every GPU ingress): 22 links read at their traffic, r 0.75 → 1.30 (the fabric now
    overstates the slowdown), and the guard's affine reading swapped in the ring; Fail1: r 0.87 → 1.00. Why
    "by more": where both explain (Fail3, r 1.000 both) the reading's non-bottleneck links read at their
    traffic are too low, the version made for them finds its own paths faster than its base and is flagged
    again during the same fault (measured: a third swap, seed 0)."""
    if reading.culprits.size == 0 or reading.judged is None:
        return scale_free_gbps, reading.reason
    schedule, version, size, observed, base = reading.judged
    topology: Topology = guard.nominal
    try:
        on_reading = guard.explains(communicator, kind, version, schedule,
                                            topology.with_capacities(reading.capacities_gbps), size, observed, base)
        on_scale_free = guard.explains(communicator, kind, version, schedule,
                                               topology.with_capacities(scale_free_gbps), size, observed, base)
    except MCCLError as error:
        return scale_free_gbps, f"not judged ({error})"
    text = f"r {on_scale_free:.3f} scale-free, {on_reading:.3f} read"
    exact = abs(math.log(on_reading)) <= math.log1p(config.guard_tolerance)  # its culprits busy the whole collective
    if abs(math.log(on_scale_free)) > math.log1p(config.gamma) and not exact:
        return scale_free_gbps, f"the scale-free reading does not explain the slowdown: not refined ({text})"
    if abs(math.log(on_reading)) <= math.log1p(config.gamma) and \
            abs(math.log(on_reading)) + math.log1p(config.guard_tolerance) < abs(math.log(on_scale_free)):
        return reading.capacities_gbps, f"{reading.culprits.size} links read at their traffic ({text})"
    return scale_free_gbps, f"the reading explains no better ({text})"
