"""Never worse than what it replaces (issue 11, deliverable 3): the manager's last check before a swap.

A re-synthesized schedule is optimal for the synthesizer's model (the steady-state LP of
link loads), not necessarily for the executor: on the healthy 2×8 HPN the tree-packing
AllGather's bound is 437 GB/s, yet the flow-level simulator runs it at 239–330 GB/s against
426 for the NCCL ring (issue 11). So before issuing, the manager predicts the time of one
collective of the job's size on the measured topology for three schedules — the candidate,
the active one, and the NCCL-style baseline (``ring.nccl`` for AllGather / ReduceScatter /
AllReduce, ``alltoall.direct`` for AllToAll, built once on the nominal topology: it is the
static schedule NCCL would keep running) — and keeps the fastest (:func:`choose`).

The predictor is a seam (:data:`Predictor`): ``mccl.control`` must not import ``mccl.sim``
(DESIGN.md), so whoever builds the manager may inject one backed by the flow-level
simulator (the experiments do, where a simulation is affordable). The default,
:func:`alpha_beta_seconds`, needs only :mod:`mccl.schedule`: the bandwidth term of the most
loaded link relative to its capacity plus the route latency of every step. What it loses
against the simulator: contention between steps, store-and-forward fill of deep trees and
the executor's sharing of a link between connections — exactly the causes of the trees'
healthy-fabric gap — so with the default the guard catches a schedule that is slower by
its link loads or its step count (a candidate made for a fault that is gone, a ring
through a slowed NIC), not one that is slower only in execution.

Is the measured fabric an explanation? (:func:`explained`). Every prediction above is made on
the *measured* topology, which the controller attributes from per-path telemetry. Where a
path's rate is set by which flows overlap in time rather than by capacities (a tree packing
running at half its bound in the flow-level simulator), the attribution can blame links that
were never slowed (measured: a uniform halving of every GPU ingress link read as ToR→GPU links
at 0.77–0.79 of nominal), and a schedule synthesized for that fabric is compared on the same
wrong fabric. The one schedule whose real time the controller knows is the active one: ranks
report each collective's launch-to-completion time (``Sample`` kind ``"collective"``), kept by
:class:`CollectiveClock`. So before it trusts a comparison the guard checks that the measured
fabric predicts what it observes, under the better of two calibrations of the predictor: none
(the predicted time of the active schedule on the measured fabric against its observed time now
— a predictor that models the executor), or its error on the version's *base* (the fabric the
references stand for): the predicted change, measured over base, against the observed change,
now over while the references were learned (:func:`explained`; a constant bias cancels: α-β
predicts a tree packing ~2× faster than the flow-level simulator runs it, on every fabric). Why
both: a version issued for a fault was predicted on a measured fabric that may itself have been
off (Fail3's trees: 13.3 ms predicted, 17.9 observed), and after the repair the predictor is exact
again (3.89 vs 3.80 ms) while the change reads 1.38× off. Within
``explain_tolerance`` (the manager passes Γ: the drift test's own threshold for a meaningful
change) the measured fabric explains what the job experiences and the choice is :func:`choose`'s.
Beyond it, the predictor is off by a factor e = max(r, 1/r) (r: the better ratio) on the one
schedule it can be checked on; a predicted gain is the ratio of two predictions on that fabric,
each of which may be off as much, so it counts only if it is larger than e²: a schedule made for a
fabric whose predicted slowdown nobody observes gains about that imagined slowdown back, and is not
issued; the active one is kept (re-based, so the same evidence does not flag it again). A real
fault that the attribution over- or under-states still swaps when its gain is large (Fail2
AllToAll, one noise seed: the fabric predicts 1.24× the observed slowdown, the candidate 7.4×
faster). Why not keep the active one whenever the fabric is unexplained: that seed then runs
Fail2 at 7× the time it needs, on a telemetry error of 24 %.

The e² rule holds only where the fabric *understates* the change (the observed change is larger
than predicted: something the measured fabric does not contain slows the job, as in the uniform
slowdown, r 0.72–0.75). Where it *overstates* it (r > 1 + tolerance: the collective slowed less than
its links did), the two observations are read as ``observed = fixed + slope · predicted``
(:func:`fixed_plus_links`: a part of the time the links do not set — the executor's CPU, start-up,
waits — which exists with fixed ≥ 0 exactly when the observed change is in the predicted direction
and no larger), and the schedules are compared on those calibrated times, a tie going to the active
one. Why (decided on evidence, BENCHMARKS.md "(fifth session)"): on the pacer demo (rank 0's NIC
×0.125; collectives at 0.11–0.18 of the α-β model, a large fixed part) the fault was real and the
fabric found it, but every flag read r 1.24–2.6 and the e² rule asked for gains of 1.5–6.8× where the
candidate's was 1.13–1.59×: the guard never issued and the demo test failed. Under the affine reading
the same decisions keep a gain of 1.01–2.2× and issue; the uniform slowdown, which understates, keeps
its 0 swaps. A gain the affine reading shrinks below the tolerance is no swap. Where no
collective times are reported, the check is skipped (as before). The check is only as good as
the predictor's model of execution: with a predictor that cannot see why a schedule is slow
(α-β on the flow simulator's tree packings: a local fault and a uniform slowdown change both
predictions alike) it cannot tell them apart (BENCHMARKS.md, 2026-12-01 fourth session).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from mccl.control.observed import CollectiveClock, SizeMeter, size_from_bytes  # re-exported (__all__)
from mccl.errors import ControllerError, SynthesisError
from mccl.schedule import Chunks, Collective, Schedule, Transfers, gbps_to_gbs, link_load
from mccl.topology import Topology

__all__ = ["AlphaBeta", "Predictor", "explained_text", "BASELINE_METHOD", "CollectiveClock", "GuardDecision", "Guard", "SizeMeter",
           "alpha_beta_seconds", "choose", "explained", "fixed_plus_links", "size_from_bytes"]

Predictor = Callable[[Schedule, Topology, float], float]
"""``predict(schedule, topology, size_bytes) -> seconds`` of one collective of nccl-tests size S."""

BASELINE_METHOD = MappingProxyType({
    Collective.ALLGATHER: "ring.nccl",
    Collective.REDUCESCATTER: "ring.nccl",
    Collective.ALLREDUCE: "ring.nccl",
    Collective.ALLTOALL: "alltoall.direct",
})
"""The NCCL-style schedule each collective is compared with (what NCCL would run, unchanged)."""

CANDIDATE, ACTIVE, BASELINE = "candidate", "active", "baseline"


def alpha_beta_seconds(schedule: Schedule, topology: Topology, size_bytes: float, *,
                       step_overhead_us: float = 0.0) -> float:
    """α-β time of one collective: ``max_a load_a·(S/n)/C_a`` plus, per step, the largest route
    latency among its transfers (and ``step_overhead_us``). The same model as
    :func:`mccl.sim.analytic.evaluate`, restated here because control may not import sim."""
    if not size_bytes > 0:
        raise ControllerError(f"a predicted collective needs a positive size, got {size_bytes} bytes")
    load = link_load(schedule, len(topology.links))
    capacity = gbps_to_gbs(topology.capacities_gbps) * 1e9
    used = load > 0
    if np.any(capacity[used] <= 0):
        raise ControllerError("a schedule crosses a link of zero capacity")
    bandwidth = float(np.max(load[used] * (size_bytes / schedule.n_ranks) / capacity[used], initial=0.0))
    return bandwidth + _latency_s(schedule, topology, step_overhead_us)


class AlphaBeta:
    """:func:`alpha_beta_seconds` as a :data:`Predictor` that keeps, for the last few schedules it saw,
    the parts that do not depend on capacities: the link loads and the summed per-step route latency
    (latencies do not change when capacities are measured). Why: the guard predicts the active schedule
    and the baseline again at every decision, and at 512 GPUs each ``link_load`` is ~70 ms CPU.
    Keyed by the schedule's transfers and chunks (a version re-numbered with ``with_meta`` shares them), held
    strongly while cached (at most ``keep``), so an id is never reused."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._cache: dict[int, tuple[tuple[Transfers, Chunks], np.ndarray, dict[bytes, float]]] = {}

    def __call__(self, schedule: Schedule, topology: Topology, size_bytes: float) -> float:
        if not size_bytes > 0:
            raise ControllerError(f"a predicted collective needs a positive size, got {size_bytes} bytes")
        _, load, latency_by_fabric = self._entry(schedule, len(topology.links))
        capacity = gbps_to_gbs(topology.capacities_gbps) * 1e9
        used = load > 0
        if np.any(capacity[used] <= 0):
            raise ControllerError("a schedule crosses a link of zero capacity")
        bandwidth = float(np.max(load[used] * (size_bytes / schedule.n_ranks) / capacity[used], initial=0.0))
        key = topology.latencies_us.tobytes()
        if key not in latency_by_fabric:
            latency_by_fabric.clear()
            latency_by_fabric[key] = _latency_s(schedule, topology)
        return bandwidth + latency_by_fabric[key]


    def _entry(self, schedule: Schedule, n_links: int) -> tuple[tuple[Transfers, Chunks], np.ndarray, dict[bytes, float]]:
        parts = (schedule.transfers, schedule.chunks)  # a re-versioned schedule (with_meta) shares them
        entry = self._cache.pop(id(parts[0]), None)
        cached = entry is not None and entry[0][0] is parts[0] and entry[0][1] is parts[1]
        if entry is None or not cached or len(entry[1]) != n_links:
            entry = (parts, link_load(schedule, n_links), {})
        self._cache[id(parts[0])] = entry  # most recent last
        while len(self._cache) > self.keep:
            del self._cache[next(iter(self._cache))]
        return entry

    def load(self, schedule: Schedule, n_links: int) -> np.ndarray:
        """``schedule``'s :func:`~mccl.schedule.link_load` on ``n_links`` links, from the cache (read-only)."""
        return self._entry(schedule, n_links)[1]


