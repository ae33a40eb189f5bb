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
import os
import select
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import zmq

from mccl.provider import channel
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


class FastTrace(NamedTuple):
    """One traced fast-path collective (:attr:`ProviderClient.trace`): wall stamps (``time.perf_counter_ns``,
    one clock for every process here) from the tenant's send through the service's stages to the tenant's
    receipt, then, when :attr:`ProviderClient.trace_cpu` is set (else 0), CPU stamps (``time.thread_time_ns``)
    of the tenant's calling thread and of the service's fast-path thread. Stages: ``benchmarks/provider_ranks.py``."""

    sent: int
    woke: int  # the service's thread has read the request
    received: int  # ... and holds the session's lock
    decoded: int
    checked: int
    ran: int  # the collective returned
    replied: int  # the reply is encoded
    got: int  # the tenant has the reply
    sent_cpu: int = 0
    received_cpu: int = 0
    decoded_cpu: int = 0
    checked_cpu: int = 0
    ran_cpu: int = 0
    replied_cpu: int = 0
    got_cpu: int = 0


class FastRequest(NamedTuple):
    """An untraced fast-path request, encoded once (:meth:`ProviderClient.fast_request`): ``key`` names it to the
    reply wait (:mod:`.replyspin`); a frame is ``length``, the id, then ``tail``."""

    key: tuple
    kind: str
    tail: bytes
    length: bytes


@dataclass(frozen=True)
class Joined:
    """This process's rank of a job: ``comm`` names the job's communicator in requests."""

    comm: int
    rank: int
    size: int


