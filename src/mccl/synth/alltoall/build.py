"""From the master's solution to path flows, and from rounded units to a Schedule.

``path_flows`` reads the LP off the column pool: every column of block b with
rate x_T sends x_T along its path to each of b's destinations; per (source,
destination) pair the path rates are normalised to shares summing to 1.

``schedule_from_placement`` turns whole units into the IR: one chunk per
(pair, path) with fraction ``units / K``; its path is cut at every GPU it
enters (a relay), each piece one transfer whose route runs through switches
only; piece i happens at step i, so a relay forwards a chunk one step after it
received it. Everything is vectorized over chunks (a 512-GPU AllToAll has
~10⁵ chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.schedule import Chunks, Collective, Schedule, ScheduleMeta, Transfers
from mccl.schedule.incremental import TransferOrigin
from mccl.synth.alltoall.network import Network
from mccl.synth.alltoall.pool import ColumnPool
from mccl.synth.alltoall.rounding import Placement, route_load

__all__ = ["LPFlow", "merged_origin", "merged_schedule", "path_flows", "schedule_from_placement"]


@dataclass(frozen=True, eq=False)
class LPFlow:
    """An LP solution read per route: pair ``pair[i]`` (s * n + d) sends ``share[i]`` of its rate on
    pool path ``path[i]``; every pair gets ``z`` Gbit/s, and link a carries ``load[a]`` Gbit/s."""

    pair: np.ndarray
    path: np.ndarray
    share: np.ndarray
    z: float
    load: np.ndarray

    @classmethod
    def of(cls, pool: ColumnPool, x: np.ndarray, z: float) -> LPFlow:
        """The route flows of the master solution ``x`` (column rates) with optimum ``z``."""
        pair, path, share = path_flows(pool, x)
        return cls(pair, path, share, float(z), route_load(pool.paths[path], share * z, pool.n_links))


def path_flows(pool: ColumnPool, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(pair, path, share)`` of the LP solution; pair = s * n + d, shares sum to 1 per pair."""
    n = pool.n_ranks
    blocks = pool.blocks
    offsets, flat = pool.column_paths()
    count = len(x)
    active = np.flatnonzero(x > 1e-12 * max(float(x.max(initial=0.0)), 1e-300))
    block_of_col = pool.block[:count][active]
    sizes = blocks.sizes[block_of_col]
    starts = np.repeat(offsets[active], sizes)
    within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    entry_path = flat[starts + within].astype(np.int64)
    entry_block = np.repeat(block_of_col, sizes)
    entry_dest = blocks.dests[blocks.offsets[entry_block] + within]
    entry_pair = blocks.source[entry_block] * n + entry_dest
    entry_rate = np.repeat(x[active], sizes)
    key = entry_pair * (pool.paths.shape[0] + 1) + entry_path
    unique, inverse = np.unique(key, return_inverse=True)
    rate = np.bincount(inverse, weights=entry_rate)
    pair = unique // (pool.paths.shape[0] + 1)
    path = unique % (pool.paths.shape[0] + 1)
    pairs, pair_index = np.unique(pair, return_inverse=True)
    total = np.bincount(pair_index, weights=rate)
    return pair, path, rate / total[pair_index]


