"""The Schedule IR: the one data type that crosses every package boundary.

A schedule says, for one collective over a list of ranks (each pinned to a GPU of a
topology), how every rank's buffer is cut into chunks and which transfers move
those chunks: ``(chunk, sender, receiver, step, op, route)``. A rank may send a
chunk at step ``s`` only if it held it at the end of step ``s - 1``; trees
(AllGather) and multi-hop paths (AllToAll) are views over these transfers.

Blocks and chunks. With S the nccl-tests size of the collective (DESIGN.md, "Units"),
every collective here moves blocks of ``S / n`` bytes: AllGather, the buffer of one
source; AllToAll, the data one source sends one destination; ReduceScatter and
AllReduce, the part of the buffer reduced into one rank (for AllReduce, one n-th
of the buffer). A block is cut into chunks, each a ``fraction`` of its block.

Storage is columnar (numpy arrays): a ring on 512 GPUs has millions of transfers,
and the simulator and validator read them as arrays.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum

import numpy as np

from mccl.errors import InvalidSchedule

__all__ = [
    "Collective",
    "TransferOp",
    "Chunks",
    "Transfer",
    "Transfers",
    "CutLink",
    "ScheduleMeta",
    "Schedule",
    "TransferList",
]


class Collective(StrEnum):
    ALLGATHER = "allgather"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"


class TransferOp(IntEnum):
    """What the receiver does with the data: keep a copy, or add it into its own."""

    COPY = 0
    REDUCE = 1


def _frozen(values: Sequence | np.ndarray, dtype: type) -> np.ndarray:
    """A read-only array of ``dtype``: a copy, unless ``values`` already is one (immutable, so
    sharing it is safe; schedules of ~10⁶ transfers are built from such arrays without a copy)."""
    if isinstance(values, np.ndarray) and values.dtype == dtype and not values.flags.writeable:
        return values
    array = np.array(values, dtype=dtype)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Chunks:
    """Chunk ``c`` is ``fraction[c]`` of one block.

    ``source[c]``: the rank whose data it is (AllGather, AllToAll), or -1 when every
    rank contributes (ReduceScatter, AllReduce). ``destination[c]``: the rank that
    must end with it (AllToAll, ReduceScatter), or -1 when every rank must (AllGather,
    AllReduce; for AllReduce it then names the block's index).
    """

    source: np.ndarray
    destination: np.ndarray
    fraction: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", _frozen(self.source, np.int32))
        object.__setattr__(self, "destination", _frozen(self.destination, np.int32))
        object.__setattr__(self, "fraction", _frozen(self.fraction, np.float64))
        if not (len(self.source) == len(self.destination) == len(self.fraction)):
            raise InvalidSchedule("chunk arrays source, destination and fraction differ in length")

    def __len__(self) -> int:
        return len(self.source)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Chunks) and all(
            np.array_equal(getattr(self, name), getattr(other, name)) for name in ("source", "destination", "fraction")
        )


@dataclass(frozen=True)
class Transfer:
    """One row of :class:`Transfers`, for reading; schedules store the columns."""

    chunk: int
    sender: int
    receiver: int
    step: int
    op: TransferOp
    route: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Transfers:
    """Columns of the transfers; the route of transfer ``i`` is
    ``route_links[route_offsets[i]:route_offsets[i + 1]]`` (link ids, in order)."""

    chunk: np.ndarray
    sender: np.ndarray
    receiver: np.ndarray
    step: np.ndarray
    op: np.ndarray
    route_offsets: np.ndarray
    route_links: np.ndarray

    def __post_init__(self) -> None:
        for name, dtype in (("chunk", np.int32), ("sender", np.int32), ("receiver", np.int32),
                            ("step", np.int32), ("op", np.int8), ("route_offsets", np.int64),
                            ("route_links", np.int32)):
            object.__setattr__(self, name, _frozen(getattr(self, name), dtype))
        count = len(self.chunk)
        if not (len(self.sender) == len(self.receiver) == len(self.step) == len(self.op) == count):
            raise InvalidSchedule("transfer arrays chunk, sender, receiver, step and op differ in length")
        offsets = self.route_offsets
        if len(offsets) != count + 1 or offsets[0] != 0 or offsets[-1] != len(self.route_links) or np.any(np.diff(offsets) < 0):
            raise InvalidSchedule("route_offsets must start at 0, never decrease and end at len(route_links)")

    def __len__(self) -> int:
        return len(self.chunk)

    def __getstate__(self) -> dict:
        """Pickled without :meth:`link_sums`' memo (it may hold another schedule's chunk fractions)."""
        state = dict(self.__dict__)
        state.pop("_link_sums", None)
        return state

    def route(self, index: int) -> tuple[int, ...]:
        start, stop = self.route_offsets[index], self.route_offsets[index + 1]
        return tuple(int(link) for link in self.route_links[start:stop])

    def __getitem__(self, index: int) -> Transfer:
        return Transfer(int(self.chunk[index]), int(self.sender[index]), int(self.receiver[index]),
                        int(self.step[index]), TransferOp(int(self.op[index])), self.route(index))

    def __iter__(self) -> Iterator[Transfer]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Transfers) and all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links")
        )

    @property
    def route_lengths(self) -> np.ndarray:
        return np.diff(self.route_offsets)

    @property
    def n_steps(self) -> int:
        return int(self.step.max()) + 1 if len(self) else 0

    # -- aggregates ---------------------------------------------------------------------------
    # Accounting (mccl.schedule.accounting) and the α-β model (mccl.sim.analytic) read transfers
    # only through these three. A compact subclass (mccl.schedule.pattern) answers them in closed
    # form without materializing its columns; these are the column-wise definitions.

    def link_sums(self, chunk_weight: np.ndarray | None, n_links: int) -> np.ndarray:
        """Per link, the sum over the transfers crossing it of ``chunk_weight[chunk]`` (float), or
        with ``chunk_weight=None`` the number of crossings (int64).

        Remembered for the last two read-only ``chunk_weight`` arrays (or None) it was asked about: the
        columns are immutable, and at 512 GPUs (1.7 M transfers, ~50 ms a sum) a warm re-synthesis, its
        Algorithm 1 profile and the guard's two α-β predictions asked four times for the same loads."""
        memo: list = self.__dict__.setdefault("_link_sums", [])
        for weight, links, sums in memo:
            if weight is chunk_weight and links == n_links:
                return sums.copy()
        if chunk_weight is None:
            sums = np.bincount(self.route_links, minlength=n_links).astype(np.int64)
        else:
            per_hop = np.repeat(chunk_weight[self.chunk], self.route_lengths)
            sums = np.bincount(self.route_links, weights=per_hop, minlength=n_links)
        if chunk_weight is None or not chunk_weight.flags.writeable:
            memo[:] = [*memo[-1:], (chunk_weight, n_links, sums.copy())]
        return sums

    def remember_link_sums(self, chunk_weight: np.ndarray | None, n_links: int, sums: np.ndarray) -> None:
        """Tell :meth:`link_sums` its answer, computed by whoever wrote the columns (a lowering that sums the
        load while it writes the links, in the same order of additions, so the same floats): later calls
        return it instead of a pass over every route link. Kept only where :meth:`link_sums` would keep it."""
        if chunk_weight is not None and chunk_weight.flags.writeable:
            return
        if len(sums) != n_links:
            raise ValueError(f"link sums for {len(sums)} links, asked to remember them for {n_links}")
        memo: list = self.__dict__.setdefault("_link_sums", [])
        memo[:] = [*memo[-1:], (chunk_weight, n_links, np.array(sums, dtype=np.int64 if chunk_weight is None
                                                                   else np.float64))]

    def step_max_route_cost(self, link_cost: np.ndarray) -> np.ndarray:
        """Per step, the largest route cost (sum of ``link_cost`` over a route) among its transfers
        (0 for a step without transfers); ``n_steps`` values."""
        route_cost = np.add.reduceat(link_cost[self.route_links], self.route_offsets[:-1]) if len(self) else np.zeros(0)
        per_step = np.zeros(self.n_steps)
        np.maximum.at(per_step, self.step, route_cost)
        return per_step

    def max_link(self) -> int:
        """The largest link id any route uses, -1 when none (to check a schedule fits a topology)."""
        return int(self.route_links.max(initial=-1))


