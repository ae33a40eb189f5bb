"""The tenant's thin shim: mccl's collective API on torch tensors, run by the provider service (MCCS §3.1).

::

    shim = Shim(endpoint, credential)                      # a session of this process's own
    comm = shim.join("train", hosts=[0, 1])                # every host's tenant process of the job joins
    x = shim.empty((1024,), torch.float32)                 # a tensor in service-allocated shared memory
    comm.all_reduce(x)                                     # the service runs it; x holds the sum
    comm.all_gather_into_tensor(out, x)

Buffers. :meth:`Shim.empty` returns tensors that view shared memory the service allocated (one
allocation each); a collective on them moves no byte between the tenant and the service — the
shim sends only (allocation id, offset, length) references, which it finds from the tensor's
address. A tensor that is not in such memory is staged: copied into a scratch allocation (kept per
argument slot and grown as needed) before the call and its result copied out after — correct, one
copy each way slower.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from mccl.provider import channel
from mccl.provider.client import Allocation, FastRequest, Joined, ProviderClient
from mccl.provider.errors import ProviderError

__all__ = ["Shim", "ProviderCommunicator"]

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
                torch.int8: "int8", torch.uint8: "uint8"}
_REDUCE_NAMES = {"sum": "sum", "prod": "prod", "product": "prod", "min": "min", "max": "max", "avg": "avg"}


class Shim(ProviderClient):
    """A :class:`~.client.ProviderClient` that speaks torch tensors (see module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._bytes: dict[int, torch.Tensor] = {}  # allocation id -> uint8 tensor over all of it
        self._staging: dict[int, Allocation] = {}
        self._refs: dict[tuple[int, int], list[int]] = {}  # (address, bytes) -> reference, while the memory lives
        self._sent: dict[tuple, FastRequest] = {}  # (comm, kind, op, each tensor's address, bytes, dtype) -> request

    def alloc(self, nbytes: int) -> Allocation:
        allocation = super().alloc(nbytes)
        self._bytes[allocation.alloc_id] = torch.frombuffer(allocation.buffer, dtype=torch.uint8)
        return allocation

    def free(self, allocation: Allocation) -> None:
        self._bytes.pop(allocation.alloc_id, None)
        self._refs.clear()  # (a later allocation may be mapped at a freed one's addresses)
        self._sent.clear()
        super().free(allocation)

    def tensor(self, allocation: Allocation, shape: Sequence[int], dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
        """A tensor viewing ``allocation`` from byte ``offset``."""
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if offset < 0 or offset + nbytes > allocation.nbytes:
            raise ProviderError(f"{nbytes} bytes at offset {offset} do not fit allocation {allocation.alloc_id}")
        return self._bytes[allocation.alloc_id][offset:offset + nbytes].view(dtype).view(tuple(shape))

    def empty(self, shape: Sequence[int] | int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor in an allocation of its own (collectives on it copy nothing)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = max(1, math.prod(shape) * torch.empty(0, dtype=dtype).element_size())
        return self.tensor(self.alloc(nbytes), shape, dtype)

    def free_tensor(self, tensor: torch.Tensor) -> None:
        """Free the allocation a tensor of :meth:`empty` lives in."""
        ref = self.ref(tensor)
        if ref is None:
            raise ProviderError("the tensor is not in an allocation of this client")
        self.free(self.allocations[ref[0]])

    def ref(self, tensor: torch.Tensor) -> list[int] | None:
        """[allocation id, offset, length] of a contiguous CPU tensor inside one of this client's allocations."""
        if not tensor.is_cpu or not tensor.is_contiguous():  # (is_cpu: 0.3 µs; device.type: 1.6 µs)
            return None
        start, length = tensor.data_ptr(), tensor.nbytes
        found = self._refs.get((start, length))
        if found is not None:
            return found
        for alloc_id, whole in self._bytes.items():
            base = whole.data_ptr()
            if base <= start and start + length <= base + whole.numel():
                if len(self._refs) >= 256:
                    self._refs.clear()
                found = self._refs[(start, length)] = [alloc_id, start - base, length]
                return found
        return None

    def _staged(self, tensor: torch.Tensor, slot: int) -> torch.Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        allocation = self._staging.get(slot)
        if allocation is None or allocation.nbytes < nbytes:
            if allocation is not None:
                self.free(allocation)
            allocation = self._staging[slot] = self.alloc(max(nbytes, 1))
        return self.tensor(allocation, tuple(tensor.shape), tensor.dtype)

    def direct(self, on: bool) -> None:
        """Whether this session's one-host (world-1) jobs run their collectives as copies in the service's thread
        (:mod:`.direct`; the default) or all on gloo: what the benchmarks flip for their same-run A/B."""
        self.request({"op": "direct", "on": on})

    def poll(self, on: bool) -> None:
        """Whether the service's thread for this session polls for its next request a while after each reply
        (``ServiceConfig.poll_us``; the default) or sleeps at once: what the benchmarks flip for their A/B."""
        self.request({"op": "poll", "on": on})

    def join(self, job: str, hosts: Sequence[int]) -> ProviderCommunicator:  # type: ignore[override]
        """This process's rank of ``job`` (its host's place in ``hosts``); every host's process must join."""
        return ProviderCommunicator(self, super().join(job, hosts))


class ProviderCommunicator:
    """mccl's collective API (``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_reduce``,
    ``all_to_all_single``; reductions by name or as ``torch.distributed.ReduceOp``) for one job."""

    def __init__(self, shim: Shim, joined: Joined) -> None:
        self.shim, self.joined = shim, joined
        self.rank, self.size = joined.rank, joined.size
        self._comm = joined.comm

    def _call(self, kind: str, tensors: Sequence[torch.Tensor], op: object = "sum") -> None:
        """``tensors[0]`` is the output (written back when staged), the rest inputs. A call on the same tensors as
        an earlier one (a training loop's) sends that call's encoded request again (:attr:`Shim._sent`): its
        tensors' addresses, sizes and dtypes are the cache's key, and only what the key does not say is checked
        again (each tensor still a contiguous CPU tensor); a freed allocation empties the cache."""
        shim = self.shim
        key: tuple = (self._comm, kind, op)
        for tensor in tensors:
            key += (tensor.data_ptr(), tensor.nbytes, tensor.dtype)
        try:
            request = shim._sent.get(key)
        except TypeError:  # (a reduction object that cannot be a key)
            request, key = None, None
        if request is not None and shim.trace is None and shim._cpu is None and shim._channel is not None:
            for tensor in tensors:
                if not (tensor.is_cpu and tensor.is_contiguous()):
                    break
            else:
                with shim._lock:
                    shim.send_fast(request)
                return
        self._call_checked(kind, tensors, _reduce_name(op), key)

    def _call_checked(self, kind: str, tensors: Sequence[torch.Tensor], reduce: str, key: tuple | None) -> None:
        """:meth:`_call` without its cache: every tensor's reference found (or staged), then sent; a request on
        tensors that are all in shared memory is kept under ``key`` for the next call."""
        first = tensors[0].dtype
        dtype = _DTYPE_NAMES.get(first)
        refs, copy_out = [], None
        for slot, tensor in enumerate(tensors):
            if dtype is None or tensor.dtype is not first:  # (torch dtypes are singletons)
                raise ProviderError(f"{kind}: one dtype of {', '.join(_DTYPE_NAMES.values())} for every tensor")
            ref = self.shim.ref(tensor)
            if ref is None:  # not in shared memory: stage it
                staged = self._stage(tensor, slot)
                if slot == 0:
                    copy_out = staged
                ref = self.shim.ref(staged)
                key = None
            refs.append(ref)
        fits = reduce in channel.REDUCE_CODES
        self.shim._collective(self.joined, kind, dtype, refs, reduce, fits)
        if copy_out is not None:
            tensors[0].copy_(copy_out)
        elif key is not None and fits and self.shim._channel is not None:
            if len(self.shim._sent) >= 256:
                self.shim._sent.clear()
            self.shim._sent[key] = self.shim.fast_request(self.joined, kind, dtype, refs, reduce)

    def _stage(self, tensor: torch.Tensor, slot: int) -> torch.Tensor:
        staged = self.shim._staged(tensor, slot)
        staged.copy_(tensor)
        return staged

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._call("all_gather", [output, input])

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op: object = "sum") -> None:
        self._call("reduce_scatter", [output, input], op)

    def all_reduce(self, tensor: torch.Tensor, op: object = "sum") -> None:
        self._call("all_reduce", [tensor], op)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._call("all_to_all", [output, input])


def _reduce_name(op: object) -> str:
    """A reduction by name (``"sum"``) or as ``torch.distributed.ReduceOp.SUM``."""
    name = op if isinstance(op, str) else str(getattr(op, "name", op)).rsplit(".", 1)[-1]
    return _REDUCE_NAMES.get(name.lower(), name.lower())
