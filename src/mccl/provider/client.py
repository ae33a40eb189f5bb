"""A tenant process's session with its host's provider service: the raw protocol, without torch.

:class:`ProviderClient` speaks :mod:`.protocol`: ``hello`` at the service's main endpoint, then
every request on the session's own endpoint. A reply ``error`` is raised as its :mod:`.errors`
class, so ``except BadReference`` works across the socket. Every wait is bounded by
``timeout_s``; a late reply is recognized by its id and skipped. The session lives as long as this
client's one connection to it: the service ends it (frees the memory, leaves the jobs) when the
connection drops, and authenticates no second one. The torch API (:mod:`.shim`) is built on it; a tenant without torch (or a
test's hostile tenant, which sends garbage through :meth:`ProviderClient.send_raw`) uses it directly.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from mccl.provider.errors import ERRORS, ProviderError
from mccl.provider.keys import TenantCredential
from mccl.provider.memory import map_segment
from mccl.provider.protocol import decode_reply, encode

__all__ = ["Allocation", "Joined", "ProviderClient", "ask_status"]


@dataclass(eq=False)
class Allocation:
    """One service-allocated shared-memory buffer, mapped here; ``alloc_id`` names it to the service."""

    alloc_id: int
    nbytes: int
    buffer: mmap.mmap = field(repr=False)
    path: str = ""  # where it was opened (the service's descriptor, closed once this process mapped it)


@dataclass(frozen=True)
class Joined:
    """This process's rank of a job: ``comm`` names the job's communicator in requests."""

    comm: int
    rank: int
    size: int


class ProviderClient:
    """See module docstring. ``credential``: the tenant's (:func:`~.keys.tenant_credential`), None for an
    unauthenticated in-process service."""

    def __init__(self, endpoint: str, credential: TenantCredential | None, *, timeout_s: float = 300.0) -> None:
        self.credential = credential
        self.timeout_s = timeout_s
        self._context = zmq.Context()
        self._ids = itertools.count(1)
        main = self._connect(endpoint)
        try:
            hello = self._ask(main, {"op": "hello"}, timeout_s)
        except TimeoutError as error:  # a wrong key looks like this too: libzmq drops the handshake silently
            self._context.destroy(linger=0)
            raise ProviderError(f"{error} (is this tenant's credential one the service accepts?)") from None
        except ProviderError:  # refused (e.g. too many sessions)
            self._context.destroy(linger=0)
            raise
        finally:
            main.close(linger=0)
        self.endpoint: str = hello["endpoint"]
        self.host: int = hello["host"]
        self.hosts: int = hello["hosts"]
        self.tenant: str = hello["tenant"]
        self._socket = self._connect(self.endpoint)
        self.allocations: dict[int, Allocation] = {}

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
                raise TimeoutError(f"the provider service did not answer {message.get('op')!r} within {timeout_s:g} s")
            reply = decode_reply(socket.recv())
            if reply.get("id") == request_id:
                break  # (a reply to an earlier, timed-out request is skipped)
        if reply.get("op") == "error":
            raise ERRORS.get(reply.get("error"), ProviderError)(str(reply.get("message")))
        return reply

    def request(self, message: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """One request on the session (``message`` without ``v``/``id``); the reply, or the error raised."""
        try:
            return self._ask(self._socket, message, self.timeout_s if timeout_s is None else timeout_s)
        except TimeoutError as error:  # the connection stays (the session lives as long as it does)
            raise ProviderError(str(error)) from None

    def send_raw(self, frame: bytes, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """Send one arbitrary frame on the session; the decoded reply, or None when none came in time."""
        self._socket.send(frame)
        if not self._socket.poll(timeout_s * 1e3):
            return None
        return decode_reply(self._socket.recv())

    # ---- memory and jobs ------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Allocation:
        """A new shared-memory buffer of ``nbytes`` from the service, mapped here (then nameless)."""
        reply = self.request({"op": "alloc", "nbytes": nbytes})
        buffer = map_segment(reply["path"], reply["nbytes"])
        self.request({"op": "attached", "alloc": reply["alloc"]})
        allocation = Allocation(reply["alloc"], reply["nbytes"], buffer, reply["path"])
        self.allocations[allocation.alloc_id] = allocation
        return allocation

    def free(self, allocation: Allocation) -> None:
        self.request({"op": "free", "alloc": allocation.alloc_id})
        self.allocations.pop(allocation.alloc_id, None)

    def join(self, job: str, hosts: Sequence[int]) -> Joined:
        """This process's rank of ``job`` (its host's place in ``hosts``); every host's process must join."""
        reply = self.request({"op": "join", "job": job, "hosts": list(hosts)})
        return Joined(reply["comm"], reply["rank"], reply["size"])

    def collective(self, joined: Joined, kind: str, dtype: str, refs: Sequence[Sequence[int]],
                   reduce: str = "sum") -> None:
        """Run ``kind`` on buffer references ``[allocation id, byte offset, byte length]`` (see :mod:`.protocol`)."""
        self.request({"op": "collective", "comm": joined.comm, "kind": kind, "dtype": dtype, "reduce": reduce,
                      "refs": [list(ref) for ref in refs]})

    def close(self) -> None:
        """End the session (the service frees this process's allocations and leaves its jobs)."""
        with contextlib.suppress(ProviderError):  # the service is gone already: nothing left to end
            self.request({"op": "bye"}, timeout_s=5.0)
        self._socket.close(linger=0)
        self._context.term()


def ask_status(endpoint: str, credential: TenantCredential | None, timeout_s: float = 10.0) -> dict[str, Any]:
    """The counters of the service at ``endpoint`` (any tenant of it may ask)."""
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