class ProviderClient:
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

    # ---- the fast path -------------------------------------------------------------------------
    def open_channel(self) -> None:
        """Open the session's pipe pair (:mod:`.channel`): collectives go there from now on."""
        reply = self.request({"op": "channel", "warm": self.warm})
        request_fd = os.open(reply["request"], os.O_WRONLY | os.O_CLOEXEC)
        reply_fd = os.open(reply["reply"], os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        self.request({"op": "channel_attached"})
        self._channel = (request_fd, reply_fd)
        self._reader = channel.FrameReader(reply_fd, max_frame=1 << 16)
        self._poll = select.poll()
        self._poll.register(reply_fd, select.POLLIN)
        self._spin = ReplyWait(self.spin_ns, reply_fd, gate=self._gate, adaptive=self.adaptive) if self.spin_ns else None

    def keep_warm(self, on: bool) -> None:
        """Whether this session's collectives keep the service's CPUs out of deep idle from now on (:mod:`.keepwarm`)."""
        self.request({"op": "warm", "on": on})
        self.warm = on

    @property
    def fast(self) -> bool:
        """Whether collectives take the fast path (False: the session socket)."""
        return self._channel is not None

    def _close_channel(self) -> None:
        if self._channel is not None:
            for fd in self._channel:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._channel, self._reader, self._poll, self._spin = None, None, None, None

    def fast_request(self, joined: Joined, kind: str, dtype: str, refs: Sequence[Sequence[int]],
                     reduce: str, flags: int = 0) -> FastRequest:
        """The encoded fast-path request for this call, less its length and id (cached: a training loop
        repeats the same few calls, and the frame is then one ``pack`` of the id away)."""
        key = (joined.comm, kind, dtype, reduce, flags, *map(tuple, refs))
        request = self._requests.get(key)
        if request is None:
            tail = channel.encode_request(0, joined.comm, kind, dtype, reduce, refs, flags)[channel.LENGTH.size + 8:]
            if len(self._requests) >= 256:
                self._requests.clear()
            request = self._requests[key] = FastRequest(key, kind, tail, channel.LENGTH.pack(8 + len(tail)))
        return request

    def _ask_fast(self, joined: Joined, kind: str, dtype: str, refs: Sequence[Sequence[int]], reduce: str) -> None:
        """One collective on the fast path (call with ``_lock`` held): the usual request is sent by :meth:`send_fast`;
        a traced or following one (its flags in its cache key, a following one's CPU written in) waits here."""
        sent = time.perf_counter_ns()
        # whether a core is free, read before the send (the caller is then the one runnable task of its own counted)
        follow = self._cpu is not None and self._gate.sample(sent)
        if self.trace is None and not follow:
            self.send_fast(self.fast_request(joined, kind, dtype, refs, reduce))
            return
        request_id = next(self._ids)
        sent_cpu = time.thread_time_ns() if self.trace is not None and self.trace_cpu else 0
        flags = (channel.TRACE | (channel.TRACE_CPU if self.trace_cpu else 0)) if self.trace is not None else 0
        if follow:
            flags |= channel.FOLLOW
            self.followed += 1
        request = self.fast_request(joined, kind, dtype, refs, reduce, flags)
        key, tail = request.key, request.tail
        if follow:  # (the tail's cpu field, between the codes and the references)
            at = channel.CPU_AT - 8
            tail = tail[:at] + channel.CPU.pack(self._cpu() + 1) + tail[at + channel.CPU.size:]
        frame = request.length + channel.ID.pack(request_id) + tail
        spin = self._spin.choose(key, sent) if self._spin is not None else None  # spin, sleep, or sleep unrecorded
        self._write(frame)
        if spin:
            self._spin.spin(key, sent)
        self._await_reply(request_id, kind, sent, key, spin, sent_cpu)

    def send_fast(self, request: FastRequest) -> None:
        """Send a cached request (:meth:`fast_request`) and wait for its reply (call with ``_lock`` held). The
        per-call path of a training loop: one ``pack``, ``write``, ``poll`` and ``read``, and the reply compared
        with the one success reply it may be."""
        request_id = next(self._ids)
        sent = time.perf_counter_ns()
        spin = self._spin.choose(request.key, sent) if self._spin is not None else None
        self._write(request.length + channel.ID.pack(request_id) + request.tail)
        if spin:
            self._spin.spin(request.key, sent)
        if not self._reader.pending:
            if not self._poll.poll(self.timeout_s * 1e3):
                raise ProviderError(f"the provider service did not answer {request.kind!r} within {self.timeout_s:g} s")
            try:
                chunk = os.read(self._channel[1], 1 << 16)
            except BlockingIOError:  # (a spurious wake-up: the general wait below)
                chunk = None
            if chunk == channel.encode_ok(request_id):
                if spin is not None:
                    self._spin.record(request.key, time.perf_counter_ns() - sent, spin)
                return
            if chunk is not None and self._took(self._reader.take(chunk), request_id, request.kind, sent,
                                                request.key, spin, 0):
                return
        self._await_reply(request_id, request.kind, sent, request.key, spin, 0)

    def _write(self, frame: bytes) -> None:
        try:
            os.write(self._channel[0], frame)
        except BrokenPipeError:  # the service closed the channel: the socket still serves
            self._close_channel()
            raise ProviderError("the provider service closed this session's fast path; "
                                "collectives use the session socket now") from None

    def _await_reply(self, request_id: int, kind: str, sent: int, key: tuple, spin: bool | None,
                     sent_cpu: int) -> None:
        """Wait (bounded by ``timeout_s`` from ``sent``) for the reply to ``request_id``; raise its error."""
        deadline = sent + int(self.timeout_s * 1e9)
        while True:
            left = deadline - time.perf_counter_ns()  # (perf_counter is CLOCK_MONOTONIC here)
            if left <= 0 or not self._poll.poll(left / 1e6):
                raise ProviderError(f"the provider service did not answer {kind!r} within {self.timeout_s:g} s")
            if self._took(self._reader.read(), request_id, kind, sent, key, spin, sent_cpu):
                return

    def _took(self, frames: list[bytes] | None, request_id: int, kind: str, sent: int, key: tuple,
              spin: bool | None, sent_cpu: int) -> bool:
        """Whether ``frames`` held the reply to ``request_id`` (raised when it is an error)."""
        if frames is None:
            self._close_channel()
            raise ProviderError("the provider service closed this session's fast path")
        for frame in frames:
            reply_id, error, stamps = channel.decode_reply(frame)
            if reply_id != request_id:
                continue  # (a reply to an earlier, timed-out request)
            if spin is not None:
                self._spin.record(key, time.perf_counter_ns() - sent, spin)
            if self.trace is not None and stamps:
                got = time.perf_counter_ns()
                cpu = (sent_cpu, *stamps[6:], time.thread_time_ns()) if len(stamps) > 6 else ()
                self.trace.append(FastTrace(sent, *stamps[:6], got, *cpu))
            if error is not None:
                raise ERRORS.get(error.get("error"), ProviderError)(str(error.get("message")))
            return True
        return False

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
