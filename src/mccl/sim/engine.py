"""The discrete-event, flow-level fabric simulator (mccl-paper §2.3 and §6.1 use SimAI
for this; MCCS §3.3 a testbed).

Every transfer of a running collective becomes a flow on its route once its chunk
is held at the sender and its connection is free (:mod:`mccl.sim.compiled`).
Flows share links max-min fairly (:mod:`mccl.sim.fairshare`), after constant-rate
background flows took their rate; greedy background flows compete like any flow.
A flow's last byte leaves the sender when its bytes are sent and arrives one
route latency (the sum of its links' latencies) later; the arrival may let other
transfers start. Rates are recomputed whenever the set of flows or a capacity
changes, but only for the flows the change can reach (an incremental, exact
max-min: :mod:`mccl.sim.kernels`). On one hop a flow weighs less the more steps it
is ahead of the hop's oldest flow (``SimOptions.step_priority``; 1 makes streams
equal). Chunks move as ``SimOptions.slices`` slices, or, with ``slice_bytes`` set,
as the executor cuts them for each collective's size (:mod:`mccl.schedule.slicing`).
``SimOptions.executor()`` is the executor's model (its slicing, equal streams);
the defaults read the IR literally (whole chunks, a hop's older step first). Events closer in time than
``SimOptions.time_tolerance`` (relative) are processed together, so the thousands of
identical flows of a symmetric schedule finish in one batch instead of one by one.

Events, in the order they are handled at one time: flows that finish sending,
link changes and background flows, arrivals (which may finish collectives and
launch the next collective of a job), launches, the closed-loop hook, then every
connection that is free and has a ready transfer starts one.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence

import numpy as np

from mccl.errors import MCCLError
from mccl.schedule import Schedule
from mccl.sim import grouped
from mccl.sim.closedloop import ControlHook, ControlView, PathSample
from mccl.sim.compiled import CompiledSchedule, compile_schedule
from mccl.sim.ecmp import routes_for
from mccl.sim.fairshare import max_min_rates
from mccl.sim.flows import FlowTable
from mccl.sim.inputs import BackgroundFlow, CapacityChange, CollectiveOp, Job, SimOptions
from mccl.sim.recorder import PathMeter, UtilizationRecorder
from mccl.sim.results import RunResult, SimResult, SimStats
from mccl.sim.runs import RunState
from mccl.sim.sendgate import GateBook
from mccl.topology import Topology

__all__ = ["simulate", "simulate_schedule"]

_BYTES_PER_GBIT = 1e9 / 8
DEFAULT_OPTIONS = SimOptions()
_NO_PATHS = np.zeros(0, dtype=np.int64)  # no meter: flows carry path -1


def simulate(
    topology: Topology,
    jobs: Sequence[Job],
    *,
    background: Sequence[BackgroundFlow] = (),
    changes: Sequence[CapacityChange] = (),
    hook: ControlHook | None = None,
    options: SimOptions = DEFAULT_OPTIONS,
) -> SimResult:
    """Run ``jobs`` (and background traffic, link changes, a hook) until every job is done."""
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise MCCLError(f"job names must differ, got {names}")
    if not jobs:
        raise MCCLError("nothing to simulate: no jobs")
    n_links = len(topology.links)
    for flow in background:
        for link in flow.route:
            if not 0 <= link < n_links:
                raise MCCLError(f"background flow {flow.name!r} uses link {link}, not in topology {topology.name!r}")
    for change in changes:
        if not 0 <= change.link < n_links:
            raise MCCLError(f"capacity change names link {change.link}, not in topology {topology.name!r}")
    return _Engine(topology, tuple(jobs), tuple(background), tuple(changes), hook, options).run()


def simulate_schedule(
    schedule: Schedule,
    topology: Topology,
    size_bytes: float,
    *,
    options: SimOptions = DEFAULT_OPTIONS,
    **inputs: object,
) -> RunResult:
    """Simulate one collective alone on the fabric (plus ``background``/``changes`` if given).

    Alone and under equal streams it runs on the grouped engine (:mod:`mccl.sim.grouped`,
    ``SimOptions.engine``), which computes the same result far faster."""
    alone = not any(inputs.values())
    if options.engine == "grouped" or (options.engine == "auto" and alone and grouped.applies(options)):
        if not alone:
            raise MCCLError(f"the grouped engine runs a collective alone; got {sorted(k for k, v in inputs.items() if v)}")
        return grouped.simulate_grouped(schedule, topology, size_bytes, options)
    result = simulate(topology, [Job.single(schedule, size_bytes)], options=options, **inputs)  # type: ignore[arg-type]
    return result.only()


class _Engine:
    def __init__(self, topology: Topology, jobs: tuple[Job, ...], background: tuple[BackgroundFlow, ...],
                 changes: tuple[CapacityChange, ...], hook: ControlHook | None, options: SimOptions) -> None:
        self.topology = topology
        self.jobs = jobs
        self.background = background
        self.hook = hook
        self.options = options
        self.n_links = len(topology.links)
        self.capacity = topology.capacities_gbps * _BYTES_PER_GBIT  # bytes/s, changes over time
        self.flows = FlowTable(self.n_links, options.step_priority)
        self.next_hop = 0  # hop ids are global over runs (mccl.sim.flows weights flows per hop)
        self.constant: set[int] = set()  # active constant-rate background flows
        self.constant_usage = np.zeros(self.n_links)
        self.available = self.capacity.copy()  # capacity - constant_usage, at least 0: what flows share
        self.runs: dict[int, RunState] = {}
        self.next_slot = 0
        self.current: dict[tuple[str, str], CollectiveOp] = {(job.name, op.name): op for job in jobs for op in job.ops}
        self.compiled: dict[tuple[int, str, int], tuple[Schedule, CompiledSchedule]] = {}
        self.path_cache: dict[tuple[int, str], tuple[CompiledSchedule, np.ndarray]] = {}
        self.launches: list[tuple[float, int, int, int, int]] = []  # (time, seq, job, op, iteration)
        self.arrivals: list[tuple[float, int, int, np.ndarray]] = []  # (time, seq, slot, transfers)
        self.seq = 0
        timeline: list[tuple[float, int, int, object]] = []
        for change in changes:
            timeline.append((change.time_s, 0, 0, change))
        for index, flow in enumerate(background):
            timeline.append((flow.start_s, 1, index, "start"))
            if math.isfinite(flow.end_s):
                timeline.append((flow.end_s, 1, index, "end"))
        self.timeline = sorted(timeline, key=lambda entry: (entry[0], entry[1], entry[2]))
        self.timeline_at = 0
        self.recorder = UtilizationRecorder(self.n_links, options.utilization_bins, self.capacity)
        self.meter = PathMeter() if hook is not None else None
        self.next_hook = hook.interval_s if hook is not None else math.inf
        self.gates = GateBook({job.name: job.gate for job in jobs})
        self.finished: list[RunResult] = []
        self.unreported: list[RunResult] = []
        self.events = self.batches = self.max_flows = 0

    # -- main loop ------------------------------------------------------------
    def run(self) -> SimResult:
        wall = time.perf_counter()
        for index, job in enumerate(self.jobs):
            if job.start_s < job.until_s:
                self._push_launch(job.start_s, index, 0, 0)
        now = 0.0
        self._apply_timeline(now, 0.0)
        self._recompute(now)
        while self.runs or self.launches:
            upcoming = self._next_time(now)
            if upcoming > self.options.max_time_s:
                raise MCCLError(f"simulation passed max_time_s={self.options.max_time_s:g} s at "
                                f"{len(self.runs)} unfinished collectives; {self._stall_report()}")
            self._advance(now, upcoming)
            now = upcoming
            tolerance = self.options.time_tolerance * max(now, 1e-6)
            self.batches += 1
            changed = self._finish_flows(now, tolerance)
            changed |= self._apply_timeline(now, tolerance)
            self._arrive(now, tolerance)
            self._launch(now, tolerance)
            if now >= self.next_hook - tolerance:
                self._call_hook(now)
            changed |= self._start(now, tolerance)
            if changed:
                self._recompute(now)
        stats = SimStats(self.events, self.batches, self.flows.solves, self.flows.rounds, self.max_flows,
                         time.perf_counter() - wall)
        return SimResult(tuple(self.finished), self.recorder.result(), now, stats)

    def _next_time(self, now: float) -> float:
        upcoming = math.inf
        if len(self.flows):
            upcoming = self.flows.next_finish()
        if self.arrivals:
            upcoming = min(upcoming, self.arrivals[0][0])
        if self.timeline_at < len(self.timeline):
            upcoming = min(upcoming, self.timeline[self.timeline_at][0])
        if self.launches:
            upcoming = min(upcoming, self.launches[0][0])
        if self.gates.by_run:
            upcoming = min(upcoming, self.gates.next_open(self.runs, now, self.options.time_tolerance * max(now, 1e-6)))
        if math.isinf(upcoming):  # the hook only swaps future launches: it cannot unblock a stall
            raise MCCLError(f"simulation stalled at t={now:.9g} s: {self._stall_report()}")
        return max(min(upcoming, self.next_hook), now)

    def _stall_report(self) -> str:
        for run in self.runs.values():
            waiting = np.flatnonzero(np.isnan(run.t_start))
            if len(waiting):
                i = int(waiting[0])
                comp = run.compiled
                return (f"job {run.job!r} {run.op!r} has {len(waiting)} transfers not started; e.g. transfer "
                        f"{int(comp.original[i])} (chunk {int(comp.chunk[i])}, rank {int(comp.sender[i])} -> "
                        f"{int(comp.receiver[i])}, step {int(comp.step[i])}) still waits for "
                        f"{int(run.pending[i])} arrivals")
            if len(self.flows):
                return "flows have no capacity left (constant-rate background takes it all)"
        return "no runs active"

    def _advance(self, start: float, stop: float) -> None:
        step = stop - start
        if step <= 0:
            return
        flows = self.flows
        if self.meter is not None and len(flows):
            mine = flows.path >= 0
            self.meter.add(flows.path[mine], flows.rate[mine], step)
        self.recorder.add(start, stop, flows.link_rate + self.constant_usage)

    # -- flows ------------------------------------------------------------------
    def _recompute(self, now: float) -> None:
        self.flows.recompute(self.available, now)
        self.max_flows = max(self.max_flows, len(self.flows))

    def _finish_flows(self, now: float, tolerance: float) -> bool:
        flows = self.flows
        done = flows.due(now + tolerance)
        if not len(done):
            return False
        runs, transfers, bottleneck = flows.run[done], flows.transfer[done], flows.bottleneck[done]
        flows.remove(done)
        self.events += len(transfers)
        single = runs[0] == runs[-1] and (len(runs) < 3 or (runs == runs[0]).all())
        for slot in (runs[:1] if single else np.unique(runs)):
            mine = transfers if single else transfers[runs == slot]
            run = self.runs[int(slot)]
            arrival = run.sent(mine, bottleneck if single else bottleneck[runs == slot], now)
            if len(arrival) == 1 or arrival.min() == arrival.max():
                self.seq += 1
                heapq.heappush(self.arrivals, (float(arrival[0]), self.seq, int(slot), mine))
                continue
            times, inverse = np.unique(arrival, return_inverse=True)
            for index, when in enumerate(times):
                self.seq += 1
                heapq.heappush(self.arrivals, (float(when), self.seq, int(slot), mine[inverse == index]))
        return True

    # -- timeline: capacity changes and background flows ------------------------
    def _apply_timeline(self, now: float, tolerance: float) -> bool:
        changed = False
        constant_changed = False
        while self.timeline_at < len(self.timeline) and self.timeline[self.timeline_at][0] <= now + tolerance:
            _, kind, index, payload = self.timeline[self.timeline_at]
            self.timeline_at += 1
            self.events += 1
            changed = True
            if kind == 0:
                change: CapacityChange = payload  # type: ignore[assignment]
                self.capacity[change.link] = change.gbps * _BYTES_PER_GBIT
                self.recorder.set_capacity(now, self.capacity)
                self.flows.touch_links((change.link,))
                constant_changed = True
                continue
            flow = self.background[index]
            if flow.rate_gbps is not None:
                (self.constant.add if payload == "start" else self.constant.discard)(index)
                self.flows.touch_links(flow.route)
                constant_changed = True
            elif payload == "start":
                route = np.asarray(flow.route, dtype=np.int64)
                self.flows.add(-1, np.array([index]), np.array([np.inf]), np.array([len(route)]), route,
                               np.array([-1]), np.array([0]), np.array([-1]), now)
            else:
                self.flows.remove(np.flatnonzero((self.flows.run == -1) & (self.flows.transfer == index)))
        if constant_changed:
            self._constant_rates()
            self.available = np.maximum(self.capacity - self.constant_usage, 0.0)
        return changed

    def _constant_rates(self) -> None:
        """Constant-rate flows take their rate first (max-min among themselves if oversubscribed)."""
        active = sorted(self.constant)
        self.constant_usage = np.zeros(self.n_links)
        if not active:
            return
        routes = [self.background[i].route for i in active]
        offsets = np.zeros(len(routes) + 1, dtype=np.int64)
        np.cumsum([len(route) for route in routes], out=offsets[1:])
        links = np.concatenate([np.asarray(route, dtype=np.int64) for route in routes])
        caps = np.array([self.background[i].rate_gbps for i in active]) * _BYTES_PER_GBIT
        rates = max_min_rates(offsets, links, self.capacity, caps).rates
        self.constant_usage = np.bincount(links, weights=np.repeat(rates, np.diff(offsets)), minlength=self.n_links)

    # -- arrivals, launches, completions ------------------------------------------
    def _arrive(self, now: float, tolerance: float) -> None:
        batches: dict[int, list[np.ndarray]] = {}
        while self.arrivals and self.arrivals[0][0] <= now + tolerance:
            _, _, slot, transfers = heapq.heappop(self.arrivals)
            batches.setdefault(slot, []).append(transfers)
        for slot, parts in batches.items():
            run = self.runs[slot]
            arrived = parts[0] if len(parts) == 1 else np.concatenate(parts)
            self.events += len(arrived)
            if run.arrive(arrived, now):
                self._complete(slot, now)

    def _complete(self, slot: int, now: float) -> None:
        run = self.runs.pop(slot)
        self.gates.finished(slot)
        result = run.result(now, self.options.keep_chain)
        self.finished.append(result)
        self.unreported.append(result)
        job = self.jobs[run.job_index]
        op, iteration = run.op_index + 1, run.iteration
        if op == len(job.ops):
            op, iteration = 0, iteration + 1
        when = now + job.gap_s
        if iteration < job.iterations and when < job.until_s:
            self._push_launch(when, run.job_index, op, iteration)

    def _push_launch(self, when: float, job: int, op: int, iteration: int) -> None:
        self.seq += 1
        heapq.heappush(self.launches, (when, self.seq, job, op, iteration))

    def _launch(self, now: float, tolerance: float) -> None:
        while self.launches and self.launches[0][0] <= now + tolerance:
            _, _, job_index, op_index, iteration = heapq.heappop(self.launches)
            job = self.jobs[job_index]
            op = self.current[(job.name, job.ops[op_index].name)]
            compiled = self._compile(job, op.schedule, self.options.slices_for(op.schedule, op.size_bytes))
            paths = self._path_ids(job.name, op.schedule, compiled) if self.meter is not None else None
            slot = self.next_slot
            self.next_slot += 1
            self.runs[slot] = RunState(job_index, job.name, op_index, op.name, iteration, compiled, op.size_bytes,
                                       now, paths, self.next_hop)
            self.gates.launched(slot, job.name)
            self.next_hop += int(compiled.hop.max(initial=-1)) + 1
            self.events += 1
            if compiled.n_transfers == 0:
                self._complete(slot, now)

    def _path_ids(self, job: str, schedule: Schedule, compiled: CompiledSchedule) -> np.ndarray:
        """The meter's path id of every connection (cached per job and schedule)."""
        key = (id(compiled), job)
        cached = self.path_cache.get(key)
        if cached is None or cached[0] is not compiled:
            ranks = schedule.ranks
            meter = self.meter
            if meter is None:
                return np.zeros(0, dtype=np.int64)
            ids = np.array([meter.path_id(job, ranks[int(s)], ranks[int(r)], compiled.conn_route(c))
                            for c, (s, r) in enumerate(zip(compiled.conn_sender, compiled.conn_receiver, strict=True))],
                           dtype=np.int64)
            cached = self.path_cache[key] = (compiled, ids)
        return cached[1]

    def _compile(self, job: Job, schedule: Schedule, slices: int) -> CompiledSchedule:
        key = (id(schedule), job.name, slices)
        cached = self.compiled.get(key)
        if cached is None or cached[0] is not schedule:
            offsets, links = routes_for(schedule, self.topology, job.paths, job.name)
            compiled = compile_schedule(schedule, self.topology, offsets, links,
                                        serialize_connections=self.options.serialize_connections,
                                        slices=slices)
            cached = self.compiled[key] = (schedule, compiled)
        return cached[1]

    def _start(self, now: float, tolerance: float) -> bool:
        started = False
        for slot, run in self.runs.items():
            if self.gates.closed(slot, now, tolerance):
                continue
            transfers = run.start(now, tolerance)
            if not len(transfers):
                continue
            started = True
            self.events += len(transfers)
            comp = run.compiled
            self.flows.add_rows(slot, transfers, comp.route_offsets, comp.route_links, comp.fraction, run.block_bytes,
                                comp.step, comp.hop, run.hop_base, run.n_hops,
                                run.paths if run.paths is not None else _NO_PATHS, comp.connection, run.longest, now)
        return started

    # -- the closed-loop hook ------------------------------------------------------
    def _call_hook(self, now: float) -> None:
        if self.hook is None or self.meter is None:
            return
        samples = tuple(PathSample(job, src, dst, route, size, busy)
                        for (job, src, dst, route), size, busy in self.meter.read())
        current = {key: op.schedule for key, op in self.current.items()}
        view = ControlView(now, samples, tuple(self.unreported), current)
        self.unreported = []
        self.hook.callback(view)
        for key, schedule in view.swaps.items():
            self.current[key] = CollectiveOp(schedule, self.current[key].size_bytes, self.current[key].name)
        for job, windows in view.gates.items():
            self.gates.set(job, windows)
        self.events += 1
        while self.next_hook <= now + self.options.time_tolerance * max(now, 1e-6):
            self.next_hook += self.hook.interval_s
