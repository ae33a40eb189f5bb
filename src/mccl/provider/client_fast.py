"""The tenant's side of a session's fast path (:mod:`.channel`): the pipe pair, the cached requests, the reply wait.

Split from :mod:`.client` (one concern: the per-call path of a training loop, measured stage by stage in
``benchmarks/provider_ranks.py``); :class:`FastPathClient` is a mixin of :class:`~.client.ProviderClient`, which
owns the session socket, the attributes below and the lock every fast-path call is made under.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from mccl.provider import channel
from mccl.provider.errors import ERRORS, ProviderError
from mccl.provider.replyspin import IdleGate, ReplyWait

__all__ = ["FastPathClient", "FastRequest", "FastTrace", "Joined"]


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


class FastPathClient:
    """The fast path of :class:`~.client.ProviderClient` (module docstring); the client sets these up."""

    timeout_s: float
    warm: bool
    adaptive: bool
    spin_ns: int
    trace: list[FastTrace] | None
    trace_cpu: bool
    followed: int
    _channel: tuple[int, int] | None
    _reader: channel.FrameReader | None
    _poll: Any
    _spin: ReplyWait | None
    _gate: IdleGate
    _requests: dict[tuple, FastRequest]
    _ids: Any
    _cpu: Callable[[], int] | None
    request: Callable[..., dict[str, Any]]  # the session socket's request (ProviderClient.request)

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