def schedule_from_placement(network: Network, pool: ColumnPool, placement: Placement,
                            meta: ScheduleMeta) -> Schedule:
    """The AllToAll schedule that sends ``placement``'s units along their paths."""
    n = network.n_ranks
    links = pool.paths[placement.path]
    valid = links >= 0
    lengths = valid.sum(axis=1)
    flat = links[valid].astype(np.int64)
    chunk_of_link = np.repeat(np.arange(len(links)), lengths)
    ends = network.is_gpu[network.head[flat]]  # the link enters a GPU: a transfer ends there
    transfer_of_link = np.cumsum(ends) - ends
    n_transfers = int(ends.sum())
    links_per_transfer = np.bincount(transfer_of_link, minlength=n_transfers)
    end_positions = np.flatnonzero(ends)
    t_chunk = chunk_of_link[end_positions]
    t_receiver = network.node_rank[network.head[flat[end_positions]]]
    first_transfer = np.concatenate([[0], np.cumsum(np.bincount(t_chunk, minlength=len(links)))[:-1]])
    t_step = np.arange(n_transfers) - first_transfer[t_chunk]
    source = placement.block // n
    t_sender = np.where(t_step == 0, source[t_chunk], np.roll(t_receiver, 1))
    chunks = Chunks(source, placement.block % n, placement.units / placement.chunks)
    transfers = Transfers(
        chunk=t_chunk,
        sender=t_sender,
        receiver=t_receiver,
        step=t_step,
        op=np.zeros(n_transfers, dtype=np.int8),
        route_offsets=np.concatenate([[0], np.cumsum(links_per_transfer)]),
        route_links=network.link_ids[flat],
    )
    return Schedule(Collective.ALLTOALL, network.ranks, chunks, transfers, meta)


def merged_schedule(previous: Schedule, keep: np.ndarray, fresh: Schedule, meta: ScheduleMeta) -> Schedule:
    """``previous``'s chunks where ``keep`` (with their transfers, as they were), then ``fresh``'s.

    A warm repair keeps most chunks of the previous schedule; copying their transfers costs a
    fraction of building them again from the placement (at 512 GPUs ~1.7 M transfers).
    The first transfers are ``merged_origin(previous, keep)``'s copies, in order.
    """
    old = previous.transfers
    kept_transfer = keep[old.chunk]
    chunk_id = (np.cumsum(keep) - 1).astype(np.int32)
    old_lengths = old.route_lengths
    lengths = np.concatenate([old_lengths[kept_transfer], fresh.transfers.route_lengths])
    dropped = np.flatnonzero(~kept_transfer)  # a few % of them: clear their hops, not a mask over every hop
    kept_hops = np.ones(len(old.route_links), dtype=bool)
    kept_hops[_hops_of(old.route_offsets[:-1][dropped], old_lengths[dropped])] = False
    kept_links = old.route_links[kept_hops]
    n_kept = int(keep.sum())
    new = fresh.transfers
    transfers = Transfers(
        chunk=_sealed([chunk_id[old.chunk[kept_transfer]], new.chunk + np.int32(n_kept)], np.int32),
        sender=_sealed([old.sender[kept_transfer], new.sender], np.int32),
        receiver=_sealed([old.receiver[kept_transfer], new.receiver], np.int32),
        step=_sealed([old.step[kept_transfer], new.step], np.int32),
        op=_sealed([old.op[kept_transfer], new.op], np.int8),
        route_offsets=_sealed([[0], np.cumsum(lengths)], np.int64),
        route_links=_sealed([kept_links, new.route_links], np.int32),
    )
    before, after = previous.chunks, fresh.chunks
    chunks = Chunks(_sealed([before.source[keep], after.source], np.int32),
                    _sealed([before.destination[keep], after.destination], np.int32),
                    _sealed([before.fraction[keep], after.fraction], np.float64))
    return Schedule(previous.collective, previous.ranks, chunks, transfers, meta)


def merged_origin(previous: Schedule, keep: np.ndarray, merged: Schedule) -> TransferOrigin:
    """Which transfers of ``merged_schedule(previous, keep, ...)`` copy ``previous``'s: its first ones, the
    kept chunks' transfers in their previous order; the fresh schedule's after them are new."""
    copied = np.flatnonzero(keep[previous.transfers.chunk])
    source = np.full(len(merged.transfers), -1, dtype=np.int64)
    source[:len(copied)] = copied
    return TransferOrigin(previous.transfers, source)


def _hops_of(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Positions in ``route_links`` of the routes starting at ``starts`` with ``lengths`` hops, in order."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths) + np.arange(total)


def _sealed(parts: list, dtype: type) -> np.ndarray:
    """The concatenation as a new read-only array (the IR then keeps it without another copy)."""
    array = np.concatenate(parts).astype(dtype, copy=False)
    array.setflags(write=False)
    return array
