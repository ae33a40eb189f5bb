"""The collectives of a :class:`~mccl.runtime.communicator.Communicator`, as torch.distributed shapes them.

Each method turns one torch-shaped call into a body that the communicator runs in
sequence order (see :mod:`mccl.runtime.communicator`): the pre-flight agreement
(:mod:`mccl.runtime.agreement`, when the communicator checks), then the installed
schedule of the collective's kind through the executor, or torch's own collective on
the transport group when none is installed or the reduction is one the executor does
not implement. A body returns the schedule version it ran, or None when it delegated,
and the communicator records that (:mod:`mccl.runtime.calls`).

Tensors: non-contiguous inputs are copied, non-contiguous outputs are written through
a contiguous copy (gloo accepts both; so does mccl). Reductions arrive as a
``ReduceOp.RedOpType`` (``dist.ReduceOp.SUM``) or a ``ReduceOp`` object (what torch puts
in ``ReduceScatterOptions.reduceOp``); both are mapped to the executor's reducers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from mccl.runtime import executor
from mccl.runtime.agreement import Signature, agree
from mccl.schedule import Collective

__all__ = ["Collectives", "reduction_type", "writable"]


def reduction_type(op: object) -> object:
    """The ``RedOpType`` of a reduction given as a ``RedOpType`` or a ``ReduceOp`` object (the executor's
    reducers are keyed by ``RedOpType``; a ``ReduceOp`` object compares equal but hashes differently)."""
    if isinstance(op, dist.ReduceOp.RedOpType):  # (isinstance(RedOpType, ReduceOp) is True: test this first)
        return op
    return op.op if hasattr(op, "op") else op


def writable(tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """A contiguous tensor to write the result into, and what copies it back into ``tensor`` after."""
    if tensor.is_contiguous():
        return tensor, lambda: None
    staged = tensor.contiguous()  # a copy holding the current values (in-place collectives read them)
    return staged, lambda: tensor.copy_(staged)


def _rows(tensor: torch.Tensor) -> int:
    return tensor.shape[0] if tensor.dim() else 1


def _split_elements(splits: Sequence[int] | None, tensor: torch.Tensor, n: int) -> list[int]:
    """AllToAll split sizes in elements (torch gives them in rows of dim 0; none: even rows)."""
    rows = _rows(tensor)
    per_row = tensor.numel() // rows if rows else 0
    if not splits:
        return [rows // n * per_row] * n if rows % n == 0 else [-1] * n
    return [int(rows_of_peer) * per_row for rows_of_peer in splits]


class Collectives:
    """Mixin: ``then`` (every collective): runs after the result is in place, in the call's turn (the
    backend copies a list-form call's result out with it).

    Mixin: the collectives of a communicator (needs ``_submit``, ``_execute``, ``_split_matrix``,
    ``transport``, ``size``, ``rank``, ``check`` and ``name`` from the class it is mixed into)."""

    def _agree(self, signature: Signature, op: str, seq: int) -> None:
        if self.check:
            device = torch.device("cuda") if self.transport.backend == "nccl" else torch.device("cpu")
            agree(signature, self.size, self.transport.native_all_gather, device,
                  f"{op} #{seq} on communicator {self.name!r}")

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, *, async_op: bool = False,
                               op: str = "all_gather_into_tensor", then: Callable[[], None] | None = None):
        def body(seq: int, installed) -> int | None:
            source = input.contiguous()
            target, finish = writable(output)
            self._agree(Signature("all_gather", source.dtype, source.numel(), target.numel()), op, seq)
            if installed is None:
                self.transport.native_all_gather(target, source)
                version = None
            else:
                self._execute(installed, executor.all_gather_buffers(installed.plan, target, source), seq)
                version = installed.version
            finish()
            if then is not None:
                then()
            return version
        return self._submit(Collective.ALLGATHER, op, body, [output], async_op)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: Sequence[int] | None = None,
                          input_split_sizes: Sequence[int] | None = None, *, async_op: bool = False,
                          op: str = "all_to_all_single", then: Callable[[], None] | None = None):
        out_splits = list(output_split_sizes or [])
        in_splits = list(input_split_sizes or [])

        def body(seq: int, installed) -> int | None:
            source = input.contiguous()
            target, finish = writable(output)
            self._agree(Signature("all_to_all", source.dtype, source.numel(), target.numel(),
                                  input_splits=_split_elements(in_splits, source, self.size),
                                  output_splits=_split_elements(out_splits, target, self.size)), op, seq)
            if installed is None:
                self.transport.native_all_to_all(target, source, out_splits, in_splits)
                version = None
            else:
                buffers = executor.all_to_all_buffers(installed.plan, target, source, out_splits or None,
                                                      in_splits or None, self._split_matrix, installed.layouts)
                self._execute(installed, buffers, seq)
                version = installed.version
            finish()
            if then is not None:
                then()
            return version
        return self._submit(Collective.ALLTOALL, op, body, [output], async_op)

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op: object = dist.ReduceOp.SUM, *,
                              async_op: bool = False, name: str = "reduce_scatter_tensor",
                              then: Callable[[], None] | None = None):
        reduction = reduction_type(op)

        def body(seq: int, installed) -> int | None:
            source = input.contiguous()
            target, finish = writable(output)
            self._agree(Signature("reduce_scatter", source.dtype, source.numel(), target.numel(),
                                  int(reduction)), name, seq)
            if installed is None or reduction not in executor.REDUCERS or (
                    reduction == dist.ReduceOp.AVG and not source.is_floating_point()):
                self.transport.native_reduce_scatter(target, source, op)
                version = None
            else:
                buffers = executor.reduce_scatter_buffers(installed.plan, target, source, reduction)
                self._execute(installed, buffers, seq)
                version = installed.version
            finish()
            if then is not None:
                then()
            return version
        return self._submit(Collective.REDUCESCATTER, name, body, [output], async_op)

    def all_reduce(self, tensor: torch.Tensor, op: object = dist.ReduceOp.SUM, *, async_op: bool = False,
                   name: str = "all_reduce", then: Callable[[], None] | None = None):
        """ReduceScatter with torch's own collective (the reduction stays on the vendor path),
        then AllGather through mccl (mccl-paper §3); a reduction torch's ReduceScatter lacks on
        this transport (bitwise ones) runs torch's AllReduce."""
        reduction = reduction_type(op)

        def body(seq: int, installed) -> int | None:
            work, finish = writable(tensor)
            flat = work.reshape(-1)
            self._agree(Signature("all_reduce", flat.dtype, flat.numel(), flat.numel(), int(reduction)), name, seq)
            if reduction not in executor.REDUCERS:
                options = dist.AllreduceOptions()
                options.reduceOp = op
                self.transport.group.allreduce([work], options).wait()
                finish()
                if then is not None:
                    then()
                return None
            if flat.is_complex():
                flat = torch.view_as_real(flat).reshape(-1)
            n = self.size
            per_rank = -(-flat.numel() // n)
            source = torch.zeros(per_rank * n, dtype=flat.dtype, device=flat.device)
            source[:flat.numel()].copy_(flat)
            target = flat if per_rank * n == flat.numel() else torch.empty_like(source)
            mine = target[self.rank * per_rank:(self.rank + 1) * per_rank]
            self.transport.native_reduce_scatter(mine, source, op)
            if installed is None:
                self.transport.native_all_gather(target, mine.clone())
            else:
                self._execute(installed, executor.all_gather_buffers(installed.plan, target, mine), seq)
            if target is not flat:
                flat.copy_(target[:flat.numel()])
            finish()
            if then is not None:
                then()
            return None if installed is None else installed.version
        return self._submit(Collective.ALLGATHER, name, body, [tensor], async_op)

    def barrier(self, *, async_op: bool = False):
        def body(seq: int, installed) -> None:
            self.transport.barrier()
        return self._submit(None, "barrier", body, [], async_op)

    def _split_matrix(self, mine: list[int]) -> np.ndarray:
        """Every rank's input splits (elements), gathered over the transport (relays need them)."""
        device = torch.device("cuda") if self.transport.backend == "nccl" else torch.device("cpu")
        local = torch.tensor(mine, dtype=torch.int64, device=device)
        gathered = torch.empty(self.size * len(mine), dtype=torch.int64, device=device)
        self.transport.native_all_gather(gathered, local)
        return gathered.cpu().numpy().reshape(self.size, self.size)
