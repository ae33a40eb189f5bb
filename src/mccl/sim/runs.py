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

from mccl.sim.analytic import busbw_factor
from mccl.sim.compiled import CompiledSchedule, csr_gather
from mccl.sim.results import Cause, ChainStep, RunResult

__all__ = ["RunState"]


class RunState:
    def __init__(self, job_index: int, job: str, op_index: int, op: str, iteration: int,
                 compiled: CompiledSchedule, size_bytes: float, start_s: float, paths: np.ndarray | None) -> None:
        self.job_index, self.job, self.op_index, self.op, self.iteration = job_index, job, op_index, op, iteration
        self.compiled = compiled
        self.size_bytes = size_bytes
        self.block_bytes = size_bytes / compiled.schedule.n_ranks
        self.start_s = start_s
        self.paths = paths
        count = compiled.n_transfers
        self.pending = compiled.n_deps.copy()
        self.busy = np.zeros(compiled.n_connections, dtype=bool)
        self.conn_last = np.full(compiled.n_connections, -1, dtype=np.int64)
        self.t_ready = np.full(count, np.nan)
        self.t_start = np.full(count, np.nan)
        self.t_sent = np.full(count, np.nan)
        self.t_arrive = np.full(count, np.nan)
        self.last_dep = np.full(count, -1, dtype=np.int64)
        self.enabler = np.full(count, -1, dtype=np.int64)
        self.cause = np.zeros(count, dtype=np.int8)
        self.bottleneck = np.full(count, -1, dtype=np.int64)
        self.arrived = 0
        self.waiting = np.flatnonzero(self.pending == 0)  # ready, not started; sorted
        self.t_ready[self.waiting] = start_s

    def start(self, now: float, tolerance: float) -> np.ndarray:
        """Start, on every free connection, its first ready transfer; return them."""
        waiting = self.waiting
        if not len(waiting):
            return waiting
        connection = self.compiled.connection[waiting]
        free = np.flatnonzero(~self.busy[connection])
        if not len(free):
            return waiting[:0]
        conns = connection[free]
        first = np.ones(len(free), dtype=bool)
        first[1:] = conns[1:] != conns[:-1]  # waiting is sorted, so connections are grouped
        chosen = free[first]
        transfers = waiting[chosen]
        keep = np.ones(len(waiting), dtype=bool)
        keep[chosen] = False
        self.waiting = waiting[keep]
        conns = conns[first]
        self.busy[conns] = True
        self.t_start[transfers] = now
        queued = self.t_ready[transfers] < now - tolerance
        last_dep = self.last_dep[transfers]
        self.enabler[transfers] = np.where(queued, self.conn_last[conns], last_dep)
        self.cause[transfers] = np.where(queued, int(Cause.QUEUE),
                                         np.where(last_dep >= 0, int(Cause.CHUNK), int(Cause.LAUNCH)))
        return transfers

    def sent(self, transfers: np.ndarray, bottleneck: np.ndarray, now: float) -> np.ndarray:
        """The last bytes of ``transfers`` left their senders; free the connections; return arrival times."""
        conns = self.compiled.connection[transfers]
        self.busy[conns] = False
        self.conn_last[conns] = transfers
        self.t_sent[transfers] = now
        self.bottleneck[transfers] = bottleneck
        return now + self.compiled.latency_s[transfers]

    def arrive(self, transfers: np.ndarray, now: float) -> bool:
        """``transfers`` arrived: release what waited for them. True when the collective is done."""
        comp = self.compiled
        self.t_arrive[transfers] = now
        self.arrived += len(transfers)
        lengths, targets = csr_gather(comp.dep_offsets, comp.dep_targets, transfers)
        if len(targets):
            sources = np.repeat(transfers, lengths)
            unique, counts = np.unique(targets, return_counts=True)
            self.pending[unique] -= counts
            released = self.pending[targets] == 0
            self.last_dep[targets[released]] = sources[released]
            ready = unique[self.pending[unique] == 0]
            if len(ready):
                self.t_ready[ready] = now
                self.waiting = np.union1d(self.waiting, ready)
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
