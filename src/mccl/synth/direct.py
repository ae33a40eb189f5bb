"""NCCL-style AllToAll: every rank sends every other rank its block directly (and the same one-step
AllGather and ReduceScatter, :func:`direct_allgather`, :func:`direct_reducescatter`).

One flow per (source, destination), all started at once, each on the ECMP-chosen
shortest route of its flow. With ``pxn=True`` (the default, as NCCL ≥ 2.12 does on
rail-optimized fabrics: "PCI × NVLink") a block for a GPU on another host and
another rail first moves over the NVSwitch to the local GPU on the destination's
rail, and leaves through that GPU's NIC, so inter-host traffic stays rail-to-rail.
The self block is a local copy and moves no data. O(n² · k) transfers, built as arrays: one
vectorized route search per source (:func:`mccl.topology.routebatch.route_dag`) serves all of its
blocks, and the ECMP keys are hashed without building their strings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mccl.errors import SynthesisError
from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta, Transfers
from mccl.synth.common import check_ranks, describe_on, route_or_infeasible
from mccl.topology import Topology
from mccl.topology.routebatch import crc32_of_concatenation, crc32_parts
from mccl.topology.routing import router_for

__all__ = ["direct_allgather", "direct_alltoall", "direct_reducescatter"]


def _relays(topology: Topology, ranks: Sequence[str], source: np.ndarray, destination: np.ndarray) -> np.ndarray:
    """Per block ``(source[i], destination[i])``: the rank on the source's host and the destination's
    rail that forwards it (PXN), -1 when none helps (same host, same rail, unlabelled GPU, or no rank
    there). When two ranks share a (host, rail), the later one relays."""
    nodes = [topology.node(gpu) for gpu in ranks]
    host_ids: dict[str, int] = {}
    rail_ids: dict[int, int] = {}
    host = np.array([-1 if node.host is None else host_ids.setdefault(node.host, len(host_ids)) for node in nodes])
    rail = np.array([-1 if node.rail is None else rail_ids.setdefault(node.rail, len(rail_ids)) for node in nodes])
    at = np.full((max(len(host_ids), 1), max(len(rail_ids), 1)), -1, dtype=np.int32)
    labelled = np.flatnonzero((host >= 0) & (rail >= 0))
    at[host[labelled], rail[labelled]] = labelled  # numpy assigns in order: the last rank wins
    src_host, dst_host, src_rail, dst_rail = host[source], host[destination], rail[source], rail[destination]
    helps = (src_host >= 0) & (src_host != dst_host) & (dst_rail >= 0) & (src_rail != dst_rail)
    return np.where(helps, at[np.maximum(src_host, 0), np.maximum(dst_rail, 0)], -1).astype(np.int32)


def _ecmp_hashes(n: int, source: np.ndarray, destination: np.ndarray, block_of_hop: np.ndarray,
                 hop_from: np.ndarray, hop_to: np.ndarray) -> np.ndarray:
    """CRC32 of each hop's ECMP key ``a2a:{s}>{d}:{a}>{b}``, part by part (no string per key)."""
    prefix, middle, tail_from, tail_to = (crc32_parts([template.format(i).encode() for i in range(n)])
                                          for template in ("a2a:{}>", "{}:", "{}>", "{}"))
    per_block = crc32_of_concatenation([(prefix[0][source], prefix[1][source]),
                                        (middle[0][destination], middle[1][destination])])
    return crc32_of_concatenation([(per_block[block_of_hop], np.zeros(0)), (tail_from[0][hop_from], tail_from[1][hop_from]),
                                   (tail_to[0][hop_to], tail_to[1][hop_to])])


