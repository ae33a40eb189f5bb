"""Compact transfers: a ring schedule described by its orders and hop routes, expanded lazily.

An 8-channel ring AllGather on 2048 GPUs is C · n · (n − 1) = 33.5 M transfers, yet it is
fully described by C rank orders and the C · n routes of its hops. :class:`RingTransfers`
stores only that (:class:`RingPattern`) and *is* a :class:`~mccl.schedule.Transfers`: every
column (``chunk``, ``sender``, …, ``route_links``) exists and is materialized, vectorized, the
first time anything reads one (the flow simulator, the validator, the JSON writer), in exactly
the order and with exactly the values of the transfer-by-transfer construction. The three
aggregates that accounting and the α-β model need are answered in closed form without
materializing (O(C · n · route length) instead of O(C · n² · k)):

* ``link_sums``: hop j of ring r (``order[j] → order[j+1]``) carries every chunk of ring r
  except one block's — AllGather: the block of the hop's receiver (it starts there);
  ReduceScatter: the block of the hop's sender (it ends there); AllReduce: both phases.
* ``step_max_route_cost``: at every step every hop of every ring is busy (each block is at a
  different position of the ring), so each step costs the costliest hop route.
* ``len``, ``n_steps``, ``max_link`` from the pattern's sizes.

Transfer order (what materialization reproduces): ring by ring, block by block, piece by
piece, the ReduceScatter steps then the AllGather steps; chunk ``block · C·k + ring · k +
piece``. Construction: :func:`mccl.synth.ring.ring_schedule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mccl.errors import InvalidSchedule
from mccl.schedule.ir import Collective, TransferOp, Transfers

__all__ = ["RingPattern", "RingTransfers", "CompactTransfers"]

_COLUMNS = ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links")


@dataclass(frozen=True, eq=False)
class RingPattern:
    """``orders[r]``: ring r's ranks in ring order; ``pieces``: chunks per block and ring; the
    route of hop ``(r, j)`` (``orders[r, j] → orders[r, (j + 1) % n]``) is
    ``hop_links[hop_offsets[r·n + j] : hop_offsets[r·n + j + 1]]``."""

    collective: Collective
    orders: np.ndarray  # (rings, n) int64
    pieces: int
    hop_offsets: np.ndarray  # (rings · n + 1,) int64
    hop_links: np.ndarray  # int32

    def __post_init__(self) -> None:
        object.__setattr__(self, "collective", Collective(self.collective))
        orders = np.array(self.orders, dtype=np.int64, ndmin=2)
        rings, n = orders.shape
        if self.collective is Collective.ALLTOALL:
            raise InvalidSchedule("a ring pattern carries AllGather, ReduceScatter or AllReduce, not AllToAll")
        if n < 2 or rings < 1 or self.pieces < 1:
            raise InvalidSchedule(f"a ring pattern needs >= 2 ranks, >= 1 ring and >= 1 piece, got {n}, {rings}, {self.pieces}")
        if not np.array_equal(np.sort(orders, axis=1), np.broadcast_to(np.arange(n), orders.shape)):
            raise InvalidSchedule("every ring order must visit each rank 0..n-1 exactly once")
        offsets = np.asarray(self.hop_offsets, dtype=np.int64)
        links = np.asarray(self.hop_links, dtype=np.int32)
        if len(offsets) != rings * n + 1 or offsets[0] != 0 or offsets[-1] != len(links) or np.any(np.diff(offsets) < 1):
            raise InvalidSchedule("hop routes: one non-empty route per ring hop, offsets from 0 to len(hop_links)")
        for name, value in (("orders", orders), ("hop_offsets", offsets), ("hop_links", links)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def rings(self) -> int:
        return int(self.orders.shape[0])

    @property
    def n(self) -> int:
        return int(self.orders.shape[1])

    @property
    def phases(self) -> tuple[Collective, ...]:
        """The ring passes in step order: ReduceScatter, AllGather, or both (AllReduce)."""
        if self.collective is Collective.ALLREDUCE:
            return (Collective.REDUCESCATTER, Collective.ALLGATHER)
        return (self.collective,)

    @property
    def steps_per_chunk(self) -> int:
        return len(self.phases) * (self.n - 1)

    @property
    def hop_lengths(self) -> np.ndarray:
        return np.diff(self.hop_offsets)

    def hop_sums(self, link_values: np.ndarray) -> np.ndarray:
        """Per hop ``(r · n + j)``, the sum of ``link_values`` over its route."""
        hop_of_link = np.repeat(np.arange(self.rings * self.n), self.hop_lengths)
        return np.bincount(hop_of_link, weights=link_values[self.hop_links], minlength=self.rings * self.n)

    def chunk_ids(self) -> np.ndarray:
        """``(rings, n blocks, pieces)``: the chunk id of each piece of each block on each ring."""
        rings, n, pieces = self.rings, self.n, self.pieces
        return (np.arange(n)[None, :, None] * (rings * pieces) + np.arange(rings)[:, None, None] * pieces
                + np.arange(pieces)[None, None, :])

    def hop_loads(self, chunk_weight: np.ndarray) -> np.ndarray:
        """Per hop, the sum of ``chunk_weight`` over the chunks it carries (see the module docstring)."""
        rings, n = self.rings, self.n
        per_block = chunk_weight[self.chunk_ids()].sum(axis=2)  # (rings, blocks)
        ring_total = per_block.sum(axis=1, keepdims=True)
        positions = np.arange(n)
        loads = np.zeros((rings, n))
        for phase in self.phases:
            # the block left out of hop j: the receiver's (AllGather) or the sender's (ReduceScatter)
            shift = 1 if phase is Collective.ALLGATHER else 0
            excluded = self.orders[:, (positions + shift) % n]
            loads += ring_total - np.take_along_axis(per_block, excluded, axis=1)
        return loads.reshape(-1)

    def materialize(self) -> Transfers:
        """The transfers, column by column, in the order of the module docstring.

        A chunk's transfers in one phase visit n − 1 consecutive hops of its ring, so its senders,
        receivers and routes are contiguous slices of the ring's order and hop routes laid out
        twice (for the wrap-around): the columns are concatenations of slices, with no per-transfer
        index arrays (an 8-channel AllGather on 2048 GPUs: 33.5 M transfers, ~1.1 GB of columns)."""
        rings, n, pieces = self.rings, self.n, self.pieces
        span = n - 1
        lengths = self.hop_lengths.reshape(rings, n)
        senders, receivers, route_lengths, route_links = [], [], [], []
        for ring in range(rings):
            order = self.orders[ring].astype(np.int32)
            twice = np.concatenate([order, order])
            twice_lengths = np.concatenate([lengths[ring], lengths[ring]])
            ring_links = self.hop_links[self.hop_offsets[ring * n]:self.hop_offsets[(ring + 1) * n]]
            twice_links = np.concatenate([ring_links, ring_links])
            link_start = np.zeros(2 * n + 1, dtype=np.int64)
            np.cumsum(twice_lengths, out=link_start[1:])
            position = np.empty(n, dtype=np.int64)
            position[order] = np.arange(n)
            for block in range(n):
                firsts = [(position[block] + (1 if phase is Collective.REDUCESCATTER else 0)) % n for phase in self.phases]
                for _ in range(pieces):
                    for first in firsts:
                        senders.append(twice[first:first + span])
                        receivers.append(twice[first + 1:first + 1 + span])
                        route_lengths.append(twice_lengths[first:first + span])
                        route_links.append(twice_links[link_start[first]:link_start[first + span]])
        count = rings * n * pieces
        steps = np.arange(len(self.phases) * span, dtype=np.int32)
        ops = np.concatenate([np.full(span, int(TransferOp.REDUCE if phase is Collective.REDUCESCATTER else TransferOp.COPY),
                                      dtype=np.int8) for phase in self.phases])
        per_chunk = len(steps)
        chunk = np.repeat(self.chunk_ids().reshape(-1).astype(np.int32), per_chunk)
        route_offsets = np.zeros(count * per_chunk + 1, dtype=np.int64)
        np.cumsum(np.concatenate(route_lengths), out=route_offsets[1:])
        return _trusted_transfers(chunk, np.concatenate(senders), np.concatenate(receivers), np.tile(steps, count),
                                  np.tile(ops, count), route_offsets,
                                  np.concatenate(route_links).astype(np.int32, copy=False))


def _trusted_transfers(*columns: np.ndarray) -> Transfers:
    """A :class:`Transfers` over ``columns`` (already of the IR's dtypes), frozen in place: no copy and no
    re-check of the offsets (10⁷–10⁸ entries at 2048 GPUs; the construction above is exact by design and
    ``tests/test_fast_paths.py`` compares it column by column with the checked, transfer-by-transfer one)."""
    transfers = object.__new__(Transfers)
    for name, column in zip(_COLUMNS, columns, strict=True):
        column.setflags(write=False)
        object.__setattr__(transfers, name, column)
    return transfers


class CompactTransfers(Transfers):
    """A :class:`Transfers` whose columns are computed from a pattern on first read.

    Subclasses set ``_pattern`` and implement ``_expand`` (the full columns) and the aggregates
    they can answer in closed form. Reading any column materializes all of them once, after
    which the object is an ordinary :class:`Transfers` (the base aggregates' results are equal
    to the closed forms to rounding; tests compare both).
    """

    def __init__(self, pattern: Any) -> None:  # no dataclass __init__: the columns come later
        object.__setattr__(self, "_pattern", pattern)

    @property
    def pattern(self) -> Any:
        return self.__dict__["_pattern"]

    @property
    def materialized(self) -> bool:
        return "chunk" in self.__dict__

    def _expand(self) -> Transfers:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        # Only called when ``name`` is not set yet: the columns, before the first read.
        if name not in _COLUMNS or "_pattern" not in self.__dict__:
            raise AttributeError(name)
        full = self._expand()
        for column in _COLUMNS:
            object.__setattr__(self, column, getattr(full, column))
        return self.__dict__[name]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} transfers, materialized={self.materialized})"


class RingTransfers(CompactTransfers):
    """The transfers of a :class:`RingPattern` (see the module docstring)."""

    def __init__(self, pattern: RingPattern) -> None:
        super().__init__(pattern)

    def _expand(self) -> Transfers:
        return self.pattern.materialize()

    def __len__(self) -> int:
        ring: RingPattern = self.pattern
        return ring.rings * ring.n * ring.pieces * ring.steps_per_chunk

    @property
    def n_steps(self) -> int:
        return self.pattern.steps_per_chunk

    def link_sums(self, chunk_weight: np.ndarray | None, n_links: int) -> np.ndarray:
        ring: RingPattern = self.pattern
        n_chunks = ring.rings * ring.n * ring.pieces
        weight = np.ones(n_chunks) if chunk_weight is None else np.asarray(chunk_weight, dtype=float)
        per_link = np.repeat(ring.hop_loads(weight), ring.hop_lengths)
        sums = np.bincount(ring.hop_links, weights=per_link, minlength=n_links)
        return np.rint(sums).astype(np.int64) if chunk_weight is None else sums

    def step_max_route_cost(self, link_cost: np.ndarray) -> np.ndarray:
        ring: RingPattern = self.pattern
        return np.full(ring.steps_per_chunk, float(ring.hop_sums(np.asarray(link_cost, dtype=float)).max()))

    def max_link(self) -> int:
        return int(self.pattern.hop_links.max())