def _latency_s(schedule: Schedule, topology: Topology, step_overhead_us: float = 0.0) -> float:
    """Σ over steps of the largest route latency among the step's transfers (and the overhead), in s."""
    transfers = schedule.transfers
    if len(transfers) == 0:
        return 0.0
    hop = topology.latencies_us[transfers.route_links]
    route = np.add.reduceat(hop, transfers.route_offsets[:-1])
    route[np.diff(transfers.route_offsets) == 0] = 0.0  # reduceat gives the next hop for an empty route
    per_step = np.zeros(transfers.n_steps)
    np.maximum.at(per_step, transfers.step, route)
    return float((per_step.sum() + step_overhead_us * transfers.n_steps) * 1e-6)


@dataclass(frozen=True)
class GuardDecision:
    """One comparison before a swap: predicted seconds per schedule on the measured topology at
    ``size_bytes`` (from ``size_source``: "registered", "reported", "telemetry" or "default"), and which won."""

    communicator: str
    collective: Collective
    active_version: int
    size_bytes: float
    size_source: str
    predicted_s: MappingProxyType  # "candidate" / "active" / "baseline" -> seconds
    chosen: str
    seconds: float = 0.0  # wall time the predictions took
    explained: float = math.nan  # predicted over observed time of the active schedule, better calibration (module doc)
    observed_s: tuple[float, float] = (math.nan, math.nan)  # the active one's observed time: reference, now
    trusted: bool = True  # False: the measured fabric did not explain the observed time within the tolerance
    # untrusted, but explained as a fixed part plus a part on the links (fixed s, observed s per predicted s):
    # the choice was made on these calibrated times (:func:`fixed_plus_links`); None otherwise
    affine: tuple[float, float] | None = None

    def calibrated_s(self, label: str) -> float:
        """The time the choice used for ``label``: predicted, or calibrated by :attr:`affine`."""
        seconds = self.predicted_s[label]
        return seconds if self.affine is None else self.affine[0] + self.affine[1] * seconds

    def speedup(self, over: str) -> float:
        """How much faster the chosen schedule is predicted to be than ``over``."""
        return self.predicted_s[over] / self.predicted_s[self.chosen]


