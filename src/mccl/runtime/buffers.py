"""Where the chunks of one call live: a rank's tensors cut into the regions the executor reads and writes.

Every chunk a rank touches lives in exactly one region of one tensor: AllGather, the
output (the rank's own input is copied into its block first); AllToAll, the input at
its source, the output at its destination, a scratch buffer at a relay;
ReduceScatter and AllReduce, a work copy holding the partial sums. Sizes are checked
here, before anything is issued: on gloo a message larger than its receive aborts
the receiving process without a Python exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from mccl.errors import MCCLError
from mccl.runtime.plan import Layout, RankPlan
from mccl.runtime.reduction_order import ReductionOrder

__all__ = ["Buffers", "Reducer", "REDUCERS", "exact_order", "all_gather_buffers", "all_to_all_buffers", "reduce_scatter_buffers",
           "all_reduce_buffers", "check_shapes", "even_blocks"]

Combine = Callable[[torch.Tensor, torch.Tensor], None]
Span = tuple[int, int, int]  # (tensor index, start, length) in elements
Reducer = Callable[[torch.Tensor, torch.Tensor, int], None]
"""``reducer(partial_sum_view, incoming, peer)``: what a driver calls for every reducing receive, in the
plan's canonical order (``peer``: who sent ``incoming``)."""

COMBINE: dict[object, Combine] = {
    dist.ReduceOp.SUM: lambda acc, incoming: acc.add_(incoming),
    dist.ReduceOp.PRODUCT: lambda acc, incoming: acc.mul_(incoming),
    dist.ReduceOp.MIN: lambda acc, incoming: torch.minimum(acc, incoming, out=acc),
    dist.ReduceOp.MAX: lambda acc, incoming: torch.maximum(acc, incoming, out=acc),
    dist.ReduceOp.AVG: lambda acc, incoming: acc.add_(incoming),  # a sum, divided by n when copied out
}

# the same operations out of place, ``(a, b, out)``: a fold's first addition writes its result without a copy
BINARY: dict[object, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]] = {
    dist.ReduceOp.SUM: lambda a, b, out: torch.add(a, b, out=out),
    dist.ReduceOp.PRODUCT: lambda a, b, out: torch.mul(a, b, out=out),
    dist.ReduceOp.MIN: lambda a, b, out: torch.minimum(a, b, out=out),
    dist.ReduceOp.MAX: lambda a, b, out: torch.maximum(a, b, out=out),
    dist.ReduceOp.AVG: lambda a, b, out: torch.add(a, b, out=out),
}

REDUCERS: dict[object, Reducer] = {op: (lambda acc, incoming, _peer, combine=combine: combine(acc, incoming))
                                   for op, combine in COMBINE.items()}


@dataclass
class Buffers:
    """Where the chunks of one call live on this rank.

    ``tensors``: the call's tensors; an entry left None is a scratch tensor that the
    executor allocates at the size the layout needs (relays). ``block_elems[b]``:
    elements of block b; ``region(chunk, layout)``: (index into ``tensors``, element
    offset of the chunk's block in it). Every region is a function of the plan, the
    block sizes and ``kind`` only (not of the tensors' addresses), so the executor
    computes them once per (kind, block sizes) and slices the tensors per call.
    ``finish`` runs after the last operation (copy out).
    """

    kind: str
    tensors: list[torch.Tensor | None]
    block_elems: np.ndarray
    region: Callable[[int, Layout], tuple[int, int]]
    finish: Callable[[], None] | None = None
    reducer: Reducer | None = None
    template: torch.Tensor | None = None  # a tensor of the call's dtype and device (new_empty, element_size)
    # AllToAll: this rank's own block in the input and the output, (tensor index, start, length);
    # the executor copies it across (or lets gloo's alltoallv do so, see drivers.exchange)
    self_segments: tuple[Span, Span] | None = None
    # where a reducing receive lands, ``landing(start, length, peer) -> span``, given the receive's span in
    # tensor 0 (a function of the block sizes only, like the regions); None: a temporary of its own
    landing: Callable[[int, int, int], Span] | None = None
    # the own slot of an alltoallv (drivers.exchange): a span of the sends' tensor and one of the receives'
    # that gloo may copy between, so that a step's regions are contiguous around this rank's own place
    slots: tuple[Span, Span] | None = None


