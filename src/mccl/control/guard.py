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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from mccl.errors import ControllerError, SynthesisError
from mccl.schedule import Collective, Schedule, gbps_to_gbs, link_load
from mccl.topology import Topology

__all__ = ["AlphaBeta", "Predictor", "BASELINE_METHOD", "GuardDecision", "Guard", "SizeMeter", "alpha_beta_seconds", "choose",
           "size_from_bytes"]

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
    Keyed by the schedule object, held strongly while cached (at most ``keep``), so an id is never reused."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._cache: dict[int, tuple[Schedule, np.ndarray, dict[bytes, float]]] = {}

    def __call__(self, schedule: Schedule, topology: Topology, size_bytes: float) -> float:
        if not size_bytes > 0:
            raise ControllerError(f"a predicted collective needs a positive size, got {size_bytes} bytes")
        entry = self._cache.pop(id(schedule), None)
        if entry is None or entry[0] is not schedule or len(entry[1]) != len(topology.links):
            entry = (schedule, link_load(schedule, len(topology.links)), {})
        self._cache[id(schedule)] = entry  # most recent last
        while len(self._cache) > self.keep:
            del self._cache[next(iter(self._cache))]
        _, load, latency_by_fabric = entry
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


def size_from_bytes(schedule: Schedule, bytes_moved: float) -> float:
    """nccl-tests S of a collective whose transfers moved ``bytes_moved`` in all (telemetry: the
    bytes of one sequence number). Every transfer moves its chunk's fraction of a block of S/n bytes,
    so S = n · bytes / Σ fractions. The runtime reports saturated windows only, so this is a lower bound."""
    weight = float(np.sum(schedule.chunks.fraction[schedule.transfers.chunk]))
    if not (weight > 0 and bytes_moved > 0):
        raise ControllerError("cannot infer a collective's size from no transfers or no bytes")
    return schedule.n_ranks * bytes_moved / weight


@dataclass(frozen=True)
class GuardDecision:
    """One comparison before a swap: predicted seconds per schedule on the measured topology at
    ``size_bytes`` (from ``size_source``: "registered", "telemetry" or "default"), and which won."""

    communicator: str
    collective: Collective
    active_version: int
    size_bytes: float
    size_source: str
    predicted_s: MappingProxyType  # "candidate" / "active" / "baseline" -> seconds
    chosen: str
    seconds: float = 0.0  # wall time the predictions took

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


class Guard:
    """Runs the comparison of the module docstring for a manager and keeps its decisions.

    ``predict``: the :data:`Predictor` (default :func:`alpha_beta_seconds`); ``synthesize``: how the
    baseline is built (``mccl.synth.optimize``, passed by the manager); ``tolerance``: see :func:`choose`."""

    def __init__(self, nominal: Topology, synthesize: Callable[..., object], *, predict: Predictor | None = None,
                 tolerance: float = 0.01, default_size_bytes: float = float(2**30)) -> None:
        if not (0.0 <= tolerance < 1.0):
            raise ControllerError(f"the guard's tolerance must be in [0, 1), got {tolerance}")
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

    def size(self, registered: float | None, meter: SizeMeter, kind: Collective,
             schedule: Schedule) -> tuple[float, str]:
        """(S, where it came from): the registration's size, else telemetry's, else the default."""
        if registered is not None:
            return float(registered), "registered"
        moved = meter.bytes_of(kind)
        if moved:
            return size_from_bytes(schedule, moved), "telemetry"
        return self.default_size_bytes, "default"

    def compare(self, communicator: str, kind: Collective, active_version: int, schedules: dict[str, Schedule],
                measured: Topology, size: tuple[float, str]) -> GuardDecision:
        """Predict every schedule on ``measured`` and choose; the decision is kept in ``decisions``."""
        start = time.perf_counter()
        predicted = {label: float(self.predict(schedule, measured, size[0])) for label, schedule in schedules.items()}
        for label, seconds in predicted.items():
            if not (seconds > 0 and np.isfinite(seconds)):
                raise ControllerError(f"the predictor gave {seconds} s for the {label} schedule")
        decision = GuardDecision(communicator, kind, active_version, size[0], size[1], MappingProxyType(predicted),
                                 choose(predicted, self.tolerance), time.perf_counter() - start)
        self.decisions.append(decision)
        return decision