def direct_alltoall(topology: Topology, ranks: Sequence[str] | None = None, *, chunks: int = 1,
                    pxn: bool = True) -> Schedule:
    """Every block straight to its destination (through its PXN relay with ``pxn``), ECMP-routed.

    Vectorized: the blocks, relays and ECMP keys' hashes as arrays, all routes in one
    :meth:`~mccl.topology.Router.route_many` call; transfers, routes and ECMP choices equal the
    block-by-block construction's (``tests/test_fast_paths.py``)."""
    chosen = check_ranks(topology, ranks)
    if chunks < 1:
        raise SynthesisError(f"chunks must be >= 1, got {chunks}")
    n = len(chosen)
    # blocks in (source, destination) order, the self block left out
    source = np.repeat(np.arange(n, dtype=np.int32), n - 1)
    destination = np.tile(np.arange(n - 1, dtype=np.int32), n)
    destination += destination >= source
    relay = _relays(topology, chosen, source, destination) if pxn else np.full(len(source), -1, dtype=np.int32)
    hops = np.where(relay >= 0, 2, 1).astype(np.int32)
    first_hop = np.zeros(len(source) + 1, dtype=np.int64)
    np.cumsum(hops, out=first_hop[1:])
    block_of_hop = np.repeat(np.arange(len(source), dtype=np.int32), hops)
    step_of_hop = (np.arange(int(first_hop[-1]), dtype=np.int64) - first_hop[:-1][block_of_hop]).astype(np.int32)
    first_step = step_of_hop == 0
    hop_relay = relay[block_of_hop]
    hop_from = np.where(first_step, source[block_of_hop], hop_relay)
    hop_to = np.where(first_step & (hop_relay >= 0), hop_relay, destination[block_of_hop])
    hashes = _ecmp_hashes(n, source, destination, block_of_hop, hop_from, hop_to)
    router = router_for(topology)
    gpu_position = router.positions(chosen)
    lengths, links = router.route_many(gpu_position[hop_from], gpu_position[hop_to], hashes)
    missing = np.flatnonzero(lengths < 0)
    if len(missing):  # the first block in order that cannot be routed names itself
        hop = int(missing[0])
        block = int(block_of_hop[hop])
        a, b = int(hop_from[hop]), int(hop_to[hop])
        route_or_infeasible(router, chosen[a], chosen[b], f"a2a:{source[block]}>{destination[block]}:{a}>{b}",
                            f"direct AllToAll (block rank {source[block]} -> rank {destination[block]})")
    hop_start = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=hop_start[1:])
    if chunks == 1:  # one transfer per hop, in hop order
        transfers = Transfers(block_of_hop, hop_from, hop_to, step_of_hop, np.zeros(len(hop_from), dtype=np.int8),
                              hop_start, links.astype(np.int32))
    else:  # block by block, piece by piece, hop by hop
        per_block = hops * chunks
        block_of_row = np.repeat(np.arange(len(source)), per_block)
        row_start = np.zeros(len(source) + 1, dtype=np.int64)
        np.cumsum(per_block, out=row_start[1:])
        within = np.arange(int(row_start[-1])) - row_start[:-1][block_of_row]
        hop_of_row = first_hop[:-1][block_of_row] + within % hops[block_of_row]
        chunk = block_of_row * chunks + within // hops[block_of_row]
        row_lengths = lengths[hop_of_row]
        route_offsets = np.zeros(len(hop_of_row) + 1, dtype=np.int64)
        np.cumsum(row_lengths, out=route_offsets[1:])
        link_index = (np.repeat(hop_start[:-1][hop_of_row] - route_offsets[:-1], row_lengths)
                      + np.arange(int(route_offsets[-1])))
        transfers = Transfers(chunk.astype(np.int32), hop_from[hop_of_row], hop_to[hop_of_row], step_of_hop[hop_of_row],
                              np.zeros(len(hop_of_row), dtype=np.int8), route_offsets, links[link_index].astype(np.int32))
    chunk_table = Chunks(np.repeat(source, chunks), np.repeat(destination, chunks), np.full(len(source) * chunks, 1.0 / chunks))
    schedule = Schedule(Collective.ALLTOALL, chosen, chunk_table, transfers,
                        ScheduleMeta("alltoall.direct", topology=topology.name,
                                     inputs=(("chunks", str(chunks)), ("pxn", str(pxn).lower()))))
    return describe_on(schedule, topology)


def _one_step(topology: Topology, ranks: Sequence[str] | None, chunks: int, collective: Collective,
              what: str) -> Schedule:
    """Every rank sends every other rank one block straight, all in step 0: rank ``s``'s own block
    (AllGather: it is the block's source) or its contribution to rank ``d``'s block (ReduceScatter:
    ``d`` owns it), ``chunks`` pieces each."""
    chosen = check_ranks(topology, ranks)
    if chunks < 1:
        raise SynthesisError(f"chunks must be >= 1, got {chunks}")
    n = len(chosen)
    gather = collective is Collective.ALLGATHER
    tag, method = ("ag", "allgather.direct") if gather else ("rs", "reducescatter.direct")
    router = router_for(topology)
    chunk_col, sender, receiver, offsets, links = [], [], [], [0], []
    for distance in range(1, n):  # every rank's first send goes to its neighbour, none all to one rank
        for source in range(n):
            peer = (source + distance) % n
            route = route_or_infeasible(router, chosen[source], chosen[peer], f"{tag}:{source}>{peer}",
                                        f"{what} (rank {source} -> rank {peer})")
            for piece in range(chunks):
                chunk_col.append((source if gather else peer) * chunks + piece)
                sender.append(source)
                receiver.append(peer)
                links.extend(route)
                offsets.append(len(links))
    count = len(chunk_col)
    op = np.zeros(count) if gather else np.ones(count)  # TransferOp.COPY / TransferOp.REDUCE
    transfers = Transfers(np.array(chunk_col), np.array(sender), np.array(receiver), np.zeros(count), op,
                          np.array(offsets), np.array(links))
    blocks = np.repeat(np.arange(n, dtype=np.int32), chunks)
    unset = np.full(n * chunks, -1, dtype=np.int32)
    chunk_table = Chunks(blocks if gather else unset, unset if gather else blocks, np.full(n * chunks, 1.0 / chunks))
    schedule = Schedule(collective, chosen, chunk_table, transfers,
                        ScheduleMeta(method, topology=topology.name, inputs=(("chunks", str(chunks)),)))
    return describe_on(schedule, topology)


def direct_allgather(topology: Topology, ranks: Sequence[str] | None = None, *, chunks: int = 1) -> Schedule:
    """Every rank sends its block straight to every other rank, all in one step.

    The ring's bytes per rank (``n − 1`` blocks out, ``n − 1`` in) and nothing to forward, so
    nothing to pipeline: on gloo the executor runs it as one alltoallv, every wait in C++
    (:func:`mccl.runtime.executor.default_driver`). Where every pair has its own full-bandwidth
    path (one switch, one host) that is also the fastest AllGather; on a fabric without full
    bisection a ring or a tree packing loads the links less."""
    return _one_step(topology, ranks, chunks, Collective.ALLGATHER, "direct AllGather")


def direct_reducescatter(topology: Topology, ranks: Sequence[str] | None = None, *, chunks: int = 1) -> Schedule:
    """Every rank sends its contribution to block ``b`` straight to rank ``b``, all in one step.

    The same bytes per rank as a ring (``n − 1`` blocks out, ``n − 1`` in), no relay and no
    partial sum in flight: the owner receives every contribution unsummed, so it can add them in
    any order it must (the torch backend adds them in gloo's, :mod:`mccl.runtime.reduction_order`).
    On a fabric without full bisection a ring or a tree loads the links less."""
    return _one_step(topology, ranks, chunks, Collective.REDUCESCATTER, "direct ReduceScatter")