@dataclass(frozen=True)
class CutLink:
    """A link of the bottleneck cut K_s and the share of it the schedule leaves unused."""

    link: int
    base_slack: float


@dataclass(frozen=True)
class ScheduleMeta:
    """Where a schedule came from and what it is worth (mccl-paper §3.2, Algorithm 1).

    ``throughput_bound_gbs``: the fractional (LP) optimum the synthesizer proved, as
    algbw in GB/s. ``achieved_gbs``: the steady-state algbw of this (rounded)
    schedule on the topology it was made for. ``bottleneck_cut``: K_s with each
    link's base slack. ``chunks_per_link``: ``(link id, n_a)`` for every link with
    n_a > 0. ``inputs``: provenance as ``(key, value)`` strings. ``stats``: numeric
    facts of the synthesis, ``(name, value)``: ``solve_time_s``, ``iterations``,
    ``columns``, ``kept_fraction`` (warm start), ``rounding_gap``, ... .
    """

    synthesizer: str
    version: int = 0
    topology: str = ""
    inputs: tuple[tuple[str, str], ...] = ()
    throughput_bound_gbs: float | None = None
    achieved_gbs: float | None = None
    bottleneck_cut: tuple[CutLink, ...] = ()
    chunks_per_link: tuple[tuple[int, int], ...] = ()
    stats: tuple[tuple[str, float], ...] = ()

    def stat(self, name: str, default: float | None = None) -> float | None:
        return dict(self.stats).get(name, default)


