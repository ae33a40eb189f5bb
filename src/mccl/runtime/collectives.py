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
from mccl.runtime.buffers import check_shapes
from mccl.runtime.reduction_order import ReductionOrder, gloo_segments
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
    """Mixin: the collectives of a communicator (needs ``_submit``, ``_execute``, ``_split_matrix``,
    ``transport``, ``size``, ``rank``, ``check`` and ``name`` from the class it is mixed into).

    ``then`` (every collective): runs after the result is in place, in the call's turn (the
    backend copies a list-form call's result out with it).

    ``reduction_order``: ``"gloo"`` adds a ReduceScatter's contributions in the order gloo's
    allreduce does (:mod:`mccl.runtime.reduction_order`), so sums are bit-identical to gloo's where
    the installed schedule delivers them unsummed; None: in the schedule's own order. The torch
    backend sets it for a gloo transport."""

    reduction_order: str | None = None

    def _agree(self, signature: Signature, op: str, seq: int) -> None:
        if self.check:
            device = torch.device("cuda") if self.transport.backend == "nccl" else torch.device("cpu")
            agree(signature, self.size, self._gather_signatures, device, f"{op} #{seq} on communicator {self.name!r}")

    def _gather_signatures(self, output: torch.Tensor, mine: torch.Tensor) -> None:
        """The agreement's AllGather of one small vector, as an AllToAll of that vector sent to every rank:
        the same matrix, but gloo posts an AllToAll's messages all at once (one round trip), where its
        AllGather of a small buffer takes n − 1 in sequence: measured on 4 ranks, 0.2–0.8 ms CPU per
        call against 0.9–1.2 ms, and 1.0–4.4 ms wall against 5.1–6.9 ms, depending on the machine's load
        (``benchmarks/backend_probe.py small``, BENCHMARKS.md 2026-12-01 third session)."""
        self.transport.native_all_to_all(output, mine.repeat(self.size), [], [])

    def _collective(self, kind: Collective, op: str, output: torch.Tensor, input: torch.Tensor,
                    signature: Callable[[torch.Tensor, torch.Tensor], Signature],
                    native: Callable[[torch.Tensor, torch.Tensor], None],
                    scheduled: Callable[[object, torch.Tensor, torch.Tensor, int], None],
                    then: Callable[[], None] | None, async_op: bool,
                    runs_schedule: Callable[[torch.Tensor], bool] = lambda _source: True,
                    splits: tuple[Sequence[int] | None, Sequence[int] | None] = (None, None)):
        """The one body every collective runs in its turn, once the call's shapes passed
        :func:`~mccl.runtime.buffers.check_shapes` (at the call: a shape error launches nothing): inputs made contiguous, the agreement,
        then ``scheduled(installed, target, source, seq)`` when a schedule of ``kind`` is installed
        and ``runs_schedule(source)``, else ``native(target, source)``; the result copied back into a
        non-contiguous output, ``then``. Returns the schedule version that ran, or None (delegated)."""
        def body(seq: int, installed) -> int | None:
            source = input.contiguous()
            target, finish = writable(output)
            self._agree(signature(source, target), op, seq)
            if installed is None or not runs_schedule(source):
                native(target, source)
                version = None
            else:
                scheduled(installed, target, source, seq)
                version = installed.version
            finish()
            if then is not None:
                then()
            return version
        if kind is not Collective.ALLGATHER or output is not input:  # (AllReduce: one tensor, nothing to check)
            shape = {Collective.ALLGATHER: "all_gather", Collective.ALLTOALL: "all_to_all",
                     Collective.REDUCESCATTER: "reduce_scatter"}[kind]
            check_shapes(shape, output, input, self.size, *splits)
        return self._submit(kind, op, body, [output], async_op)

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, *, async_op: bool = False,
                               op: str = "all_gather_into_tensor", then: Callable[[], None] | None = None):
        def scheduled(installed, target: torch.Tensor, source: torch.Tensor, seq: int) -> None:
            self._execute(installed, executor.all_gather_buffers(installed.plan, target, source), seq)

        return self._collective(Collective.ALLGATHER, op, output, input,
                                lambda s, t: Signature("all_gather", s.dtype, s.numel(), t.numel()),
                                self.transport.native_all_gather, scheduled, then, async_op)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: Sequence[int] | None = None,
                          input_split_sizes: Sequence[int] | None = None, *, async_op: bool = False,
                          op: str = "all_to_all_single", then: Callable[[], None] | None = None):
        out_splits = list(output_split_sizes or [])
        in_splits = list(input_split_sizes or [])

        def signature(source: torch.Tensor, target: torch.Tensor) -> Signature:
            return Signature("all_to_all", source.dtype, source.numel(), target.numel(),
                             input_splits=_split_elements(in_splits, source, self.size),
                             output_splits=_split_elements(out_splits, target, self.size))

        def scheduled(installed, target: torch.Tensor, source: torch.Tensor, seq: int) -> None:
            self._execute(installed, executor.all_to_all_buffers(installed.plan, target, source, out_splits or None,
                                                                 in_splits or None, self._split_matrix,
                                                                 installed.layouts), seq)

        return self._collective(Collective.ALLTOALL, op, output, input, signature,
                                lambda t, s: self.transport.native_all_to_all(t, s, out_splits, in_splits),
                                scheduled, then, async_op, splits=(out_splits, in_splits))

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op: object = dist.ReduceOp.SUM, *,
                              async_op: bool = False, name: str = "reduce_scatter_tensor",
                              then: Callable[[], None] | None = None, per_block_buffers: bool = False):
        """``per_block_buffers``: the input is list-form ``reduce_scatter``'s tensors concatenated, which
        gloo reduces one by one (it matters to the order of the additions, not to the result's meaning)."""
        reduction = reduction_type(op)

        def scheduled(installed, target: torch.Tensor, source: torch.Tensor, seq: int) -> None:
            order = None
            if self.reduction_order == "gloo":
                order = ReductionOrder(source.numel(), target.numel() if per_block_buffers else None)
            self._execute(installed, executor.reduce_scatter_buffers(installed.plan, target, source, reduction,
                                                                     order), seq)

        return self._collective(
            Collective.REDUCESCATTER, name, output, input,
            lambda s, t: Signature("reduce_scatter", s.dtype, s.numel(), t.numel(), int(reduction)),
            lambda t, s: self.transport.native_reduce_scatter(t, s, op), scheduled, then, async_op,
            lambda source: reduction in executor.REDUCERS and (
                reduction != dist.ReduceOp.AVG or source.is_floating_point()))

    def all_reduce(self, tensor: torch.Tensor, op: object = dist.ReduceOp.SUM, *, async_op: bool = False,
                   name: str = "all_reduce", then: Callable[[], None] | None = None):
        """ReduceScatter with torch's own collective (the reduction stays on the vendor path),
        then AllGather through mccl (mccl-paper §3). torch's AllReduce runs instead for a reduction
        torch's ReduceScatter lacks on this transport (bitwise ones), and, with the gloo order, where
        padding the tensor to ``n`` equal blocks would change how gloo cuts it into segments (then
        gloo's ReduceScatter of the padded tensor would add in another order than its AllReduce)."""
        reduction = reduction_type(op)

        def native(target: torch.Tensor, _source: torch.Tensor) -> None:
            self.transport.native_all_reduce(target, op)

        def scheduled(installed, target: torch.Tensor, _source: torch.Tensor, seq: int) -> None:
            flat = target.reshape(-1)
            if flat.is_complex():
                flat = torch.view_as_real(flat).reshape(-1)
            n = self.size
            per_rank = -(-flat.numel() // n)
            padded = torch.zeros(per_rank * n, dtype=flat.dtype, device=flat.device)
            padded[:flat.numel()].copy_(flat)
            gathered = flat if per_rank * n == flat.numel() else torch.empty_like(padded)
            mine = gathered[self.rank * per_rank:(self.rank + 1) * per_rank]
            self.transport.native_reduce_scatter(mine, padded, op)
            self._execute(installed, executor.all_gather_buffers(installed.plan, gathered, mine), seq)
            if gathered is not flat:
                flat.copy_(gathered[:flat.numel()])

        def runs_schedule(source: torch.Tensor) -> bool:
            if reduction not in executor.REDUCERS:
                return False
            if self.reduction_order != "gloo" or source.numel() % self.size == 0:
                return True
            elements = source.numel() * (2 if source.is_complex() else 1)
            padded = -(-elements // self.size) * self.size
            size = source.element_size() // (2 if source.is_complex() else 1)
            return gloo_segments(elements, self.size, size) == gloo_segments(padded, self.size, size)

        return self._collective(
            Collective.ALLGATHER, name, tensor, tensor,
            lambda s, _t: Signature("all_reduce", s.dtype, s.numel(), s.numel(), int(reduction)),
            native, scheduled, then, async_op, runs_schedule)

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
