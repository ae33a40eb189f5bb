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
import ctypes
import itertools
import mmap
import select
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from mccl.provider import channel
from mccl.provider.client_fast import FastPathClient, FastRequest, FastTrace, Joined
from mccl.provider.errors import ERRORS, ProviderError
from mccl.provider.keys import TenantCredential
from mccl.provider.memory import map_segment
from mccl.provider.protocol import decode_reply, encode
from mccl.provider.replyspin import IdleGate, ReplyWait

__all__ = ["Allocation", "FastRequest", "FastTrace", "Joined", "ProviderClient", "ask_status", "SPIN_US", "FOLLOW", "WARM"]

SPIN_US = 1000.0
"""How far past its expected reply a spinning fast-path call polls (yielding the CPU between polls) before it sleeps
in ``poll``; 0: every call sleeps at once. Whether a call spins at all is measured per request (:mod:`.replyspin`:
spinning or sleeping, whichever its recent calls found cheaper), and only while no task waits for a core.
``benchmarks/provider.py --single-host`` measures it against a fixed spin and against 0 in the same run."""


FOLLOW = False
"""Whether a fast-path request carries the CPU of the calling thread, so that the service's thread runs the call
there (:mod:`.fastpath` says why it was tried: the request's and the reply's wake-ups on one CPU) — only while no
task waits for a core. Off: in the coordinator's same-run measurements (sixth session, re-runs) following cost
36–80 µs a call on the idle box (spin and follow 94–129 µs added against spin alone 16–58, every size up to 8 MiB
AllReduce and 512 KiB AllGather) and gained nothing at load ~2.6 (26–76 against 21–87): the service's thread is
moved (``sched_setaffinity``, a migration) each time the tenant's thread changes CPU, which a tenant whose thread
sleeps between calls does often. ``benchmarks/provider.py --single-host`` measures it against False in the same run."""


WARM = False
"""Whether this client's collectives keep the service's CPUs out of deep idle while it calls (:mod:`.keepwarm`).
Off: in same-run A/Bs (``benchmarks/provider_bar.py``, blocks alternately on and off; eighth session, nine runs of
8 blocks a side at load 3–20) on beat off in 28 of the 72 (size, run) medians and off beat on in 43 (one tie) — at
the 8 MiB AllGather on won 5 of 9, with block IQRs of ± ms — while its process took 23–229 µs of CPU per call; the
seventh session's quiet re-runs split too (on ahead at 7 of 8 sizes, then at 3 of 8). No shown gain, a sure cost.
``benchmarks/provider_bar.py --ab warm`` (and ``provider.py --single-host --warm-ab``) measure it against False."""


def _cpu_reader():
    """``sched_getcpu`` of the C library (≈1 µs through ctypes), or None where there is none."""
    try:
        function = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    function.restype, function.argtypes = ctypes.c_int, []
    return function


@dataclass(eq=False)
class Allocation:
    """One service-allocated shared-memory buffer, mapped here; ``alloc_id`` names it to the service."""

    alloc_id: int
    nbytes: int
    buffer: mmap.mmap = field(repr=False)
    path: str = ""  # where it was opened (the service's descriptor, closed once this process mapped it)


class ProviderClient(FastPathClient):
    """See module docstring. ``credential``: the tenant's (:func:`~.keys.tenant_credential`), None for an
    unauthenticated in-process service."""

    def __init__(self, endpoint: str, credential: TenantCredential | None, *, timeout_s: float = 300.0,
                 fast: bool = True, spin_us: float = SPIN_US, follow: bool = FOLLOW, adaptive: bool = True,
                 warm: bool = WARM) -> None:
        self.credential = credential
        self.timeout_s = timeout_s
        self.spin_ns = int(spin_us * 1e3)  # how far past its expected reply a spinning call polls (.replyspin)
        self.adaptive = adaptive  # (False: spin every call the gate allows, the benchmark's fixed rule)
        self.warm = warm
        self._spin: ReplyWait | None = None
        self._cpu = _cpu_reader() if follow else None  # the calling thread's CPU, sent with each request
        self._gate = IdleGate()  # whether a core is free (the spin and the following ask it)
        self.followed = 0  # fast-path calls that asked the service's thread to follow (for the benchmark and tests)
        self._lock = threading.Lock()  # one request at a time, from any thread (a DDP hook runs on autograd's)
        self._channel: tuple[int, int] | None = None  # the fast path (mccl.provider.channel): request, reply fds
        self._reader: channel.FrameReader | None = None
        self._poll: select.poll | None = None
        self._requests: dict[tuple, FastRequest] = {}  # encoded untraced fast-path requests, by what they ask
        self.trace: list[tuple[int, ...]] | None = None  # a list: each collective appends a FastTrace (socket: 2 stamps)
        self.trace_cpu = False  # traced fast-path calls carry CPU stamps too (~2 µs each: a system call)
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
        if fast:
            self.open_channel()

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
            with self._lock:
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
        """Run ``kind`` on buffer references ``[allocation id, byte offset, byte length]`` (see :mod:`.protocol`),
        on the fast path when it is open (and the request fits its frame), else on the session socket."""
        fits = (kind in channel.KIND_CODES and dtype in channel.DTYPE_CODES and reduce in channel.REDUCE_CODES
                and len(refs) <= channel.MAX_REFS
                and all(len(ref) == 3 and all(type(v) is int and 0 <= v < 2**64 for v in ref) for ref in refs))
        self._collective(joined, kind, dtype, refs, reduce, fits)

    def _collective(self, joined: Joined, kind: str, dtype: str, refs: Sequence[Sequence[int]], reduce: str,
                    fits: bool) -> None:
        """:meth:`collective`, told whether the request fits a fast-path frame (the shim knows it does)."""
        if fits and self._channel is not None:
            with self._lock:
                self._ask_fast(joined, kind, dtype, refs, reduce)
            return
        sent = time.perf_counter_ns()
        self.request({"op": "collective", "comm": joined.comm, "kind": kind, "dtype": dtype, "reduce": reduce,
                      "refs": [list(ref) for ref in refs]})
        if self.trace is not None:
            self.trace.append((sent, time.perf_counter_ns()))

    def close(self) -> None:
        """End the session (the service frees this process's allocations and leaves its jobs)."""
        with contextlib.suppress(ProviderError):  # the service is gone already: nothing left to end
            self.request({"op": "bye"}, timeout_s=5.0)
        self._close_channel()
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
