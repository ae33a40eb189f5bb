"""The state of one running collective: which transfers wait, which are queued, which are done.

Per transfer (internal order of :class:`~mccl.sim.compiled.CompiledSchedule`):
arrivals still awaited, the times it became ready / started / was sent / arrived,
and what it waited for last — the arrival of the chunk (its ``last_dep``) or its
connection (the previous transfer on it). Following those back from the last
arrival gives the critical chain: the sequence of transfers and waits that set
the completion time.
"""

from __future__ import annotations

import numpy as np

from mccl.sim import runkernels
from mccl.sim.analytic import busbw_factor
from mccl.sim.compiled import CompiledSchedule
from mccl.sim.results import Cause, ChainStep, RunResult

__all__ = ["RunState"]


class RunState:
    def __init__(self, job_index: int, job: str, op_index: int, op: str, iteration: int,
                 compiled: CompiledSchedule, size_bytes: float, start_s: float, paths: np.ndarray | None,
                 hop_base: int = 0) -> None:
        self.job_index, self.job, self.op_index, self.op, self.iteration = job_index, job, op_index, op, iteration
        self.compiled = compiled
        self.size_bytes = size_bytes
        self.block_bytes = size_bytes / compiled.schedule.n_ranks
        self.start_s = start_s
        self.paths = paths
        self.hop_base = hop_base  # this run's hop ids in the flow table: compiled.hop + hop_base
        self.n_hops = int(compiled.hop.max(initial=-1)) + 1
        self.longest = int(np.diff(compiled.route_offsets).max(initial=0))  # links on its longest route
        count = compiled.n_transfers
        self.pending = compiled.n_deps.copy()
        self.busy = np.zeros(compiled.n_connections, dtype=bool)
        self.conn_last = np.full(compiled.n_connections, -1, dtype=np.int64)
        self.conn_bounds = np.append(compiled.conn_first, count).astype(np.int64)
        self.conn_scan = compiled.conn_first.astype(np.int64)  # first transfer of the connection not started
        self.t_ready = np.full(count, np.nan)
        self.t_start = np.full(count, np.nan)
        self.t_sent = np.full(count, np.nan)
        self.t_arrive = np.full(count, np.nan)
        self.last_dep = np.full(count, -1, dtype=np.int64)
        self.enabler = np.full(count, -1, dtype=np.int64)
        self.cause = np.zeros(count, dtype=np.int8)
        self.bottleneck = np.full(count, -1, dtype=np.int64)
        self.ready = self.pending == 0  # ready, not started
        self.t_ready[self.ready] = start_s
        self.cand_mark = np.zeros(compiled.n_connections, dtype=bool)
        self.cand = np.zeros(compiled.n_connections, dtype=np.int64)
        first = np.unique(compiled.connection[self.ready])
        self.cand[:len(first)] = first
        self.cand_mark[first] = True
        self.state = np.zeros(2, dtype=np.int64)  # counters, by runkernels.ARRIVED and runkernels.QUEUED
        self.state[runkernels.QUEUED] = len(first)
        self._out = np.zeros(compiled.n_connections, dtype=np.int64)

    @property
    def arrived(self) -> int:
        return int(self.state[runkernels.ARRIVED])

    def start(self, now: float, tolerance: float) -> np.ndarray:
        """Start, on every free connection, its first ready transfer; return them (ascending)."""
        if not self.state[runkernels.QUEUED]:
            return self._out[:0]
        count = runkernels.start(now, tolerance, self._out, self.conn_bounds, self.conn_scan, self.ready, self.busy,
                                 self.t_ready, self.t_start, self.last_dep, self.conn_last, self.enabler, self.cause,
                                 self.cand, self.cand_mark, self.state)
        return np.sort(self._out[:count])

    def sent(self, transfers: np.ndarray, bottleneck: np.ndarray, now: float) -> np.ndarray:
        """The last bytes of ``transfers`` left their senders; free the connections; return arrival times."""
        arrival = np.empty(len(transfers))
        comp = self.compiled
        runkernels.sent(transfers, bottleneck, now, comp.connection, comp.latency_s, self.busy, self.conn_last,
                        self.t_sent, self.bottleneck, arrival, self.cand, self.cand_mark, self.state)
        return arrival

    def arrive(self, transfers: np.ndarray, now: float) -> bool:
        """``transfers`` arrived: release what waited for them. True when the collective is done."""
        comp = self.compiled
        runkernels.arrive(transfers, now, comp.dep_offsets, comp.dep_targets, comp.connection, self.pending,
                          self.last_dep, self.t_ready, self.t_arrive, self.ready, self.cand, self.cand_mark, self.state)
        return self.arrived == comp.n_transfers

    def result(self, now: float, keep_chain: bool) -> RunResult:
        schedule = self.compiled.schedule
        elapsed = now - self.start_s
        algbw = self.size_bytes / elapsed / 1e9 if elapsed > 0 else float("inf")
        meta = schedule.meta
        label = meta.synthesizer if not meta.version else f"{meta.synthesizer} v{meta.version}"
        return RunResult(
            job=self.job, op=self.op, iteration=self.iteration, collective=schedule.collective, schedule=label,
            n_ranks=schedule.n_ranks, size_bytes=self.size_bytes, start_s=self.start_s, end_s=now,
            algbw_gbs=algbw, busbw_gbs=algbw * busbw_factor(schedule.collective, schedule.n_ranks),
            n_transfers=self.compiled.n_transfers, critical_chain=self._chain() if keep_chain else (),
        )

    def _chain(self) -> tuple[ChainStep, ...]:
        comp = self.compiled
        if not comp.n_transfers:
            return ()
        index = int(np.nanargmax(self.t_arrive))
        order: list[int] = []  # with slices, a chunk's slices may each appear
        while index >= 0 and len(order) <= comp.n_transfers:
            order.append(index)
            index = int(self.enabler[index])
        base = self.start_s
        return tuple(
            ChainStep(int(comp.original[i]), int(comp.chunk[i]) // comp.slices, int(comp.sender[i]), int(comp.receiver[i]),
                      int(comp.step[i]), float(self.t_start[i] - base), float(self.t_sent[i] - base),
                      float(self.t_arrive[i] - base), Cause(int(self.cause[i])), int(self.bottleneck[i]))
            for i in reversed(order)
        )