@dataclass(frozen=True)
class Schedule:
    collective: Collective
    ranks: tuple[str, ...]
    chunks: Chunks
    transfers: Transfers
    meta: ScheduleMeta = field(default_factory=lambda: ScheduleMeta("unknown"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "collective", Collective(self.collective))
        object.__setattr__(self, "ranks", tuple(self.ranks))

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    def with_meta(self, **changes: object) -> Schedule:
        return replace(self, meta=replace(self.meta, **changes))

    def block_of_chunks(self) -> np.ndarray:
        """The block id of every chunk: source (AllGather), ``s * n + d`` (AllToAll),
        destination (ReduceScatter, AllReduce)."""
        chunks = self.chunks
        if self.collective is Collective.ALLGATHER:
            return chunks.source.astype(np.int64)
        if self.collective is Collective.ALLTOALL:
            return chunks.source.astype(np.int64) * self.n_ranks + chunks.destination
        return chunks.destination.astype(np.int64)


class TransferList:
    """Collects transfers one by one (as synthesizers produce them) and freezes them."""

    def __init__(self) -> None:
        self._chunk: list[int] = []
        self._sender: list[int] = []
        self._receiver: list[int] = []
        self._step: list[int] = []
        self._op: list[int] = []
        self._offsets: list[int] = [0]
        self._links: list[int] = []

    def add(self, chunk: int, sender: int, receiver: int, step: int, route: Sequence[int],
            op: TransferOp = TransferOp.COPY) -> None:
        self._chunk.append(chunk)
        self._sender.append(sender)
        self._receiver.append(receiver)
        self._step.append(step)
        self._op.append(int(op))
        self._links.extend(route)
        self._offsets.append(len(self._links))

    def __len__(self) -> int:
        return len(self._chunk)

    def freeze(self) -> Transfers:
        return Transfers(self._chunk, self._sender, self._receiver, self._step, self._op,
                         self._offsets, self._links)
