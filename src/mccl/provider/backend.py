"""The torch.distributed backend of a tenant process: its collectives run in the provider service (MCCS §3.1).

::

    import mccl.provider.backend as pb
    pb.register(shim)                                   # or register() with MCCL_PROVIDER_ENDPOINT and
                                                        # MCCL_PROVIDER_CREDENTIAL (a credential file) set
    dist.init_process_group("mccl_provider", ...)       # was "gloo"; or new_group(backend="mccl_provider")
    # DDP: unchanged

A group is one *job* of the tenant in the services: each rank's process talks to its own host's
service (its :class:`~mccl.provider.shim.Shim`), the ranks tell each other their service ranks
through the group's store, and every rank joins the job ``torch/<group name>/<nonce>`` with the
services in rank order (so a group's ranks must sit on distinct hosts: one service rank each, the
service's model). Through the service, on CPU tensors of the dtypes :data:`~.protocol.DTYPES` names:

* ``all_gather_into_tensor`` and list-form ``all_gather``, ``reduce_scatter_tensor`` and list-form
  ``reduce_scatter``, ``all_reduce`` (and coalesced), ``all_to_all_single`` with even splits;
* ``broadcast`` as an AllGather of which every rank keeps the root's block (exact bits; it moves
  ``size`` × the tensor), and ``barrier`` as a one-element AllReduce — so DDP's parameter
  broadcast and its gradient AllReduces both run in the service.

Tensors are copied into and out of the tenant's shared allocation (the shim's staging slots), or
used in place when they live there already (``shim.empty``). Everything else (uneven AllToAll,
bitwise reductions, reduce, gather, scatter, point-to-point, other dtypes or devices) runs on a gloo group among the
tenant's own processes, registered as the group's c10d backend — as the "mccl" backend registers its
delegate (:mod:`mccl.runtime.backend`), which also gives torch the group's name. :attr:`ProviderProcessGroup.served`
and :attr:`~ProviderProcessGroup.delegated` count which path each operation took.

Every call is synchronous (the shim's request is): an ``async_op`` call returns a completed Work.
"""

from __future__ import annotations

import collections
import os
import secrets
import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from mccl.errors import MCCLError
from mccl.provider.keys import read_credential
from mccl.provider.protocol import REDUCTIONS
from mccl.provider.shim import _DTYPE_NAMES, ProviderCommunicator, Shim
from mccl.runtime import torch_private
from mccl.runtime.collectives import reduction_type

__all__ = ["BACKEND", "ProviderProcessGroup", "register"]

BACKEND = "mccl_provider"


def _done(result: list[torch.Tensor]) -> object:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return torch_private.work_from_future(future)


def _reduce(opts: object) -> str:
    """The service's name of a reduction given as options, a ``ReduceOp`` or a ``RedOpType``."""
    if opts is None:
        return "sum"
    op = opts if isinstance(opts, dist.ReduceOp | dist.ReduceOp.RedOpType) else opts.reduceOp
    return reduction_type(op).name.lower().replace("product", "prod")


