"""The grouped engine: one collective alone on the fabric, streams of equal weight, solved per hop.

What it computes is what :mod:`mccl.sim.engine` computes for ``simulate_schedule(schedule,
topology, size, options=SimOptions.executor(...))`` — the same connections, dependencies,
slices, event batching and max-min fair rates (tests compare the two on small fabrics) — but
far faster (BENCHMARKS.md, 2026-12-01 third session: the 128-GPU packing at 1 GiB, 2.2 M
flows, in ~2 min CPU; 5–13× the general engine's speed where both were run):

* rates are solved per *hop* (sender, receiver, route) with the number of flows it carries,
  not per flow (equal weights give every flow of a hop the same rate; see
  :mod:`mccl.sim.classkernels`), and a hop whose finishing slice is replaced by the next one
  in the same batch needs no re-solve;
* slices are implicit (a counter per transfer, not T copies of every transfer), so the
  lowering and the memory stay those of the schedule;
* the whole event loop is one compiled function (the general engine's Python loop costs
  ~100 µs per event batch; a 512-GPU run has millions of batches).

It applies when the run is a single collective with no background flows, capacity changes
or hook, connections serialized (the default) and ``step_priority == 1`` (equal streams: a
hop's flows of different steps would otherwise weigh differently). ``SimOptions.engine``
chooses: ``"auto"`` (this engine where it applies), ``"flows"`` (always the general one),
``"grouped"`` (this one, an error where it does not apply).
"""

from __future__ import annotations

import numpy as np

from mccl.errors import InvalidSchedule, MCCLError
from mccl.schedule import Collective, Schedule
from mccl.sim import classkernels
from mccl.sim.analytic import busbw_factor
from mccl.sim.compiled import _dependencies, _route_hash
from mccl.sim.inputs import SimOptions
from mccl.sim.results import Cause, ChainStep, RunResult
from mccl.topology import Topology

__all__ = ["applies", "simulate_grouped"]

_BYTES_PER_GBIT = 1e9 / 8
_EPS = 1e-11  # relative tolerance of the bottleneck check, as mccl.sim.flows


def applies(options: SimOptions) -> bool:
    """Whether the grouped engine models a single collective under ``options`` exactly."""
    return options.step_priority == 1.0 and options.serialize_connections


