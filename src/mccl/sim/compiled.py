"""A schedule lowered for the engine: connections, dependencies and routes as arrays.

Dependencies (mccl-paper §4, "a rank may forward a chunk only after it holds it").
Transfer t sends chunk c from rank u at step s. It may start once every transfer
*into* (u, c) at an earlier step has arrived: for a copy that is the one incoming
copy (none when u is the chunk's source), for a reduction every partial sum that
u must fold in first (none at u's first send, which carries u's own input). Steps
are therefore a partial order, not barriers: a chunk that arrives early moves on
early.

Connections (what the executor does, :mod:`mccl.runtime.executor`). Every chunk's
transfer on a hop (sender, receiver, route) is one stream: the chunk's slices cross
it one after another (the executor posts them in order), each sent once it is held (a relay
forwards slice j while slice j + 1 is still arriving). Streams are independent:
two chunks on one hop (two trees of a packing that use the same logical link, two
chunks of an AllToAll block on one path) are two streams, as two NCCL channels or
two MSCCL thread blocks are, and share the links max-min fairly with every other
stream. Equal chunks (the tree packing cuts a source's data into k equal trees)
therefore get the link shares they were planned with: a logical link of
multiplicity m carries m streams and gets m shares. (Until 2026-11-30 the chunks of
a block that took the same path were one stream, so m identical trees got one
share between them: on the healthy 2×8 HPN sources 0 and 8 send all 6 trees alike,
and got one share for six.) Without serialization every transfer (every slice) is
its own connection. Not modeled: the stepwise driver's wait at the end of every step
(NCCL), and gloo's one socket per rank pair (the loopback test transport).

Slices. With ``slices`` = T > 1 every chunk is cut into T equal slices that take
its path one after another (the same stream, so the same connections): a relay
forwards slice 0 while slice 1 is still arriving. This is how a runtime executes
a schedule on a large buffer — MSCCL runs the algorithm over the buffer tile by
tile, NCCL moves a chunk in slices through its FIFOs — and what the analytic bound
assumes ("perfect pipelining"). With T = 1 a transfer forwards only a whole chunk
(store and forward), the literal reading of the IR. The executor picks T per call
from the size (:mod:`mccl.schedule.slicing`); ``SimOptions.executor()`` does the same.

Internal order: transfers sorted by (connection, step, chunk), so a connection's
transfers (a stream's slices) are contiguous and its queue order is index order. ``original`` maps
back to the schedule's transfer index, ``chunk // slices`` to its chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.errors import InvalidSchedule
from mccl.schedule import Collective, Schedule
from mccl.topology import Topology

__all__ = ["CompiledSchedule", "compile_schedule", "csr_gather"]

_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant for route hashing


@dataclass(frozen=True, eq=False)
class CompiledSchedule:
    schedule: Schedule
    original: np.ndarray  # internal index -> schedule transfer index
    chunk: np.ndarray
    sender: np.ndarray
    receiver: np.ndarray
    step: np.ndarray
    fraction: np.ndarray  # of a block (S / n bytes)
    latency_s: np.ndarray  # route latency, sum of the links' latencies
    route_offsets: np.ndarray
    route_links: np.ndarray
    connection: np.ndarray  # connection id, nondecreasing
    n_connections: int
    conn_sender: np.ndarray  # rank of each connection's sender
    conn_receiver: np.ndarray
    conn_first: np.ndarray  # internal index of each connection's first transfer
    hop: np.ndarray  # id of (sender, receiver, route) per transfer: flows of one hop send older steps first
    slices: int  # each chunk of the schedule is this many internal chunks
    dep_offsets: np.ndarray  # CSR: transfers that wait for transfer d
    dep_targets: np.ndarray
    n_deps: np.ndarray  # how many arrivals each transfer waits for

    @property
    def n_transfers(self) -> int:
        return len(self.original)

    def conn_route(self, connection: int) -> tuple[int, ...]:
        """The route (link ids) of a connection."""
        first = int(self.conn_first[connection])
        return tuple(int(x) for x in self.route_links[self.route_offsets[first]:self.route_offsets[first + 1]])


def csr_gather(offsets: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of a CSR array: ``(lengths, concatenated values)``."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return lengths, values[:0]
    out_starts = np.cumsum(lengths) - lengths
    return lengths, values[np.repeat(starts - out_starts, lengths) + np.arange(total)]


def _route_hash(offsets: np.ndarray, links: np.ndarray) -> np.ndarray:
    """A 64-bit polynomial hash of every route (collisions ~2⁻⁶⁴ per pair)."""
    lengths = np.diff(offsets)
    position = np.arange(len(links)) - np.repeat(offsets[:-1], lengths)
    powers = np.ones(int(lengths.max(initial=1)) + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(1, len(powers)):
            powers[i] = powers[i - 1] * _HASH_BASE
        terms = (links.astype(np.uint64) + np.uint64(1)) * powers[position]
    return np.add.reduceat(terms, offsets[:-1]) if len(links) else np.zeros(len(lengths), dtype=np.uint64)


def compile_schedule(
    schedule: Schedule,
    topology: Topology,
    route_offsets: np.ndarray,
    route_links: np.ndarray,
    *,
    serialize_connections: bool = True,
    slices: int = 1,
) -> CompiledSchedule:
    """Lower ``schedule`` (with routes given by a path policy) for the engine."""
    if slices < 1:
        raise InvalidSchedule(f"slices must be >= 1, got {slices}")
    transfers = schedule.transfers
    count = len(transfers) * slices
    route_offsets = np.asarray(route_offsets, dtype=np.int64)
    route_links = np.asarray(route_links, dtype=np.int64)
    source_index = np.repeat(np.arange(len(transfers), dtype=np.int64), slices)
    if slices > 1:
        sliced_lengths, route_links = csr_gather(route_offsets, route_links, source_index)
        route_offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(sliced_lengths, out=route_offsets[1:])
    lengths = np.diff(route_offsets)
    if count and lengths.min() < 1:
        bad = int(np.argmin(lengths))
        raise InvalidSchedule(f"transfer {bad} has an empty route; validate the schedule first")
    if len(route_links) and int(route_links.max()) >= len(topology.links):
        raise InvalidSchedule(f"schedule uses link ids beyond topology {topology.name!r}; validate it first")
    sender = transfers.sender.astype(np.int64)[source_index]
    receiver = transfers.receiver.astype(np.int64)[source_index]
    chunk = transfers.chunk.astype(np.int64)[source_index] * slices + np.tile(np.arange(slices), len(transfers))
    step = transfers.step.astype(np.int64)[source_index]
    n_chunks = len(schedule.chunks) * slices
    route_id = _route_hash(route_offsets, route_links)
    hop_keys = np.stack([sender.astype(np.uint64), receiver.astype(np.uint64), route_id], axis=1)
    hop = np.unique(hop_keys, axis=0, return_inverse=True)[1].reshape(-1) if count else np.zeros(0, np.int64)
    if serialize_connections:
        stream = chunk // slices  # one stream per chunk and hop: its slices, one after another
        key_order = np.lexsort((stream, route_id, receiver, sender))
        same = np.zeros(count, dtype=bool)
        if count:
            a, b = key_order[1:], key_order[:-1]
            same[1:] = ((sender[a] == sender[b]) & (receiver[a] == receiver[b]) & (route_id[a] == route_id[b])
                        & (stream[a] == stream[b]))
        group = np.empty(count, dtype=np.int64)
        group[key_order] = np.cumsum(~same) - 1
    else:
        group = np.arange(count, dtype=np.int64)
    order = np.lexsort((chunk, step, group))
    connection = group[order]
    # Renumber connections 0..C-1 in internal order (already nondecreasing).
    new_conn = np.zeros(count, dtype=bool)
    new_conn[:1] = True
    new_conn[1:] = connection[1:] != connection[:-1]
    connection = np.cumsum(new_conn) - 1
    n_connections = int(connection[-1]) + 1 if count else 0
    lengths_sorted, links_sorted = csr_gather(route_offsets, route_links, order)
    offsets_sorted = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths_sorted, out=offsets_sorted[1:])
    latency = topology.latencies_us[links_sorted] * 1e-6
    latency_s = np.add.reduceat(latency, offsets_sorted[:-1]) if count else np.zeros(0)
    sender, receiver, chunk, step = sender[order], receiver[order], chunk[order], step[order]
    firsts = np.flatnonzero(new_conn)

    dep_offsets, dep_targets, n_deps = _dependencies(sender, receiver, chunk, step, n_chunks)
    fraction = schedule.chunks.fraction[chunk // slices] / slices
    compiled = CompiledSchedule(
        schedule=schedule, original=source_index[order], chunk=chunk, sender=sender, receiver=receiver,
        step=step, fraction=fraction, latency_s=latency_s, route_offsets=offsets_sorted, route_links=links_sorted,
        connection=connection, n_connections=n_connections, conn_sender=sender[firsts], conn_receiver=receiver[firsts],
        conn_first=firsts, hop=hop[order].astype(np.int64), slices=slices, dep_offsets=dep_offsets, dep_targets=dep_targets, n_deps=n_deps,
    )
    _check_sources(compiled)
    return compiled


def _dependencies(
    sender: np.ndarray, receiver: np.ndarray, chunk: np.ndarray, step: np.ndarray, n_chunks: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of "transfer d's arrival lets transfer t go": d into (u, c) at a step before t's."""
    count = len(sender)
    width = max(n_chunks, 1)
    key_out = sender * width + chunk
    key_in = receiver * width + chunk
    out_order = np.argsort(key_out, kind="stable")
    sorted_out = key_out[out_order]
    lo = np.searchsorted(sorted_out, key_in, side="left")
    hi = np.searchsorted(sorted_out, key_in, side="right")
    counts = hi - lo
    total = int(counts.sum())
    source = np.repeat(np.arange(count, dtype=np.int64), counts)
    position = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(total)
    target = out_order[position]
    keep = step[target] > step[source]
    source, target = source[keep], target[keep]
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(source, minlength=count), out=offsets[1:])
    n_deps = np.bincount(target, minlength=count).astype(np.int64)
    return offsets, target, n_deps


def _check_sources(compiled: CompiledSchedule) -> None:
    """A copy that waits for nothing must be sent by the chunk's source (else it never holds it)."""
    schedule = compiled.schedule
    if schedule.collective not in (Collective.ALLGATHER, Collective.ALLTOALL):
        return
    source = schedule.chunks.source[compiled.chunk // compiled.slices]
    bad = np.flatnonzero((compiled.n_deps == 0) & (compiled.sender != source))
    if len(bad):
        i = int(bad[0])
        raise InvalidSchedule(
            f"transfer {int(compiled.original[i])} sends chunk {int(compiled.chunk[i]) // compiled.slices} from rank "
            f"{int(compiled.sender[i])} at step {int(compiled.step[i])}, but that rank never receives it earlier; "
            "validate the schedule first")