def choose(predicted_s: dict[str, float], tolerance: float) -> str:
    """The fastest of the predicted schedules. Ties within ``tolerance`` (relative) go, in this order,
    to the candidate (made for the fabric as measured now), the active one (no swap), the baseline."""
    if CANDIDATE not in predicted_s:
        raise ControllerError("the guard needs the candidate's predicted time")
    best = CANDIDATE
    for other in (ACTIVE, BASELINE):
        if other in predicted_s and predicted_s[other] < predicted_s[best] * (1.0 - tolerance):
            best = other
    return best


def explained(predicted_base_s: float, predicted_now_s: float, observed_reference_s: float,
              observed_now_s: float) -> float:
    """How well a measured fabric explains what the active schedule experiences: its predicted change
    (on the measured fabric over on its base) divided by its observed change (its time now over its
    time while its references were learned). 1: fully explained; > 1: the fabric predicts more
    slowdown than observed; < 1: less. A ratio of changes, so a predictor's constant bias cancels."""
    values = (predicted_base_s, predicted_now_s, observed_reference_s, observed_now_s)
    if not all(value > 0 and math.isfinite(value) for value in values):
        raise ControllerError(f"explained() needs positive finite times, got {values}")
    return (predicted_now_s / predicted_base_s) / (observed_now_s / observed_reference_s)


