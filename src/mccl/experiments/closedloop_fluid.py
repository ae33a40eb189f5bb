"""The controller on a per-path rate model: the closed loop where flow simulation is unaffordable.

Why: one flow-level simulation of a 128-GPU collective costs ~25 s CPU on this machine
(BENCHMARKS.md, "Closed loop on the simulator"), so a loop of ~50 collectives at 128 GPUs,
let alone 1024, does not fit. Here every collective is evaluated in closed form on the
capacities in force at its launch, and the same real :class:`~mccl.control.ScheduleManager`
watches it through executors that emit the runtime's samples.

The model (:func:`path_rates`). With link loads ``L_a`` (bytes a collective puts on link a)
and capacities ``C_a``, link a needs ``τ_a = L_a / C_a`` seconds. The collective takes the
α-β time of :func:`mccl.sim.analytic.evaluate` (``max_a τ_a`` plus each step's route
latency). Each transfer's connection is busy for ``τ`` of the most loaded link on its
route (it cannot finish before that link has carried everything it carries); an overlay
link's window (a rank pair across hosts, or a rank's injection into its host, the
runtime's keys) has the bytes of its transfers and the longest of their busy times
(concurrent connections share one window, as in the flow-level executors). So a pair's
rate falls exactly when a link on its route becomes its most loaded one, which is what
lets the controller localize a fault.

What it loses against the flow-level simulator: contention between steps and chunk
dependencies (store-and-forward fill of deep trees — the α-β time is a lower bound for a
tree packing, ~1.8× faster than simulated on the healthy 2×8), max-min fair sharing (here a
link's bandwidth is split in proportion to the bytes of each connection, so every
connection through a link finishes together), and capacity changes inside a collective
(a collective runs on the capacities at its launch; faults here last many collectives).
The loop's *decisions* — when a fault is seen, what is synthesized, how many swaps — are
what this model is for; its algbw is the α-β figure, not a simulated one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mccl.control.guard import Predictor
from mccl.control.manager import ControlConfig, ScheduleManager
from mccl.errors import MCCLError
from mccl.experiments.closedloop_sim import LoopDriver, LoopResult, TelemetryModel
from mccl.schedule import Schedule, gbps_to_gbs, link_load
from mccl.sim.inputs import CapacityChange
from mccl.sim.results import RunResult
from mccl.telemetry import INTER, INTRA, Sample
from mccl.topology import Topology

__all__ = ["PathModel", "PathRates", "path_rates", "run_fluid_loop"]


@dataclass(frozen=True)
class PathRates:
    """One collective under the model: its time, and per overlay link (rank, peer or -1) bytes and busy s."""

    time_s: float
    keys: np.ndarray  # (k, 2): rank, peer (-1: the rank's aggregate injection into its host)
    bytes: np.ndarray
    busy_s: np.ndarray
    same_host: np.ndarray  # (k,) bool: the overlay link is inside one host (an "intra" sample)


class PathModel:
    """:func:`path_rates` for one schedule, with everything that does not depend on capacities done once
    (link loads, the overlay-link grouping of transfers, bytes per overlay link, the route-latency
    term); :meth:`rates` then costs a few vectorized passes per collective. Why: the loop evaluates the
    same schedule for tens of collectives, at 1024 GPUs ~2 M transfers each."""

    def __init__(self, schedule: Schedule, size_bytes: float, host_of_rank: Sequence[str | None],
                 topology: Topology, *, intra_per_peer: bool = True) -> None:
        n = schedule.n_ranks
        block = size_bytes / n
        self.n_links = len(topology.links)
        self.load = link_load(schedule, self.n_links) * block
        transfers = schedule.transfers
        self.route_links = transfers.route_links
        self.route_starts = transfers.route_offsets[:-1]
        sender = transfers.sender.astype(np.int64)
        receiver = transfers.receiver.astype(np.int64)
        codes = {name: code for code, name in enumerate(sorted({h for h in host_of_rank if h is not None}))}
        host = np.array([codes.get(h, -1) if h is not None else -1 for h in host_of_rank], dtype=np.int64)
        same = (host[sender] >= 0) & (host[sender] == host[receiver])
        peer = np.where(same, -1, receiver) if not intra_per_peer else receiver
        key = sender * (n + 1) + (peer + 1)
        self.order = np.argsort(key, kind="stable")
        ordered = key[self.order]
        self.group_starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(key) else np.zeros(0, int)
        unique = ordered[self.group_starts]
        weight = schedule.chunks.fraction[transfers.chunk] * block
        self.sent = np.add.reduceat(weight[self.order], self.group_starts) if len(key) else np.zeros(0)
        self.keys = np.stack([unique // (n + 1), unique % (n + 1) - 1], axis=1)
        self.same_host = (self.keys[:, 1] < 0) | (host[self.keys[:, 0]] >= 0) & (
            host[self.keys[:, 0]] == host[np.maximum(self.keys[:, 1], 0)])
        self.latency_s = float(transfers.step_max_route_cost(topology.latencies_us).sum() * 1e-6)

    def rates(self, capacities_gbps: np.ndarray) -> PathRates:
        """The model on these capacities (one per link): the same figures as :func:`path_rates`."""
        capacity = gbps_to_gbs(np.asarray(capacities_gbps, dtype=float)) * 1e9
        with np.errstate(divide="ignore", invalid="ignore"):
            tau = np.where(self.load > 0, self.load / capacity, 0.0)
        if not len(self.order):
            return PathRates(float(tau.max(initial=0.0)) + self.latency_s, self.keys, self.sent, np.zeros(0),
                             self.same_host)
        busy = np.maximum.reduceat(tau[self.route_links], self.route_starts)
        longest = np.maximum.reduceat(busy[self.order], self.group_starts)
        return PathRates(float(tau.max(initial=0.0)) + self.latency_s, self.keys, self.sent, longest, self.same_host)


def path_rates(schedule: Schedule, topology: Topology, size_bytes: float,
               host_of_rank: Sequence[str | None], *, intra_per_peer: bool = True) -> PathRates:
    """The per-path rate model of the module docstring; vectorized over transfers. The collective's
    time is :func:`mccl.sim.analytic.evaluate`'s α-β time. ``intra_per_peer``: same-host pairs keyed
    per pair (True) or per sender (peer -1, the aggregate injection)."""
    if not size_bytes > 0:
        raise MCCLError(f"size must be positive, got {size_bytes} bytes")
    return PathModel(schedule, size_bytes, host_of_rank, topology, intra_per_peer=intra_per_peer).rates(
        topology.capacities_gbps)


def _capacities_at(nominal: np.ndarray, changes: Sequence[CapacityChange], time_s: float) -> np.ndarray:
    capacities = nominal.copy()
    for change in sorted(changes, key=lambda item: item.time_s):
        if change.time_s <= time_s:
            capacities[int(change.link)] = change.gbps
    return capacities


def run_fluid_loop(
    topology: Topology,
    schedule: Schedule,
    size_bytes: float,
    *,
    changes: Sequence[CapacityChange] = (),
    until_s: float,
    gap_s: float,
    config: ControlConfig | None = None,
    model: TelemetryModel | None = None,
    synthesis_delay_s: float | None = None,
    predict: Predictor | None = None,
    job: str = "job",
) -> LoopResult:
    """Collectives of ``schedule`` launched back to back with ``gap_s`` of compute until ``until_s``,
    each evaluated by :func:`path_rates` on the capacities at its launch, watched by a real
    :class:`ScheduleManager` (same contract as :func:`~mccl.experiments.closedloop_sim.run_loop`:
    a version issued at time t is in force from the first launch after t + its synthesis time)."""
    if not math.isfinite(until_s):
        raise MCCLError("run_fluid_loop needs a finite until_s")
    for change in changes:
        if not isinstance(change.link, int | np.integer):
            raise MCCLError("run_fluid_loop takes capacity changes by link id")
    model = model or TelemetryModel()
    rng = np.random.default_rng(model.seed)
    manager = ScheduleManager(topology, config, predict=predict)
    manager.register(job, schedule, size_bytes=size_bytes)
    hosts = [topology.node(gpu).host for gpu in schedule.ranks]
    nominal = topology.capacities_gbps
    current, version = schedule, int(schedule.meta.version)
    runs: list[RunResult] = []
    driver = LoopDriver(manager, job, schedule, synthesis_delay_s)
    samples_out = 0
    now, iteration = 0.0, 0
    model_of: tuple[Schedule, PathModel] | None = None  # the running schedule's model, built once
    while now < until_s:
        due = driver.due(now, strictly=True)
        if due is not None:
            ready, issued, current = due
            version = int(current.meta.version)
            driver.swapped(ready, issued, current)
        if model_of is None or model_of[0] is not current:
            model_of = (current, PathModel(current, size_bytes, hosts, topology, intra_per_peer=model.intra_per_peer))
        rates = model_of[1].rates(_capacities_at(nominal, changes, now))
        end = now + rates.time_s
        label = current.meta.synthesizer + (f" v{version}" if version != schedule.meta.version else "")
        algbw = size_bytes / rates.time_s / 1e9
        runs.append(RunResult(job, current.collective.value, iteration, current.collective, label, current.n_ranks,
                              size_bytes, now, end, algbw, algbw * (current.n_ranks - 1) / current.n_ranks,
                              len(current.transfers), ()))
        seconds = rates.busy_s.copy()
        if model.noise_sigma > 0:
            seconds *= rng.lognormal(0.0, model.noise_sigma, len(seconds))
        if model.burst_probability > 0:
            seconds *= np.where(rng.random(len(seconds)) < model.burst_probability, model.burst_slowdown, 1.0)
        seq = iteration + 1
        batch = [Sample(INTRA if same else INTER, job, int(rank), int(peer), int(nbytes), float(busy), end, seq,
                        current.collective.value, version)
                 for (rank, peer), nbytes, busy, same in zip(rates.keys, rates.bytes, seconds, rates.same_host,
                                                             strict=True)
                 if nbytes > 0 and busy > 0]
        batch += model.collective_samples(rng, job, current.n_ranks, size_bytes, rates.time_s, end, seq,
                                          current.collective.value, version)
        samples_out += len(batch)
        driver.observe(end, batch)
        now = end + gap_s
        iteration += 1
    return LoopResult(tuple(runs), tuple(driver.swaps), tuple(driver.events), samples_out, iteration, math.nan,
                      int(schedule.meta.version), {"gap_s": gap_s}, tuple(manager.guard.decisions))
