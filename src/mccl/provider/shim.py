"""The tenant's side: a thin shim with mccl's collective API over the provider service (MCCS §3.1).

::

    client = ProviderClient(endpoint, credential)           # hello: a session of its own
    comm = client.join("train", hosts=[0, 1])               # every host's tenant process of the job
    x = client.empty((1024,), torch.float32)                # a tensor in service-allocated shared memory
    comm.all_reduce(x)                                      # the service runs it; x holds the sum
    comm.all_gather_into_tensor(out, x)

Buffers. :meth:`ProviderClient.empty` returns tensors that view shared memory the service allocated
(one allocation each); a collective on them moves no byte between the tenant and the service. A
tensor that is not in such memory is staged: copied into a scratch allocation (kept per size)
before the call and out of it after — correct, one copy each way slower.

:meth:`ProviderClient.request` is the raw protocol (:mod:`.protocol`), what the shim itself uses and
what a test's hostile tenant sends garbage through. A reply ``error`` is raised as its
:mod:`.errors` class. Every wait is bounded by ``timeout_s``; an unanswered request raises
:class:`~.errors.ProviderError` (the socket is then rebuilt, so a late reply is never taken for the
next request's).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from mccl.provider.errors import ERRORS, ProviderError
from mccl.provider.keys import TenantCredential
from mccl.provider.memory import map_segment
from mccl.provider.protocol import decode_reply, encode

__all__ = ["ProviderClient", "ProviderCommunicator", "Allocation"]

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
                torch.int8: "int8", torch.uint8: "uint8"}
_REDUCE_NAMES = {"sum": "sum", "prod": "prod", "product": "prod", "min": "min", "max": "max", "avg": "avg"}


@dataclass(eq=False)
class Allocation:
    """One service-allocated shared-memory buffer, mapped here: ``alloc_id`` names it to the service."""

    alloc_id: int
    nbytes: int
    buffer: mmap.mmap = field(repr=False)
    whole: torch.Tensor = field(repr=False)  # uint8 view of every byte; tensors are views of it

    @property
    def base(self) -> int:
        return self.whole.data_ptr()

    def tensor(self, shape: Sequence[int], dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
        count = math.prod(shape)
        nbytes = count * torch.empty(0, dtype=dtype).element_size()
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ProviderError(f"{nbytes} bytes at offset {offset} do not fit allocation {self.alloc_id}")
        return self.whole[offset:offset + nbytes].view(dtype).view(tuple(shape))


class ProviderClient:
    """A tenant process's session with its host's provider service (see module docstring)."""

    def __init__(self, endpoint: str, credential: TenantCredential | None, *, timeout_s: float = 120.0) -> None:
        self.credential = credential
        self.timeout_s = timeout_s
        self._context = zmq.Context()
        self._ids = itertools.count(1)
        self._socket = self._connect(endpoint)
        hello = self._ask(self._socket, {"op": "hello", "pid": os.getpid()}, timeout_s)
        self._socket.close(linger=0)
        self.endpoint: str = hello["endpoint"]
        self.host: int = hello["host"]
        self.hosts: int = hello["hosts"]
        self.tenant: str = hello["tenant"]
        self._socket = self._connect(self.endpoint)
        self.allocations: dict[int, Allocation] = {}
        self._staging: dict[int, Allocation] = {}

    def _connect(self, endpoint: str) -> zmq.Socket:
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if self.credential is not None:
            self.credential.make_client(socket)
        socket.connect(endpoint)
        return socket

    def _ask(self, socket: zmq.Socket, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        request_id = next(self._ids)
        socket.send(encode({**message, "id": request_id}))
        while True:
            if not socket.poll(timeout_s * 1e3):
                raise ProviderError(f"the provider service did not answer {message.get('op')!r} within {timeout_s:g} s")
            reply = decode_reply(socket.recv())
            if reply.get("id") == request_id:
                break  # (a reply to an earlier, timed-out request is skipped)
        if reply.get("op") == "error":
            raise ERRORS.get(reply.get("error"), ProviderError)(str(reply.get("message")))
        return reply

    def request(self, message: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """One raw request on the session (``message`` without ``v``/``id``); the reply, or the error raised."""
        try:
            return self._ask(self._socket, message, self.timeout_s if timeout_s is None else timeout_s)
        except ProviderError as error:
            if "did not answer" in str(error):  # drop the late reply with the socket
                self._socket.close(linger=0)
                self._socket = self._connect(self.endpoint)
            raise

    def send_raw(self, frame: bytes, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """Send one arbitrary frame on the session; the decoded reply, or None if none came (tests)."""
        self._socket.send(frame)
        if not self._socket.poll(timeout_s * 1e3):
            return None
        return decode_reply(self._socket.recv())

    # ---- memory -------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Allocation:
        """A new shared-memory buffer of ``nbytes`` from the service, mapped here (then nameless)."""
        reply = self.request({"op": "alloc", "nbytes": nbytes})
        buffer = map_segment(reply["path"], reply["nbytes"])
        self.request({"op": "attached", "alloc": reply["alloc"]})
        allocation = Allocation(reply["alloc"], reply["nbytes"], buffer, torch.frombuffer(buffer, dtype=torch.uint8))
        self.allocations[allocation.alloc_id] = allocation
        return allocation

    def free(self, allocation: Allocation) -> None:
        self.request({"op": "free", "alloc": allocation.alloc_id})
        self.allocations.pop(allocation.alloc_id, None)

    def empty(self, shape: Sequence[int] | int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor in its own shared-memory allocation (collectives on it copy nothing)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = max(1, math.prod(shape) * torch.empty(0, dtype=dtype).element_size())
        return self.alloc(nbytes).tensor(shape, dtype)

    def ref(self, tensor: torch.Tensor) -> list[int] | None:
        """The (allocation id, offset, length) of a contiguous tensor in one of this client's allocations."""
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            return None
        start, length = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        for allocation in self.allocations.values():
            if allocation.base <= start and start + length <= allocation.base + allocation.nbytes:
                return [allocation.alloc_id, start - allocation.base, length]
        return None

    def staging(self, nbytes: int, slot: int) -> Allocation:
        allocation = self._staging.get(slot)
        if allocation is None or allocation.nbytes < nbytes:
            if allocation is not None:
                self.free(allocation)
            allocation = self._staging[slot] = self.alloc(max(nbytes, 1))
        return allocation

    # ---- jobs ---------------------------------------------------------------------------------
    def join(self, job: str, hosts: Sequence[int]) -> ProviderCommunicator:
        """This process's rank of ``job`` (the rank of its host in ``hosts``); every host's process must join."""
        reply = self.request({"op": "join", "job": job, "hosts": list(hosts)})
        return ProviderCommunicator(self, reply["comm"], reply["rank"], reply["size"])

    @staticmethod
    def ask_status(endpoint: str, credential: TenantCredential | None, timeout_s: float = 10.0) -> dict[str, Any]:
        context = zmq.Context()
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if credential is not None:
            credential.make_client(socket)
        socket.connect(endpoint)
        try:
            socket.send(encode({"op": "status", "id": 1}))
            if not socket.poll(timeout_s * 1e3):
                raise ProviderError(f"the provider service at {endpoint} did not answer within {timeout_s:g} s")
            return decode_reply(socket.recv())
        finally:
            socket.close(linger=0)
            context.term()

    def close(self) -> None:
        """End the session (the service frees this process's allocations and leaves its jobs)."""
        with contextlib.suppress(ProviderError):
            self.request({"op": "bye"}, timeout_s=5.0)
        self._socket.close(linger=0)
        self._context.term()