def fixed_plus_links(predicted_base_s: float, predicted_now_s: float, observed_reference_s: float,
                     observed_now_s: float) -> tuple[float, float] | None:
    """The one affine reading of two observations, observed = fixed + slope · predicted, through (base,
    reference) and (now, now), if it is physical: slope > 0 and fixed ≥ 0 (a part of the collective's time
    that the links do not set: start-up, CPU, the executor's waits). It exists exactly when the observed change
    is in the predicted direction and no larger than predicted (the fabric overstates, never understates,
    the change); returns (fixed seconds, slope), else None."""
    values = (predicted_base_s, predicted_now_s, observed_reference_s, observed_now_s)
    if not all(value > 0 and math.isfinite(value) for value in values) or predicted_now_s == predicted_base_s:
        return None
    slope = (observed_now_s - observed_reference_s) / (predicted_now_s - predicted_base_s)
    fixed = observed_reference_s - slope * predicted_base_s
    return (fixed, slope) if slope > 0 and fixed >= 0 else None


class Guard:
    """Runs the comparison of the module docstring for a manager and keeps its decisions.

    ``predict``: the :data:`Predictor` (default :func:`alpha_beta_seconds`); ``synthesize``: how the
    baseline is built (``mccl.synth.optimize``, passed by the manager); ``tolerance``: see :func:`choose`."""

    def __init__(self, nominal: Topology, synthesize: Callable[..., object], *, predict: Predictor | None = None,
                 tolerance: float = 0.01, default_size_bytes: float = float(2**30),
                 explain_tolerance: float | None = None) -> None:
        if not (0.0 <= tolerance < 1.0):
            raise ControllerError(f"the guard's tolerance must be in [0, 1), got {tolerance}")
        if explain_tolerance is not None and not (explain_tolerance > 0 and math.isfinite(explain_tolerance)):
            raise ControllerError(f"the guard's explain_tolerance must be positive, got {explain_tolerance}")
        self.explain_tolerance = explain_tolerance
        # (communicator, collective, version) -> (size, predicted seconds on the fabric the version stands for)
        self._expected: dict[tuple[str, Collective, int], tuple[float, float]] = {}
        self.nominal = nominal
        self.predict: Predictor = predict or AlphaBeta()
        self.tolerance = float(tolerance)
        self.default_size_bytes = float(default_size_bytes)
        self._synthesize = synthesize
        self._baselines: dict[tuple[str, Collective], object | None] = {}
        self.decisions: list[GuardDecision] = []

    def baseline(self, communicator: str, kind: Collective, ranks: tuple[str, ...]) -> object | None:
        """The NCCL-style baseline's synthesis result for this communicator (built once, on the nominal
        topology), or None where no such method makes the collective."""
        key = (communicator, kind)
        if key not in self._baselines:
            method = BASELINE_METHOD.get(kind)
            try:
                self._baselines[key] = None if method is None else self._synthesize(self.nominal, kind, ranks,
                                                                                     method=method)
            except SynthesisError:
                self._baselines[key] = None
            built = self._baselines[key]
            if built is not None:
                self.prepare(built.schedule)  # type: ignore[attr-defined]
        return self._baselines[key]

    def prepare(self, schedule: Schedule) -> None:
        """Let a caching predictor (:class:`AlphaBeta`) learn ``schedule``'s capacity-independent parts now
        (the manager calls it at registration and for each version it activates; ~0.1–0.3 s at 512 GPUs), so
        that a later decision predicts it from its cache. Other predictors are left alone: for them a
        prediction is a simulation, not worth running ahead."""
        if isinstance(self.predict, AlphaBeta):
            self.predict(schedule, self.nominal, self.default_size_bytes)

    def link_load(self, schedule: Schedule) -> np.ndarray:
        """``schedule``'s link loads on the nominal topology: the α-β predictor's cached ones when it is the
        predictor (~70 ms each at 512 GPUs otherwise)."""
        if isinstance(self.predict, AlphaBeta):
            return self.predict.load(schedule, len(self.nominal.links))
        return link_load(schedule, len(self.nominal.links))

    def size(self, registered: float | None, meter: SizeMeter, kind: Collective,
             schedule: Schedule, clock: CollectiveClock | None = None) -> tuple[float, str]:
        """(S, where it came from): the registration's size, else the size the ranks report with their
        collective times ("reported"), else one inferred from path telemetry's bytes, else the default."""
        if registered is not None:
            return float(registered), "registered"
        reported = clock.size(kind) if clock is not None else None
        if reported:
            return reported, "reported"
        moved = meter.bytes_of(kind)
        if moved:
            return size_from_bytes(schedule, moved), "telemetry"
        return self.default_size_bytes, "default"

    def expect(self, communicator: str, kind: Collective, version: int, decision: GuardDecision) -> None:
        """Remember the issued ``version``'s predicted time on the fabric it is issued for (its base), from
        the ``decision`` that chose it: the manager calls it at issue, so :meth:`compare` need not predict
        it again."""
        self._expected[(communicator, kind, version)] = (decision.size_bytes, decision.predicted_s[decision.chosen])

    def forget(self, communicator: str, kind: Collective, version: int) -> None:
        """``version``'s base changed (the manager's late-landing check): its prediction there is made again."""
        self._expected.pop((communicator, kind, version), None)

    def _expected_s(self, communicator: str, kind: Collective, version: int, active: Schedule, size_bytes: float,
                    base_gbps: np.ndarray | None) -> float:
        """``version``'s predicted time on the fabric its references stand for (remembered per size)."""
        key = (communicator, kind, version)
        expected = self._expected.get(key)
        if expected is None or expected[0] != size_bytes:
            base = self.nominal if base_gbps is None else self.nominal.with_capacities(base_gbps)
            expected = self._expected[key] = (size_bytes, float(self.predict(active, base, size_bytes)))
        return expected[1]

    @staticmethod
    def explanation(expected_base_s: float, predicted_now_s: float, observed: tuple[float, float]) -> float:
        """r of the module docstring: the better of two calibrations of the predictor — none (it models the
        executor: predicted time = observed time), or its error on the version's base (a constant bias
        cancels)."""
        return min(explained(expected_base_s, predicted_now_s, *observed), predicted_now_s / observed[1],
                   key=lambda value: abs(math.log(value)))

    def explains(self, communicator: str, kind: Collective, version: int, active: Schedule, measured: Topology,
                 size_bytes: float, observed: tuple[float, float], base_gbps: np.ndarray | None) -> float:
        """r for ``active`` on ``measured`` (one prediction; the base's is remembered): how well that fabric
        explains the collective's observed (reference, now) times (:mod:`.saturation` picks its reading by it)."""
        expected = self._expected_s(communicator, kind, version, active, size_bytes, base_gbps)
        return self.explanation(expected, float(self.predict(active, measured, size_bytes)), observed)

    def compare(self, communicator: str, kind: Collective, active_version: int, schedules: dict[str, Schedule],
                measured: Topology, size: tuple[float, str], *, observed: tuple[float, float] | None = None,
                base_gbps: np.ndarray | None = None) -> GuardDecision:
        """Predict every schedule on ``measured`` and choose; the decision is kept in ``decisions``.
        ``observed``: the active schedule's observed (reference, now) seconds (:class:`CollectiveClock`);
        ``base_gbps``: the capacities its references stand for (None: the nominal ones). With both and an
        ``explain_tolerance``, a measured fabric that does not explain the observed change keeps the
        active schedule (module docstring)."""
        start = time.perf_counter()
        predicted = {label: float(self.predict(schedule, measured, size[0])) for label, schedule in schedules.items()}
        for label, seconds in predicted.items():
            if not (seconds > 0 and np.isfinite(seconds)):
                raise ControllerError(f"the predictor gave {seconds} s for the {label} schedule")
        ratio, trusted, affine = math.nan, True, None
        if observed is not None and self.explain_tolerance is not None and ACTIVE in predicted:
            expected = self._expected_s(communicator, kind, active_version, schedules[ACTIVE], size[0], base_gbps)
            ratio = self.explanation(expected, predicted[ACTIVE], observed)
            trusted = abs(math.log(ratio)) <= math.log1p(self.explain_tolerance)
            if not trusted:
                affine = fixed_plus_links(expected, predicted[ACTIVE], *observed)
        if affine is not None:  # the fabric overstates the change: part of the time is not on its links (module doc)
            calibrated = {label: affine[0] + affine[1] * seconds for label, seconds in predicted.items()}
            chosen = choose(calibrated, self.tolerance)
            if chosen != ACTIVE and calibrated[ACTIVE] <= calibrated[chosen] * (1.0 + self.tolerance):
                chosen = ACTIVE  # on a fabric known to overstate, a tie is no evidence for a swap
        else:
            chosen = choose(predicted, self.tolerance)
            if not trusted and chosen != ACTIVE and \
                    predicted[ACTIVE] <= predicted[chosen] * max(ratio, 1.0 / ratio) ** 2:
                chosen = ACTIVE  # a gain within what the predictor's error on the active one allows is no evidence
        decision = GuardDecision(communicator, kind, active_version, size[0], size[1], MappingProxyType(predicted),
                                 chosen, time.perf_counter() - start, ratio,
                                 observed or (math.nan, math.nan), trusted, affine)
        self.decisions.append(decision)
        return decision


def explained_text(decision: GuardDecision) -> str:
    """The guard's explanation check in an event's text: r (predicted / observed time of the active schedule)
    and whether the measured fabric explained it; nothing when no collective times were observed."""
    if math.isnan(decision.explained):
        return ""
    predicted = decision.predicted_s
    gain = max((predicted[ACTIVE] / seconds for label, seconds in predicted.items() if label != ACTIVE), default=1.0) \
        if ACTIVE in predicted else math.nan
    reference, now = decision.observed_s
    text = (f"; {'explained' if decision.trusted else 'unexplained'} (r {decision.explained:.3f}, best predicted gain "
            f"over the active {gain:.3f}x; observed {reference * 1e3:.4g} -> {now * 1e3:.4g} ms)")
    if decision.affine is not None and ACTIVE in predicted:
        calibrated = max(decision.calibrated_s(ACTIVE) / decision.calibrated_s(label) for label in predicted)
        text += (f"; read as {decision.affine[0] * 1e3:.3g} ms fixed + {decision.affine[1]:.3g} x predicted: "
                 f"best calibrated gain {calibrated:.3f}x")
    return text