def even_blocks(total: int, n: int) -> np.ndarray:
    """Split ``total`` elements into n blocks at ``rint(total · b / n)`` (AllReduce of any size)."""
    bounds = np.rint(np.arange(n + 1) * (total / n)).astype(np.int64)
    return np.diff(bounds)


def _flat(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise MCCLError(f"{name} must be contiguous")
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor if tensor.dim() == 1 else tensor.reshape(-1)


def _check_gathered(collective: str, *, whole: tuple[torch.Tensor, str], part: tuple[torch.Tensor, str],
                    n: int) -> int:
    """Same dtype, and ``whole`` holds n × ``part`` elements; returns the elements per rank."""
    (big, big_name), (small, small_name) = whole, part
    if big.dtype != small.dtype:
        raise MCCLError(f"{collective}: {big_name} dtype {big.dtype} differs from {small_name} dtype {small.dtype}")
    per_rank = small.numel()
    if big.numel() != n * per_rank:
        raise MCCLError(f"{collective}: the {big_name} has {big.numel()} elements; it must have {n} × {per_rank} "
                        f"(world size × {small_name} elements)")
    return per_rank


def check_shapes(collective: str, output: torch.Tensor, input: torch.Tensor, n: int,
                 output_splits: Sequence[int] | None = None, input_splits: Sequence[int] | None = None) -> None:
    """What a rank can check alone before it launches ``collective`` (``all_gather``, ``reduce_scatter``,
    ``all_to_all``) on a group of ``n``: equal dtypes, the element counts, the AllToAll splits — as an
    :class:`MCCLError` that names the tensor and the sizes.

    Why before the launch: the executor checks the same when it builds the call's buffers, but a call that goes to
    torch's own collective (no schedule installed, a world of one, a reduction the executor lacks) reached gloo
    with them, and gloo's refusal ("invalid tensor size") surfaced as a lost peer and broke the communicator for
    good — for a shape error on this rank alone."""
    if collective == "all_gather":
        _check_gathered(collective, whole=(output, "output"), part=(input, "input"), n=n)
    elif collective == "reduce_scatter":
        _check_gathered(collective, whole=(input, "input"), part=(output, "output"), n=n)
    elif collective == "all_to_all":
        if output.dtype != input.dtype:
            raise MCCLError(f"all_to_all: output dtype {output.dtype} differs from input dtype {input.dtype}")
        rows_in, rows_out = (input.shape[0] if input.dim() else 1), (output.shape[0] if output.dim() else 1)
        _splits(input_splits, rows_in, n, "input")
        _splits(output_splits, rows_out, n, "output")
        if input.numel() and output.numel() and input.numel() // max(rows_in, 1) != output.numel() // max(rows_out, 1):
            raise MCCLError(f"all_to_all: input rows hold {input.numel() // max(rows_in, 1)} elements, output rows "
                            f"{output.numel() // max(rows_out, 1)}; they must be the same size")


def all_gather_buffers(plan: RankPlan, output: torch.Tensor, input: torch.Tensor) -> Buffers:
    n, rank = plan.n_ranks, plan.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    per_rank = _check_gathered("all_gather", whole=(out, "output"), part=(inp, "input"), n=n)
    own = out[rank * per_rank:(rank + 1) * per_rank]
    if own.data_ptr() != inp.data_ptr():
        own.copy_(inp)
    source = plan.chunk_source
    own_block = (0, rank * per_rank, per_rank)
    return Buffers("all_gather", [out], np.full(n, per_rank, dtype=np.int64),
                   lambda chunk, _layout: (0, int(source[chunk]) * per_rank), template=out,
                   slots=(own_block, own_block))


def all_to_all_buffers(plan: RankPlan, output: torch.Tensor, input: torch.Tensor,
                       output_splits: Sequence[int] | None, input_splits: Sequence[int] | None,
                       split_matrix: Callable[[list[int]], np.ndarray] | None = None,
                       cache: dict | None = None) -> Buffers:
    """``output_splits``/``input_splits`` in rows of dim 0, as torch's ``all_to_all_single``.

    Uneven splits on a schedule with relays need every rank's splits (a relay must
    know the size of what it forwards): ``split_matrix(my_input_splits)`` returns the
    n × n matrix of input splits in elements, gathered over the group. ``cache`` (kept
    with the plan) holds the offsets of the shapes seen before, except in that case,
    where they depend on the other ranks' splits of this very call.
    """
    rank = plan.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    if out.dtype != inp.dtype:
        raise MCCLError(f"all_to_all: output dtype {out.dtype} differs from input dtype {inp.dtype}")
    shape_key = ("all_to_all", input.shape[0] if input.dim() else 1, output.shape[0] if output.dim() else 1,
                 inp.numel(), out.numel(), None if input_splits is None else tuple(input_splits),
                 None if output_splits is None else tuple(output_splits))
    geometry = cache.get(shape_key) if cache is not None else None
    if geometry is None:
        geometry = _all_to_all_geometry(plan, shape_key, split_matrix)
        if cache is not None and geometry.reusable:
            cache[shape_key] = geometry
    in_start, out_start, own = geometry.in_offset[rank], geometry.out_offset[rank], geometry.own
    own_blocks = ((_IN, in_start, own), (_OUT, out_start, own))
    return Buffers("all_to_all", [inp, out, None], geometry.block_elems, geometry.region, template=out,
                   self_segments=own_blocks, slots=own_blocks)


@dataclass(frozen=True, eq=False)
class _AllToAllGeometry:
    """Element offsets of one AllToAll call's blocks, a function of the call's shapes and splits."""

    block_elems: np.ndarray
    in_offset: list[int]
    out_offset: list[int]
    own: int
    region: Callable[[int, Layout], tuple[int, int]]
    reusable: bool


def _all_to_all_geometry(plan: RankPlan, shape_key: tuple, split_matrix) -> _AllToAllGeometry:
    n, rank = plan.n_ranks, plan.rank
    _, rows_in, rows_out, numel_in, numel_out, input_splits, output_splits = shape_key
    row_in = numel_in // max(rows_in, 1)
    row_out = numel_out // max(rows_out, 1)
    in_split = _splits(input_splits, rows_in, n, "input") * row_in
    out_split = _splits(output_splits, rows_out, n, "output") * row_out
    if row_in != row_out and numel_in and numel_out:
        raise MCCLError("all_to_all: input and output rows differ in size")
    in_offset = [int(v) for v in np.concatenate([[0], np.cumsum(in_split)])]
    out_offset = [int(v) for v in np.concatenate([[0], np.cumsum(out_split)])]
    if int(in_split[rank]) != int(out_split[rank]):
        raise MCCLError(f"all_to_all: rank {rank} sends itself {in_split[rank]} elements but expects {out_split[rank]}")
    even = (input_splits is None or len(set(input_splits)) <= 1) and (output_splits is None or len(set(output_splits)) <= 1)
    reusable = even or not plan.relayed_chunks and not plan.has_relays
    if reusable:
        matrix = np.zeros((n, n), dtype=np.int64)
        matrix[rank, :] = in_split
        matrix[:, rank] = out_split
        if even:
            matrix[:, :] = in_split[0] if n else 0
    else:
        if split_matrix is None:
            raise MCCLError("all_to_all with uneven splits on a schedule with relays needs the group's split sizes")
        matrix = split_matrix([int(v) for v in in_split])
        if not np.array_equal(matrix[:, rank], out_split):
            raise MCCLError(f"all_to_all: rank {rank} expects {out_split.tolist()} elements from the ranks, "
                            f"they send {matrix[:, rank].tolist()}")
    source, destination = plan.chunk_source, plan.chunk_destination
    scratch_offsets: dict[int, int] = {}

    def region(chunk: int, layout: Layout) -> tuple[int, int]:
        s, d = int(source[chunk]), int(destination[chunk])
        if s == rank:
            return _IN, in_offset[d]
        if d == rank:
            return _OUT, out_offset[s]
        if not scratch_offsets:  # relayed chunks lie back to back in the scratch tensor
            relayed = list(plan.relayed_chunks)
            starts = np.concatenate([[0], np.cumsum(layout.length[relayed])])
            scratch_offsets.update({c: int(starts[i]) - int(layout.offset[c]) for i, c in enumerate(relayed)})
        return _SCRATCH, scratch_offsets[chunk]

    return _AllToAllGeometry(matrix.reshape(-1).astype(np.int64), in_offset, out_offset, int(in_split[rank]), region,
                             reusable)


_IN, _OUT, _SCRATCH = 0, 1, 2  # AllToAll's tensors


def _splits(splits: Sequence[int] | None, rows: int, n: int, name: str) -> np.ndarray:
    if splits is None or len(splits) == 0:
        if rows % n:
            raise MCCLError(f"all_to_all: the {name} has {rows} rows, not divisible by the world size {n}; "
                            f"pass {name}_split_sizes")
        return np.full(n, rows // n, dtype=np.int64)
    values = np.asarray(list(splits), dtype=np.int64)
    if len(values) != n or np.any(values < 0) or values.sum() != rows:
        raise MCCLError(f"all_to_all: {name}_split_sizes {list(splits)} must be {n} non-negative sizes "
                        f"summing to the {rows} rows of the {name}")
    return values


def reduce_scatter_buffers(plan: RankPlan, output: torch.Tensor, input: torch.Tensor, op: object,
                           order: ReductionOrder | None = None) -> Buffers:
    """``order``: add the contributions in this order (gloo's, :mod:`mccl.runtime.reduction_order`)
    rather than as they arrive along the schedule; honoured when the schedule delivers every
    contribution unsummed (:attr:`RankPlan.raw_contributions`), else the schedule's order stands
    (:func:`exact_order` says which)."""
    n, rank = plan.n_ranks, plan.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    per_rank = _check_gathered("reduce_scatter", whole=(inp, "input"), part=(out, "output"), n=n)
    average = op == dist.ReduceOp.AVG
    in_order = exact_order(plan, order)
    # the schedule's own order adds into a work copy; the fold only reads the input (sends, this rank's own
    # contribution), so it works on the input itself unless the output lies in it (written while read)
    work = inp.clone() if not in_order or _overlap(out, inp) else inp
    folded = _FoldInOrder(work, rank, n, per_rank, order, _combine(op), BINARY[op]) if in_order else None

    def finish() -> None:
        if folded is not None:
            folded.fold_into(out)
        else:
            out.copy_(work[rank * per_rank:(rank + 1) * per_rank])
        if average:  # the sum of the n contributions, divided once at the end as gloo's AVG does
            out.div_(n)

    def region(chunk: int, _layout: Layout) -> tuple[int, int]:
        return 0, int(plan.chunk_block[chunk]) * per_rank

    if folded is None:
        return Buffers("reduce_scatter", [work], np.full(n, per_rank, dtype=np.int64), region, finish,
                       _reducer(op), work)
    # (a kind of its own: the drivers' programs, cached by kind and sizes, know where receives land)
    return Buffers("reduce_scatter:in_order", [work, folded.stack.view(-1)], np.full(n, per_rank, dtype=np.int64),
                   region, finish, folded.collect, work, landing=folded.landing_span,
                   slots=((0, rank * per_rank, per_rank), (1, rank * per_rank, per_rank)))


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share any memory."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a_start, b_start = a.data_ptr(), b.data_ptr()
    return a_start < b_start + b.numel() * b.element_size() and b_start < a_start + a.numel() * a.element_size()


def exact_order(plan: RankPlan, order: ReductionOrder | None) -> bool:
    """Whether a ReduceScatter of ``plan`` adds in ``order``: asked for, and the schedule allows it."""
    return order is not None and plan.raw_contributions


class _FoldInOrder:
    """The reducer of a ReduceScatter that adds in a given order: every contribution to this rank's
    block is kept as it arrives (``collect``, the drivers' reducer), and ``fold_into`` adds them in
    the order's sequence, range by range (the same arithmetic as gloo: one binary operation per
    contribution, left to right; the first one written straight into the output). The point-to-point
    drivers receive straight into the stack (``landing``); the additions are the same number as on the
    schedule's path, and nothing is copied (the bytes on the wire are the schedule's)."""

    def __init__(self, work: torch.Tensor, rank: int, n: int, per_rank: int, order: ReductionOrder,
                 combine: Combine, binary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]) -> None:
        self.work, self.rank, self.n, self.per_rank = work, rank, n, per_rank
        self.block_start = rank * per_rank
        self.ranges = order.ranges(self.block_start, self.block_start + per_rank, n, work.element_size())
        self.combine, self.binary = combine, binary
        # row ``rank`` unused (this rank's own is in ``work``; an alltoallv may copy it there, its own slot)
        self.stack = work.new_empty((n, per_rank))

    def landing_span(self, start: int, length: int, peer: int) -> Span:
        """Where ``peer``'s contribution to elements ``[start, start + length)`` of ``work`` (in this rank's
        block) is received: its row of the stack (tensor 1 of the buffers), so the drivers need no copy."""
        offset = start - self.block_start
        if offset < 0 or offset + length > self.per_rank:
            raise MCCLError("a contribution arrived for a block this rank does not own (the schedule relays sums)")
        return 1, peer * self.per_rank + offset, length

    def collect(self, acc: torch.Tensor, incoming: torch.Tensor, peer: int) -> None:
        _, start, length = self.landing_span(acc.storage_offset() - self.work.storage_offset(), acc.numel(), peer)
        target = self.stack.view(-1)[start:start + length]
        if target.data_ptr() != incoming.data_ptr():  # received elsewhere (the exchange driver's staging)
            target.copy_(incoming)

    def fold_into(self, out: torch.Tensor) -> None:
        start = self.block_start
        own = self.work[start:start + self.per_rank]
        for lo, hi, ranks in self.ranges:
            rows = [own if contributor == self.rank else self.stack[contributor] for contributor in ranks]
            target = out[lo - start:hi - start]
            if len(rows) == 1:
                target.copy_(rows[0][lo - start:hi - start])
                continue
            self.binary(rows[0][lo - start:hi - start], rows[1][lo - start:hi - start], target)
            for row in rows[2:]:
                self.combine(target, row[lo - start:hi - start])


def all_reduce_buffers(plan: RankPlan, tensor: torch.Tensor, op: object) -> Buffers:
    if op == dist.ReduceOp.AVG:  # nothing here divides the sum: refuse rather than return n × the mean
        raise MCCLError("reduction AVG is not supported by an AllReduce schedule (SUM, PRODUCT, MIN, MAX are)")
    flat = _flat(tensor, "tensor")
    blocks = even_blocks(flat.numel(), plan.n_ranks)
    starts = np.concatenate([[0], np.cumsum(blocks)])
    return Buffers("all_reduce", [flat], blocks, lambda chunk, _layout: (0, int(starts[plan.chunk_block[chunk]])), None,
                   _reducer(op), flat)


def _reducer(op: object) -> Reducer:
    _combine(op)
    return REDUCERS[op]


def _combine(op: object) -> Combine:
    combine = COMBINE.get(op)
    if combine is None:
        raise MCCLError(f"reduction {op} is not supported by the mccl executor (SUM, AVG, PRODUCT, MIN, MAX are)")
    return combine