@torch_private.add_private_aliases  # torch reaches the gather and reduce-scatter by their private names too
class ProviderProcessGroup(dist.ProcessGroup):
    """A ProcessGroup whose collectives run in the provider service (module docstring)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta, *, group_name: str,
                 shim: Shim) -> None:
        super().__init__(rank, size)
        self.shim = shim
        prefix = dist.PrefixStore("mccl-provider/", store)
        prefix.set(f"host/{rank}", str(shim.host))
        if rank == 0:  # a fresh job per group: a re-created group never meets a stale one in the service
            prefix.set("nonce", secrets.token_hex(6))
        hosts = [int(prefix.get(f"host/{peer}")) for peer in range(size)]
        job = f"torch/{group_name or 'default'}/{prefix.get('nonce').decode()}"[-128:]
        self.comm: ProviderCommunicator = shim.join(job, hosts)
        self.delegate = dist.ProcessGroupGloo(dist.PrefixStore("mccl-provider-delegate/", store), rank, size, timeout)
        torch_private.register_backend(self, "cpu", dist.ProcessGroup.BackendType.GLOO, self.delegate)
        self.served: collections.Counter[str] = collections.Counter()
        self.delegated: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # one operation at a time (DDP's hooks run on autograd's thread)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # ---- routing --------------------------------------------------------------------
    def _serves(self, *tensors: torch.Tensor) -> bool:
        """Whether the service can run a call on these tensors (CPU, a dtype of the protocol, one dtype)."""
        return bool(tensors) and all(t.device.type == "cpu" and t.dtype in _DTYPE_NAMES and t.dtype == tensors[0].dtype
                                     for t in tensors)

    def _serve(self, op: str, body: Callable[[], None], result: list[torch.Tensor]) -> object:
        with self._lock:
            body()
        self.served[op] += 1
        return _done(result)

    def _delegate(self, op: str, call: Callable[[object], object]) -> object:
        self.delegated[op] += 1
        return call(self.delegate)

    # ---- AllGather ------------------------------------------------------------------
    def all_gather_single(self, output, input, opts=None):
        if not self._serves(output, input):
            return self._delegate("all_gather_into_tensor",
                                  lambda b: torch_private.all_gather_base(b, output, input))
        return self._serve("all_gather_into_tensor",
                           lambda: self.comm.all_gather_into_tensor(output, input), [output])

    def allgather(self, output_tensors, input_tensors, opts=None):
        outputs = output_tensors[0] if len(output_tensors) == 1 else []
        source = input_tensors[0] if len(input_tensors) == 1 else None
        if (source is None or len(outputs) != self.size() or not self._serves(source, *outputs)
                or any(o.numel() != source.numel() for o in outputs)):
            return self._delegate("all_gather", lambda b: b.allgather(output_tensors, input_tensors,
                                                                      opts or torch_private.AllgatherOptions()))

        def body() -> None:
            flat = source.new_empty(self.size() * source.numel())
            self.comm.all_gather_into_tensor(flat, source.reshape(-1))
            for rank, out in enumerate(outputs):
                out.copy_(flat[rank * source.numel():(rank + 1) * source.numel()].view_as(out))
        return self._serve("all_gather", body, list(outputs))

    # ---- ReduceScatter --------------------------------------------------------------
    def reduce_scatter_single(self, output, input, opts=None):
        if not self._serves(output, input) or _reduce(opts) not in REDUCTIONS:
            return self._delegate("reduce_scatter_tensor", lambda b: torch_private.reduce_scatter_base(
                b, output, input, opts or dist.ReduceScatterOptions()))
        return self._serve("reduce_scatter_tensor", lambda: self.comm.reduce_scatter_tensor(
            output, input, _reduce(opts)), [output])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        output = output_tensors[0] if len(output_tensors) == 1 else None
        inputs = input_tensors[0] if len(input_tensors) == 1 else []
        if (output is None or len(inputs) != self.size() or not self._serves(output, *inputs)
                or any(i.numel() != output.numel() for i in inputs) or _reduce(opts) not in REDUCTIONS):
            return self._delegate("reduce_scatter", lambda b: b.reduce_scatter(output_tensors, input_tensors,
                                                                               opts or dist.ReduceScatterOptions()))
        return self._serve("reduce_scatter", lambda: self.comm.reduce_scatter_tensor(
            output, torch.cat([i.reshape(-1) for i in inputs]), _reduce(opts)), [output])

    # ---- AllReduce ------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        if not self._serves(*tensors) or _reduce(opts) not in REDUCTIONS:
            options = opts if isinstance(opts, dist.AllreduceOptions) else dist.AllreduceOptions()
            if opts is not None and not isinstance(opts, dist.AllreduceOptions):
                options.reduceOp = opts
            return self._delegate("all_reduce", lambda b: b.allreduce(tensors, options))
        reduce = _reduce(opts)

        def body() -> None:
            for tensor in tensors:
                self.comm.all_reduce(tensor, reduce)
        return self._serve("all_reduce", body, list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    # ---- AllToAll -------------------------------------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        even = all(len(set(splits)) <= 1 and (not splits or splits[0] * self.size() == t.shape[0])
                   for splits, t in ((list(output_split_sizes), output), (list(input_split_sizes), input)))
        if not (even and self._serves(output, input)):
            return self._delegate("all_to_all_single", lambda b: b.alltoall_base(
                output, input, list(output_split_sizes), list(input_split_sizes), opts or dist.AllToAllOptions()))
        return self._serve("all_to_all_single",
                           lambda: self.comm.all_to_all_single(output, input), [output])

    alltoall_base = all_to_all_single  # the name before torch 2.13

    # ---- through the service, built on the above ----------------------------------------
    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        if not self._serves(*tensors) or any(not t.is_contiguous() for t in tensors):
            return self._delegate("broadcast", lambda b: b.broadcast(tensors, opts or dist.BroadcastOptions()))

        def body() -> None:
            for tensor in tensors:
                flat = tensor.view(-1)
                gathered = flat.new_empty(self.size() * flat.numel())
                self.comm.all_gather_into_tensor(gathered, flat)
                flat.copy_(gathered[root * flat.numel():(root + 1) * flat.numel()])
        return self._serve("broadcast", body, list(tensors))

    def barrier(self, opts=None):
        return self._serve("barrier", lambda: self.comm.all_reduce(torch.zeros(1)), [])

    # ---- delegated: gloo among the tenant's own processes -----------------------------
    def reduce(self, tensors, opts=None):
        return self._delegate("reduce", lambda b: b.reduce(tensors, opts or dist.ReduceOptions()))

    def gather(self, output_tensors, input_tensors, opts=None):
        return self._delegate("gather", lambda b: b.gather(output_tensors, input_tensors,
                                                           opts or dist.GatherOptions()))

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._delegate("scatter", lambda b: b.scatter(output_tensors, input_tensors,
                                                             opts or dist.ScatterOptions()))

    def send(self, tensors, dst, tag=0):
        return self._delegate("send", lambda b: b.send(tensors, dst, tag))

    def recv(self, tensors, src, tag=0):
        return self._delegate("recv", lambda b: b.recv(tensors, src, tag))

    def recv_anysource(self, tensors, tag=0):
        return self._delegate("recv_anysource", lambda b: b.recv_anysource(tensors, tag))

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self._delegate("all_gather_coalesced", lambda b: b.allgather_coalesced(
            output_lists, input_list, opts or torch_private.AllgatherOptions()))

    # ---- coalescing: every call is synchronous, so a window's Work is done when it closes ----------
    def start_coalescing(self, device=None):
        pass

    def end_coalescing(self, device=None):
        return _done([])


class _Creator:
    """What torch calls to build a "mccl_provider" group; holds the process's shim (one session per process)."""

    def __init__(self, shim: Shim | None) -> None:
        self.shim = shim

    def __call__(self, options: object, _backend_options: object = None) -> ProviderProcessGroup:
        if self.shim is None:
            endpoint, path = os.environ.get("MCCL_PROVIDER_ENDPOINT"), os.environ.get("MCCL_PROVIDER_CREDENTIAL")
            if not endpoint or not path:
                raise MCCLError("backend 'mccl_provider' needs a shim: pass one to register(), or set "
                                "MCCL_PROVIDER_ENDPOINT and MCCL_PROVIDER_CREDENTIAL (a credential file)")
            self.shim = Shim(endpoint, read_credential(path))
        return ProviderProcessGroup(options.store, options.group_rank, options.group_size, options.timeout,
                                    group_name=options.group_id, shim=self.shim)


def register(shim: Shim | None = None) -> None:
    """Register backend ``"mccl_provider"`` for cpu tensors (once per process; a later call replaces the shim).
    Without ``shim``, the first group opens one from ``MCCL_PROVIDER_ENDPOINT`` and ``MCCL_PROVIDER_CREDENTIAL``."""
    creator = torch_private.backend_creator(BACKEND)
    if isinstance(creator, _Creator):
        creator.shim = shim
        return
    if creator is not None:
        raise MCCLError(f"a backend named {BACKEND!r} is already registered with torch.distributed, not mccl's")
    dist.Backend.register_backend(BACKEND, _Creator(shim), extended_api=True, devices=["cpu"])