class ProviderCommunicator:
    """mccl's collective API (``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_reduce``,
    ``all_to_all_single``) for one job, run by the service."""

    def __init__(self, client: ProviderClient, comm: int, rank: int, size: int) -> None:
        self.client, self.comm, self.rank, self.size = client, comm, rank, size

    def _call(self, kind: str, tensors: Sequence[torch.Tensor], reduce: str = "sum",
              outputs: int = 1) -> None:
        dtype = _DTYPE_NAMES.get(tensors[0].dtype)
        if dtype is None or any(tensor.dtype != tensors[0].dtype for tensor in tensors):
            raise ProviderError(f"{kind}: one dtype of {', '.join(_DTYPE_NAMES.values())} for every tensor")
        refs, copies = [], []
        for slot, tensor in enumerate(tensors):
            ref = self.client.ref(tensor)
            if ref is None:  # not in shared memory: stage it
                nbytes = tensor.numel() * tensor.element_size()
                staged = self.client.staging(nbytes, slot).tensor(tuple(tensor.shape), tensor.dtype)
                staged.copy_(tensor)
                copies.append((slot, tensor, staged))
                ref = self.client.ref(staged)
            refs.append(ref)
        self.client.request({"op": "collective", "comm": self.comm, "kind": kind, "dtype": dtype,
                             "reduce": _REDUCE_NAMES.get(reduce, reduce), "refs": refs})
        for slot, tensor, staged in copies:
            if slot < outputs:
                tensor.copy_(staged)

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._call("all_gather", [output, input])

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum") -> None:
        self._call("reduce_scatter", [output, input], _reduce_name(op))

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self._call("all_reduce", [tensor], _reduce_name(op))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._call("all_to_all", [output, input])


def _reduce_name(op: object) -> str:
    """A reduction by name (``"sum"``) or as ``torch.distributed.ReduceOp.SUM``."""
    if isinstance(op, str):
        return op.lower()
    name = str(getattr(op, "name", op)).rsplit(".", 1)[-1].lower()
    return _REDUCE_NAMES.get(name, name)
