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

__all__ = ["Buffers", "Reducer", "REDUCERS", "all_gather_buffers", "all_to_all_buffers", "reduce_scatter_buffers",
           "all_reduce_buffers", "even_blocks"]

Reducer = Callable[[torch.Tensor, torch.Tensor], None]

REDUCERS: dict[object, Reducer] = {
    dist.ReduceOp.SUM: lambda acc, incoming: acc.add_(incoming),
    dist.ReduceOp.PRODUCT: lambda acc, incoming: acc.mul_(incoming),
    dist.ReduceOp.MIN: lambda acc, incoming: torch.minimum(acc, incoming, out=acc),
    dist.ReduceOp.MAX: lambda acc, incoming: torch.maximum(acc, incoming, out=acc),
}


@dataclass
class Buffers:
    """Where the chunks of one call live on this rank.

    ``block_elems[b]``: elements of block b; ``region(chunk)``: (tensor, element offset
    of the chunk's block in it). ``finish`` runs after the last operation (copy out).
    """

    block_elems: np.ndarray
    region: Callable[[int, Layout], tuple[torch.Tensor, int]]
    finish: Callable[[], None] | None = None
    reducer: Reducer | None = None
    template: torch.Tensor | None = None  # an empty tensor of the call's dtype and device
    # AllToAll: this rank's own block in the input and the output, (tensor, start, length)
    self_segments: tuple[tuple[torch.Tensor, int, int], tuple[torch.Tensor, int, int]] | None = None


def even_blocks(total: int, n: int) -> np.ndarray:
    """Split ``total`` elements into n blocks at ``rint(total · b / n)`` (AllReduce of any size)."""
    bounds = np.rint(np.arange(n + 1) * (total / n)).astype(np.int64)
    return np.diff(bounds)


def _flat(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise MCCLError(f"{name} must be contiguous")
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor.reshape(-1)


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


def all_gather_buffers(plan: RankPlan, output: torch.Tensor, input: torch.Tensor) -> Buffers:
    n, rank = plan.n_ranks, plan.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    per_rank = _check_gathered("all_gather", whole=(out, "output"), part=(inp, "input"), n=n)
    own = out[rank * per_rank:(rank + 1) * per_rank]
    if own.data_ptr() != inp.data_ptr():
        own.copy_(inp)
    source = plan.chunk_source
    return Buffers(np.full(n, per_rank, dtype=np.int64),
                   lambda chunk, _layout: (out, int(source[chunk]) * per_rank), template=out[:0])


def all_to_all_buffers(plan: RankPlan, output: torch.Tensor, input: torch.Tensor,
                       output_splits: Sequence[int] | None, input_splits: Sequence[int] | None,
                       split_matrix: Callable[[list[int]], np.ndarray] | None = None) -> Buffers:
    """``output_splits``/``input_splits`` in rows of dim 0, as torch's ``all_to_all_single``.

    Uneven splits on a schedule with relays need every rank's splits (a relay must
    know the size of what it forwards): ``split_matrix(my_input_splits)`` returns the
    n × n matrix of input splits in elements, gathered over the group.
    """
    n, rank = plan.n_ranks, plan.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    if out.dtype != inp.dtype:
        raise MCCLError(f"all_to_all: output dtype {out.dtype} differs from input dtype {inp.dtype}")
    rows_in, rows_out = (input.shape[0] if input.dim() else 1), (output.shape[0] if output.dim() else 1)
    row_in = inp.numel() // max(rows_in, 1)
    row_out = out.numel() // max(rows_out, 1)
    in_split = _splits(input_splits, rows_in, n, "input") * row_in
    out_split = _splits(output_splits, rows_out, n, "output") * row_out
    if row_in != row_out and inp.numel() and out.numel():
        raise MCCLError("all_to_all: input and output rows differ in size")
    in_offset = np.concatenate([[0], np.cumsum(in_split)])
    out_offset = np.concatenate([[0], np.cumsum(out_split)])
    if int(in_split[rank]) != int(out_split[rank]):
        raise MCCLError(f"all_to_all: rank {rank} sends itself {in_split[rank]} elements but expects {out_split[rank]}")
    out[out_offset[rank]:out_offset[rank + 1]].copy_(inp[in_offset[rank]:in_offset[rank + 1]])
    even = (input_splits is None or len(set(input_splits)) <= 1) and (output_splits is None or len(set(output_splits)) <= 1)
    if even or not plan.relayed_chunks and not plan.has_relays:
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
    block_elems = matrix.reshape(-1).astype(np.int64)
    source, destination = plan.chunk_source, plan.chunk_destination
    scratch_state: dict[str, object] = {}

    def region(chunk: int, layout: Layout) -> tuple[torch.Tensor, int]:
        s, d = int(source[chunk]), int(destination[chunk])
        if s == rank:
            return inp, int(in_offset[d])
        if d == rank:
            return out, int(out_offset[s])
        if "offsets" not in scratch_state:
            relayed = list(plan.relayed_chunks)
            lengths = layout.length[relayed]
            starts = np.concatenate([[0], np.cumsum(lengths)])
            scratch_state["offsets"] = {c: int(starts[i]) - int(layout.offset[c]) for i, c in enumerate(relayed)}
            scratch_state["tensor"] = torch.empty(int(starts[-1]), dtype=inp.dtype, device=inp.device)
        return scratch_state["tensor"], scratch_state["offsets"][chunk]  # type: ignore[index,return-value]

    own = int(in_split[rank])
    return Buffers(block_elems, region, template=out[:0],
                   self_segments=((inp, int(in_offset[rank]), own), (out, int(out_offset[rank]), own)))


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


def reduce_scatter_buffers(plan: RankPlan, output: torch.Tensor, input: torch.Tensor, op: object) -> Buffers:
    n, rank = plan.n_ranks, plan.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    per_rank = _check_gathered("reduce_scatter", whole=(inp, "input"), part=(out, "output"), n=n)
    work = inp.clone()

    def finish() -> None:
        out.copy_(work[rank * per_rank:(rank + 1) * per_rank])

    return Buffers(np.full(n, per_rank, dtype=np.int64), lambda chunk, _layout: (work, int(plan.chunk_block[chunk]) * per_rank),
                   finish, _reducer(op), work[:0])


def all_reduce_buffers(plan: RankPlan, tensor: torch.Tensor, op: object) -> Buffers:
    flat = _flat(tensor, "tensor")
    blocks = even_blocks(flat.numel(), plan.n_ranks)
    starts = np.concatenate([[0], np.cumsum(blocks)])
    return Buffers(blocks, lambda chunk, _layout: (flat, int(starts[plan.chunk_block[chunk]])), None, _reducer(op),
                   flat[:0])


def _reducer(op: object) -> Reducer:
    reducer = REDUCERS.get(op)
    if reducer is None:
        raise MCCLError(f"reduction {op} is not supported by the mccl executor (SUM, PRODUCT, MIN, MAX are)")
    return reducer