def _groups(*keys: np.ndarray) -> np.ndarray:
    """A dense id per distinct tuple of ``keys`` (numbered in the keys' sort order)."""
    count = len(keys[0])
    order = np.lexsort(keys[::-1])
    new = np.ones(count, dtype=bool)
    if count:
        same = np.ones(count - 1, dtype=bool)
        for key in keys:
            same &= key[order[1:]] == key[order[:-1]]
        new[1:] = ~same
    ids = np.empty(count, dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


def _csr(rows: np.ndarray, values: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(rows, kind="stable")
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=offsets[1:])
    return offsets, values[order].astype(np.int64)


def simulate_grouped(schedule: Schedule, topology: Topology, size_bytes: float, options: SimOptions,
                     job: str = "job") -> RunResult:
    """Simulate ``schedule`` alone at ``size_bytes`` (see the module docstring); the launch is at 0."""
    if not applies(options):
        raise MCCLError("the grouped engine needs step_priority == 1 and serialized connections "
                        f"(got {options.step_priority} and {options.serialize_connections}); use engine='flows'")
    slices = options.slices_for(schedule, size_bytes)
    transfers = schedule.transfers
    n = len(transfers)
    if n == 0:
        return _result(schedule, job, size_bytes, 0.0, 0, ())
    offsets = np.asarray(transfers.route_offsets, dtype=np.int64)
    links = np.asarray(transfers.route_links, dtype=np.int64)
    lengths = np.diff(offsets)
    if lengths.min() < 1:
        raise InvalidSchedule(f"transfer {int(np.argmin(lengths))} has an empty route; validate the schedule first")
    if int(links.max()) >= len(topology.links) or int(links.min()) < 0:
        raise InvalidSchedule(f"schedule uses link ids beyond topology {topology.name!r}; validate it first")
    sender = transfers.sender.astype(np.int64)
    receiver = transfers.receiver.astype(np.int64)
    chunk = transfers.chunk.astype(np.int64)
    step = transfers.step.astype(np.int64)
    route_id = _route_hash(offsets, links).astype(np.int64)
    hop = _groups(sender, receiver, route_id)
    connection = _groups(sender, receiver, route_id, chunk)
    order = np.lexsort((chunk, step, connection))  # internal order: a connection's queue, contiguous
    sender, receiver, chunk, step = sender[order], receiver[order], chunk[order], step[order]
    connection, hop = connection[order], hop[order]
    n_conn = int(connection.max()) + 1
    conn_lo = np.searchsorted(connection, np.arange(n_conn + 1)).astype(np.int64)
    dep_lo, dep_tg, n_deps = _dependencies(sender, receiver, chunk, step, len(schedule.chunks))
    source = np.repeat(np.arange(n, dtype=np.int64), np.diff(dep_lo))
    in_lo, in_src = _csr(dep_tg, source, n)
    _check_sources(schedule, order, chunk, sender, n_deps)
    link_lat = topology.latencies_us * 1e-6
    lat = np.add.reduceat(link_lat[links], offsets[:-1])[order]
    block = size_bytes / schedule.n_ranks
    size = schedule.chunks.fraction[chunk] / slices * block
    # classes (hops): their routes, the classes on each link, a heap segment each for their flows
    n_classes = int(hop.max()) + 1
    first = np.zeros(n_classes, dtype=np.int64)
    first[hop[::-1]] = order[::-1]  # a schedule transfer of each class
    c_len = lengths[first]
    c_lo = np.zeros(n_classes + 1, dtype=np.int64)
    np.cumsum(c_len, out=c_lo[1:])
    c_links = links[np.repeat(offsets[first] - c_lo[:-1], c_len) + np.arange(int(c_lo[-1]))]
    l_lo, l_cls = _csr(c_links, np.repeat(np.arange(n_classes, dtype=np.int64), c_len), len(topology.links))
    f_base = np.zeros(n_classes, dtype=np.int64)
    np.cumsum(np.bincount(hop, minlength=n_classes)[:-1], out=f_base[1:])
    capacity = np.asarray(topology.capacities_gbps, dtype=float) * _BYTES_PER_GBIT
    chain = options.keep_chain
    width = n * slices if chain else 1
    t_ready, t_start, t_sent, t_arrive = (np.full(width, np.nan) for _ in range(4))
    last_dep, enabler, t_bneck = (np.full(width, -1, dtype=np.int64) for _ in range(3))
    cause = np.zeros(width, dtype=np.int8)
    counters = np.zeros(6, dtype=np.int64)  # batches, re-solves, flows, rounds, classes and links solved
    status, end = classkernels.run_grouped(
        slices, conn_lo, connection, hop, size, lat, dep_lo, dep_tg, in_lo, in_src, c_lo, c_links, l_lo, l_cls,
        f_base, capacity, options.time_tolerance, options.max_time_s, _EPS, chain, t_ready, t_start, t_sent,
        t_arrive, last_dep, enabler, cause, t_bneck, counters)
    if status == classkernels.STALLED:
        raise MCCLError(f"simulation stalled at t={end:.9g} s: job {job!r} {schedule.collective.value!r} has "
                        "transfers that never become ready (a dependency that is never sent)")
    if status == classkernels.TOO_LONG:
        raise MCCLError(f"simulation passed max_time_s={options.max_time_s:g} s at 1 unfinished collectives")
    steps: tuple[ChainStep, ...] = ()
    if chain:
        index = int(np.nanargmax(t_arrive))
        walk: list[int] = []
        while index >= 0 and len(walk) <= width:
            walk.append(index)
            index = int(enabler[index])
        steps = tuple(
            ChainStep(int(order[i // slices]), int(chunk[i // slices]), int(sender[i // slices]),
                      int(receiver[i // slices]), int(step[i // slices]), float(t_start[i]), float(t_sent[i]),
                      float(t_arrive[i]), Cause(int(cause[i])), int(t_bneck[i]))
            for i in reversed(walk))
    return _result(schedule, job, size_bytes, float(end), n * slices, steps)


def _check_sources(schedule: Schedule, order: np.ndarray, chunk: np.ndarray, sender: np.ndarray,
                   n_deps: np.ndarray) -> None:
    """A copy that waits for nothing must be sent by the chunk's source (as :mod:`mccl.sim.compiled`)."""
    if schedule.collective not in (Collective.ALLGATHER, Collective.ALLTOALL):
        return
    bad = np.flatnonzero((n_deps == 0) & (sender != schedule.chunks.source[chunk]))
    if len(bad):
        i = int(bad[0])
        raise InvalidSchedule(
            f"transfer {int(order[i])} sends chunk {int(chunk[i])} from rank {int(sender[i])}, but that rank never "
            "receives it earlier; validate the schedule first")


def _result(schedule: Schedule, job: str, size_bytes: float, end: float, n_transfers: int,
            chain: tuple[ChainStep, ...]) -> RunResult:
    meta = schedule.meta
    label = meta.synthesizer if not meta.version else f"{meta.synthesizer} v{meta.version}"
    algbw = size_bytes / end / 1e9 if end > 0 else float("inf")
    return RunResult(job=job, op=schedule.collective.value, iteration=0, collective=schedule.collective,
                     schedule=label, n_ranks=schedule.n_ranks, size_bytes=size_bytes, start_s=0.0, end_s=end,
                     algbw_gbs=algbw, busbw_gbs=algbw * busbw_factor(schedule.collective, schedule.n_ranks),
                     n_transfers=n_transfers, critical_chain=chain)
