"""mccl as a torch.distributed backend: a training script changes only how it creates its group.

::

    import mccl.runtime.backend as mb
    mb.register()                                           # once per process
    group = dist.new_group(ranks, backend="mccl")           # or init_process_group("mccl", ...)
    mb.communicator(group).configure(topology=topo, schedules=[...])
    dist.all_gather_into_tensor(out, inp, group=group)      # runs the mccl schedule

:func:`register` calls ``torch.distributed.Backend.register_backend``; the creator
returns :class:`MCCLProcessGroup`, a Python ``ProcessGroup`` subclass that
torch.distributed calls directly (dispatch ≈ 10 µs) for ``all_gather_into_tensor``
(``all_gather_single``), ``all_to_all_single``, ``reduce_scatter_tensor``
(``reduce_scatter_single``), ``all_reduce``, ``barrier`` and their ``async_op=True``
forms (a ``Work`` made from a Future). Under it lives one long-lived transport group
(gloo on CPU, NCCL where CUDA is available; ``MCCL_TRANSPORT=gloo|nccl`` overrides)
created from the same store, and the hot-swap control channel on that store.

Limit — functional collectives. ``torch.distributed._functional_collectives`` (used
by ``torch.compile`` and DTensor) dispatch through C++ ops that bypass Python process
groups, so they do not reach mccl. Users of those paths keep their NCCL group for the
compiled/DTensor collectives and call mccl explicitly (``mccl.all_gather_into_tensor``
with the communicator) or through an eager ``dist.*`` call on the mccl group, e.g.
for FSDP-style AllGathers issued outside the compiled region.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from mccl.errors import MCCLError
from mccl.runtime import torch_private
from mccl.runtime.communicator import Communicator
from mccl.runtime.hotswap import StoreControl
from mccl.runtime.transport import Transport

__all__ = ["BACKEND", "MCCLProcessGroup", "register", "communicator"]

BACKEND = "mccl"


def _done(result: list[torch.Tensor]) -> object:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return torch_private.work_from_future(future)


@torch_private.add_private_aliases  # torch may reach the gather and reduce-scatter by their private names
class MCCLProcessGroup(dist.ProcessGroup):
    """A ProcessGroup whose collectives run through an mccl :class:`Communicator`."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        transport_name = os.environ.get("MCCL_TRANSPORT") or ("nccl" if torch.cuda.is_available() else "gloo")
        if transport_name == "nccl":
            inner = dist.ProcessGroupNCCL(dist.PrefixStore("mccl-transport/", store), rank, size)
        elif transport_name == "gloo":
            inner = dist.ProcessGroupGloo(dist.PrefixStore("mccl-transport/", store), rank, size, timeout)
        else:
            raise MCCLError(f"MCCL_TRANSPORT must be gloo or nccl, not {transport_name!r}")
        control = StoreControl(store, "mccl-control/", rank, size)
        self.communicator = Communicator(Transport(inner, backend=transport_name), name="mccl-pg", control=control)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def _work(self, work: object | None, result: list[torch.Tensor]) -> object:
        return work if work is not None else _done(result)

    def all_gather_single(self, output, input, opts=None):
        work = self.communicator.all_gather_into_tensor(output, input, async_op=_is_async(opts))
        return self._work(work, [output])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        work = self.communicator.all_to_all_single(output, input, list(output_split_sizes) or None,
                                                   list(input_split_sizes) or None, async_op=_is_async(opts))
        return self._work(work, [output])

    alltoall_base = all_to_all_single

    def reduce_scatter_single(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        work = self.communicator.reduce_scatter_tensor(output, input, op, async_op=_is_async(opts))
        return self._work(work, [output])

    def allreduce(self, tensors, opts=None):
        if len(tensors) != 1:
            raise MCCLError(f"mccl all_reduce takes one tensor, got {len(tensors)}")
        op = opts.reduceOp if opts is not None and not isinstance(opts, dist.ReduceOp) else dist.ReduceOp.SUM
        work = self.communicator.all_reduce(tensors[0], op, async_op=_is_async(opts))
        return self._work(work, list(tensors))

    def barrier(self, opts=None):
        work = self.communicator.barrier(async_op=_is_async(opts))
        return self._work(work, [])


def _is_async(opts: object) -> bool:
    return bool(getattr(opts, "asyncOp", False))


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> MCCLProcessGroup:
    return MCCLProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Register backend ``"mccl"`` with torch.distributed (idempotent)."""
    if BACKEND in dist.Backend.backend_list:  # register_backend adds the name here (public, unlike _plugins)
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])


def communicator(group: dist.ProcessGroup) -> Communicator:
    """The communicator behind a process group created with backend ``"mccl"``."""
    found = getattr(group, "communicator", None)
    if not isinstance(found, Communicator):
        raise MCCLError("this process group was not created with backend 'mccl'")
    return found
