"""The pre-flight check: every rank of a collective agrees on its shape before any data moves.

A rank whose input size or dtype differs from its peers' must not reach the transport:
on gloo a message larger than the posted receive aborts the receiving process (SIGABRT,
no Python exception) and a smaller one leaves the peer with part of a block of stale
memory. So before a collective's first transfer every rank contributes one small
int64 vector — operation, dtype, element counts, reduction, and for AllToAll its split
sizes — to every rank (an AllGather of the vectors; the communicator runs it as one small
AllToAll, a single round trip on gloo), and every rank checks the same
gathered matrix with the same rules. Hence either every rank raises
:class:`CollectiveMismatch` naming the disagreement, or none does.

Cost: one extra small exchange per collective (5 + 2n int64 per rank); measured per
call in BENCHMARKS.md (benchmarks/backend.py). A communicator created with
``check=False`` (or the backend with ``MCCL_CHECK=0``) skips it and trusts the caller.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mccl.errors import MCCLError

__all__ = ["CollectiveMismatch", "Signature", "agree", "OPS"]

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")

# a fixed numbering of dtypes, the same in every process (a dtype's position here is its code)
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_FIELDS = 5  # op, dtype, input elements, output elements, reduction


class CollectiveMismatch(MCCLError):
    """The ranks of one collective disagree on its operation, dtype, sizes or reduction; raised on
    every rank before any data moved."""


@dataclass(frozen=True)
class Signature:
    """What every rank of one collective must agree on. ``reduction``: the reduction's code (-1: none);
    ``input_splits``/``output_splits``: AllToAll's elements to / from each rank."""

    op: str
    dtype: torch.dtype
    input_elems: int
    output_elems: int
    reduction: int = -1
    input_splits: Sequence[int] | None = None
    output_splits: Sequence[int] | None = None

    def encode(self, n: int) -> list[int]:
        dtype = _DTYPES.index(self.dtype) if self.dtype in _DTYPES else len(_DTYPES) + zlib.crc32(str(self.dtype).encode()) % 1000
        splits_in = list(self.input_splits) if self.input_splits is not None else [-1] * n
        splits_out = list(self.output_splits) if self.output_splits is not None else [-1] * n
        return [OPS.index(self.op), dtype, self.input_elems, self.output_elems, self.reduction,
                *splits_in, *splits_out]


def _dtype_name(code: int) -> str:
    return str(_DTYPES[code]).removeprefix("torch.") if 0 <= code < len(_DTYPES) else f"dtype#{code}"


def agree(signature: Signature, n: int, gather: Callable[[torch.Tensor, torch.Tensor], None],
          device: torch.device, where: str) -> np.ndarray:
    """Exchange ``signature`` with every rank (``gather(output, input)`` leaves every rank's vector in
    ``output``, rank order: an AllGather's result, however the transport runs it)
    and raise :class:`CollectiveMismatch` where the ranks disagree; returns the n × (5 + 2n) matrix."""
    mine = torch.tensor(signature.encode(n), dtype=torch.int64, device=device)
    everyone = torch.empty(n * mine.numel(), dtype=torch.int64, device=device)
    gather(everyone, mine)
    matrix = everyone.cpu().numpy().reshape(n, -1)
    problem = _first_disagreement(matrix, n)
    if problem is not None:
        raise CollectiveMismatch(f"{where}: the ranks disagree, {problem}; nothing was sent")
    return matrix


def _differs(matrix: np.ndarray, column: int) -> bool:
    return bool(np.any(matrix[:, column] != matrix[0, column]))


def _by_rank(values: np.ndarray, show: Callable[[int], str] = str) -> str:
    return ", ".join(f"rank {rank}: {show(int(v))}" for rank, v in enumerate(values))


def _first_disagreement(matrix: np.ndarray, n: int) -> str | None:
    if _differs(matrix, 0):
        return "they called different collectives (" + _by_rank(matrix[:, 0], lambda c: OPS[c]) + ")"
    op = OPS[int(matrix[0, 0])]
    if _differs(matrix, 1):
        return "dtypes differ (" + _by_rank(matrix[:, 1], _dtype_name) + ")"
    if _differs(matrix, 4):
        return "reductions differ (" + _by_rank(matrix[:, 4]) + ")"
    whole = {"all_gather": (3, 2), "reduce_scatter": (2, 3)}.get(op)  # (column of n × part, column of part)
    if whole is not None:
        for rank, row in enumerate(matrix):
            if row[whole[0]] != n * row[whole[1]]:
                names = ("output", "input") if op == "all_gather" else ("input", "output")
                return (f"rank {rank}'s {names[0]} has {row[whole[0]]} elements, not {n} × its {names[1]}'s "
                        f"{row[whole[1]]}")
    if op in ("all_gather", "reduce_scatter", "all_reduce") and _differs(matrix, 2):
        return "input elements differ (" + _by_rank(matrix[:, 2]) + ")"
    if op in ("reduce_scatter", "all_reduce") and _differs(matrix, 3):
        return "output elements differ (" + _by_rank(matrix[:, 3]) + ")"
    if op == "all_to_all":
        sends = matrix[:, _FIELDS:_FIELDS + n]  # sends[s, d]: elements s sends to d
        expects = matrix[:, _FIELDS + n:_FIELDS + 2 * n]  # expects[d, s]: elements d expects from s
        for rank in range(n):
            if -1 in sends[rank] or sends[rank].sum() != matrix[rank, 2]:
                return f"rank {rank}'s input_split_sizes do not cover its input of {matrix[rank, 2]} elements"
            if -1 in expects[rank] or expects[rank].sum() != matrix[rank, 3]:
                return f"rank {rank}'s output_split_sizes do not cover its output of {matrix[rank, 3]} elements"
        for d in range(n):
            for s in range(n):
                if sends[s, d] != expects[d, s]:
                    return f"rank {s} sends rank {d} {sends[s, d]} elements, rank {d} expects {expects[d, s]}"
    return None
