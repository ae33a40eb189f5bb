"""One tenant process's session: a service thread with its own socket, allocations and jobs.

The thread that reads a request is the thread that runs it, collectives included, so a collective
costs one round trip and no hand-off. Once the tenant opens the session's fast path
(:mod:`.channel`), the same thread also waits on its pipe: a collective then costs a pipe round trip
(~8 µs) instead of a ZeroMQ one (~70 µs), and a reference checked once is taken from a cache while
its allocation lives (:meth:`Session._buffer`). Sessions never share a thread, so a session blocked in a
collective (its job's peer host is slow, or gone until the job's timeout) delays nobody else; and
nothing a session receives can raise out of its loop: every failure becomes an ``error`` reply
and a count.

The session's socket accepts only its own tenant's key (a ZAP domain of its own), and its end
follows the connection: when the tenant process's connection drops (exit, crash, SIGKILL) the
session ends — its jobs are closed (their groups aborted, so the job's ranks on other hosts stop
waiting) and its allocations are freed. A collective the tenant was inside when it died still
completes on this side (the service holds the mapping), so the job's other ranks finish it too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
import zmq
from zmq.utils.monitor import recv_monitor_message

from mccl.provider import channel
from mccl.provider.errors import BadReference, BadRequest, JobFailed, ProviderError, QuotaExceeded
from mccl.provider.jobs import TORCH_DTYPES, Job, JobSpec
from mccl.provider.memory import Registry, Segment
from mccl.provider.protocol import (
    DTYPES,
    KINDS,
    MAX_MESSAGE_BYTES,
    REDUCTIONS,
    decode,
    encode,
    error_reply,
    hosts_field,
    name_field,
)

__all__ = ["Session", "SessionHost"]

log = logging.getLogger("mccl.provider")

_POLL_MS = 100
_CONNECT_S = 30.0  # a session whose tenant does not connect within this is ended
_VIEW_CACHE = 64  # checked references kept per session, by (allocation, offset, length, dtype): see _buffer


class SessionHost(Protocol):
    """What a session uses of its service (:class:`~mccl.provider.service.ProviderService`)."""

    context: zmq.Context
    secret: Any
    run_dir: str
    registry: Registry
    config: Any
    host: int
    hosts: int
    store: Any
    stopping: bool

    def job_store(self) -> Any: ...

    def count(self, name: str, amount: int = 1) -> None: ...

    def user_id(self, tenant: str) -> str: ...

    def claim_job(self, spec: JobSpec, session_id: int) -> contextlib.AbstractContextManager[None]: ...

    def release_job(self, spec: JobSpec) -> None: ...

    def seal_session(self, session_id: int) -> None: ...

    def session_ended(self, session: Session) -> None: ...


class Session:
    """See module docstring. Created by the service on ``hello``; runs on its own thread."""

    def __init__(self, service: SessionHost, session_id: int, tenant: str) -> None:
        self.service = service
        self.session_id = session_id
        self.tenant = tenant
        self.allocations: set[int] = set()
        self.jobs: dict[int, Job] = {}
        self._next_comm = 1
        self._views: dict[tuple[int, int, int, str], tuple[Segment, torch.Tensor]] = {}
        self._prepared: dict[bytes, tuple] = {}  # fast-path requests (less their ids) already checked: _prepare
        self._user_id = service.user_id(tenant)  # (derived from the secret: ~0.2 ms, so once)
        self._channel: tuple[int, int] | None = None  # the fast path's (request read end, reply write end)
        self._channel_reader: channel.FrameReader | None = None
        self._offered: list[int] = []  # the tenant's ends of the pair, until it has opened them
        self.socket = service.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if service.secret is not None:
            self.socket.zap_domain = f"session-{session_id}".encode()
            service.secret.make_server(self.socket)
        self.monitor = self.socket.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.socket.bind(f"ipc://{service.run_dir}/session-{session_id}.sock")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "alloc": self._alloc, "attached": self._attached, "free": self._free, "join": self._join,
            "collective": self._collective, "bye": self._bye, "channel": self._open_channel,
            "channel_attached": self._channel_attached}
        self._ending = False
        self._pending: set[int] = set()  # accepted connections not yet authenticated (file descriptors)
        self._tenant_fds: set[int] | None = None  # the tenant's connection, once authenticated
        self._created = time.monotonic()
        self._woke = 0
        self.thread = threading.Thread(target=self._run, name=f"mccl-session-{session_id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # ---- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        self._poller = poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        try:
            while not self._ending and not self.service.stopping:
                ready = dict(poller.poll(_POLL_MS))
                self._woke = time.perf_counter_ns()  # (the first stage stamp of a traced fast-path call)
                if self._channel is not None and self._channel[0] in ready:
                    self._drain_channel()
                if self.monitor in ready:
                    self._connection_events()
                if self.socket in ready:
                    self._drain()
                if self._tenant_fds is None and time.monotonic() - self._created > _CONNECT_S:
                    self.service.count("sessions_lost")  # said hello, never connected to its session
                    self._ending = True
        except Exception:  # a bug here must end this session only, never the service
            log.exception("mccl provider: session %d of tenant %r failed", self.session_id, self.tenant)
        finally:
            self._end()

    def _connection_events(self) -> None:
        """Follow the tenant's connection by its file descriptor (see :meth:`_run`)."""
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, fd = event["event"], event["value"]
            if kind == zmq.EVENT_ACCEPTED:
                self._pending.add(fd)
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED and self._tenant_fds is None:
                # the first authenticated connection is the tenant's; the domain takes no other from now on.
                # (Were another connection accepted in the same instant, both count: a stranger can only
                # delay the end of a session, never cause it.)
                self._tenant_fds, self._pending = set(self._pending), set()
                self.service.seal_session(self.session_id)
            elif kind == zmq.EVENT_DISCONNECTED:
                self._pending.discard(fd)
                if self._tenant_fds is not None and fd in self._tenant_fds:
                    self._tenant_fds.discard(fd)
                    if not self._tenant_fds:  # the tenant process is gone (exit, crash, SIGKILL)
                        self.service.count("sessions_lost")
                        self._ending = True

    def _drain(self) -> None:
        while not self._ending:
            try:
                parts = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(parts) != 2:
                self.service.count("malformed")
                continue
            identity, frame = parts
            if self.service.secret is not None and frame.get("User-Id") != self._user_id:
                self.service.count("malformed")  # cannot happen past this socket's ZAP domain; refused anyway
                continue
            self.socket.send_multipart([identity.bytes, encode(self.handle(frame.bytes))])

    def handle(self, frame: bytes) -> dict[str, Any]:
        """The reply to one request frame; never raises."""
        request_id = 0
        try:
            message = decode(frame)
            request_id = message["id"]
            handler = self._handlers.get(message["op"])
            if handler is None:
                raise BadRequest(f"unknown operation {message['op'][:40]!r} (a session takes "
                                 f"{', '.join(sorted(self._handlers))})")
            reply = handler(message)
        except Exception as error:
            return self._refusal(request_id, error)
        reply["id"] = request_id
        return reply

    def _refusal(self, request_id: int, error: Exception) -> dict[str, Any]:
        """The error reply to a failed request, counted (a bug is logged and reported, never raised)."""
        if isinstance(error, ProviderError):
            self.service.count("rejected_refs" if isinstance(error, BadReference) else
                               "malformed" if isinstance(error, BadRequest) else "refused")
            return error_reply(request_id, error)
        log.error("mccl provider: session %d: request failed", self.session_id, exc_info=error)
        return error_reply(request_id, ProviderError(f"internal error: {type(error).__name__}: {error}"))

    # ---- the fast path (mccl.provider.channel) -------------------------------------------------
    def _open_channel(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._channel is not None or self._offered:
            raise BadRequest("this session has its fast-path channel already")
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        os.set_blocking(request_read, False)
        os.set_blocking(reply_write, False)  # a tenant that stops reading fills the pipe: its channel closes
        self._channel = (request_read, reply_write)
        self._channel_reader = channel.FrameReader(request_read)
        self._offered = [request_write, reply_read]
        self._poller.register(request_read, zmq.POLLIN)
        pid = os.getpid()
        return {"op": "channel", "request": f"/proc/{pid}/fd/{request_write}", "reply": f"/proc/{pid}/fd/{reply_read}"}

    def _channel_attached(self, message: dict[str, Any]) -> dict[str, Any]:
        """The tenant has opened its ends: close the service's copies (only the tenant holds them now)."""
        for fd in self._offered:
            os.close(fd)
        self._offered = []
        return {"op": "ok"}

    def _close_channel(self) -> None:
        if self._channel is not None:
            with contextlib.suppress(KeyError):
                self._poller.unregister(self._channel[0])
            for fd in (*self._channel, *self._offered):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._channel, self._channel_reader, self._offered = None, None, []

    def _drain_channel(self) -> None:
        frames = self._channel_reader.read()
        if frames is None:  # the tenant closed it, or broke the framing: the channel ends, the session stays
            if self._channel_reader._buffer:
                self.service.count("malformed")
            self._close_channel()
            return
        for frame in frames:
            received = time.perf_counter_ns()
            request_id, stamps, error = 0, None, None
            try:
                prepared = self._prepared.get(frame[8:])  # the same request as before, but for its id?
                if prepared is not None and all(self.service.registry.live(s) for s in prepared[4]):
                    request_id = int.from_bytes(frame[:8], "little")
                    stamps = ([self._woke, received, time.perf_counter_ns()]
                              if frame[15] & channel.TRACE else None)
                else:
                    request_id, flags, message = channel.decode_request(frame)
                    stamps = [self._woke, received, time.perf_counter_ns()] if flags & channel.TRACE else None
                    prepared = self._prepare(message)
                    if len(self._prepared) >= _VIEW_CACHE:
                        self._prepared.pop(next(iter(self._prepared)))
                    self._prepared[frame[8:]] = prepared
                self._execute(prepared, stamps)
            except BadRequest as refused:
                request_id = refused.args[1] if len(refused.args) > 1 else request_id
                error = self._refusal(request_id, BadRequest(refused.args[0]))
            except Exception as failed:
                error = self._refusal(request_id, failed)
            if stamps is not None:
                stamps.append(time.perf_counter_ns())
            try:
                os.write(self._channel[1], channel.encode_reply(request_id, error, stamps or ()))
            except (BlockingIOError, BrokenPipeError):  # not reading its replies, or gone
                self.service.count("malformed")
                self._close_channel()
                return

    # ---- requests ----------------------------------------------------------------------------
    def _alloc(self, message: dict[str, Any]) -> dict[str, Any]:
        if len(self.allocations) >= self.service.config.max_allocations:
            raise QuotaExceeded(f"a session holds at most {self.service.config.max_allocations} allocations")
        segment = self.service.registry.allocate(self.tenant, message.get("nbytes"))
        self.allocations.add(segment.alloc_id)
        return {"op": "allocation", "alloc": segment.alloc_id, "path": str(segment.path), "nbytes": segment.nbytes}

    def _own(self, message: dict[str, Any]) -> Segment:
        segment = self.service.registry.owned(self.tenant, message.get("alloc"))
        if segment.alloc_id not in self.allocations:  # the tenant's, but another of its sessions' (own process only)
            raise BadReference(f"allocation {segment.alloc_id} belongs to another session of tenant {self.tenant!r}")
        return segment

    def _attached(self, message: dict[str, Any]) -> dict[str, Any]:
        self._own(message).unlink()
        return {"op": "ok"}

    def _free(self, message: dict[str, Any]) -> dict[str, Any]:
        segment = self._own(message)
        self._views = {key: view for key, view in self._views.items() if key[0] != segment.alloc_id}
        self._prepared.clear()
        self.allocations.discard(segment.alloc_id)
        self.service.registry.release(self.tenant, segment.alloc_id)
        return {"op": "ok"}

    def _join(self, message: dict[str, Any]) -> dict[str, Any]:
        if len(self.jobs) >= self.service.config.max_jobs:
            raise QuotaExceeded(f"a session joins at most {self.service.config.max_jobs} jobs")
        spec = JobSpec(self.tenant, name_field(message, "job"), hosts_field(message, self.service.hosts))
        with self.service.claim_job(spec, self.session_id):
            config = self.service.config
            job = Job(spec, self.service.host, self.service.job_store(), timeout_s=config.job_timeout_s,
                      join_timeout_s=config.join_timeout_s, strategy=config.strategy, hot_swap=config.hot_swap)
        comm = self._next_comm
        self._next_comm += 1
        self.jobs[comm] = job
        return {"op": "joined", "comm": comm, "rank": job.rank, "size": job.size}

    def _collective(self, message: dict[str, Any]) -> dict[str, Any]:
        """One collective request of the JSON protocol."""
        self._execute(self._prepare(message), None)
        return {"op": "ok"}

    def _prepare(self, message: dict[str, Any]) -> tuple[Job, str, list[torch.Tensor], str, list[Segment]]:
        """A collective request checked: (job, kind, tensors viewing the buffers, reduction, their segments).
        The fast path keeps it by the request's bytes (less the id): a repeated request is then run again
        once its segments are checked still live (nothing else it was checked against can change; the job's
        state is checked by :meth:`_execute` every time)."""
        job = self.jobs.get(message.get("comm")) if type(message.get("comm")) is int else None
        if job is None:
            raise BadRequest(f"no communicator {str(message.get('comm'))[:20]} in this session (join a job first)")
        kind, dtype, reduce = message.get("kind"), message.get("dtype"), message.get("reduce", "sum")
        if kind not in KINDS:
            raise BadRequest(f"unknown collective {str(kind)[:40]!r} (one of {', '.join(KINDS)})")
        if dtype not in DTYPES:
            raise BadRequest(f"unknown dtype {str(dtype)[:40]!r} (one of {', '.join(DTYPES)})")
        if reduce not in REDUCTIONS or (reduce == "avg" and not TORCH_DTYPES[dtype].is_floating_point):
            raise BadRequest(f"reduction {str(reduce)[:20]!r} is not one of {', '.join(REDUCTIONS)} "
                             "(avg: floating-point dtypes only)")
        refs = message.get("refs")
        names = KINDS[kind]
        if not isinstance(refs, list) or len(refs) != len(names):
            raise BadReference(f"{kind} takes {len(names)} buffer references ({', '.join(names)})")
        buffers = [self._buffer(ref, dtype, f"{kind} {name}") for ref, name in zip(refs, names, strict=True)]
        _check_shapes(kind, [length for length, _, _ in buffers], job.size, DTYPES[dtype])
        return job, kind, [view for _, view, _ in buffers], reduce, [segment for _, _, segment in buffers]

    def _execute(self, prepared: tuple[Job, str, list[torch.Tensor], str, list[Segment]],
                 stamps: list[int] | None) -> None:
        """Run a checked collective. ``stamps``: append the stage times (tracing)."""
        job, kind, tensors, reduce, _ = prepared
        if job.broken:
            raise JobFailed(f"job {job.spec.name!r} is broken ({job.communicator.broken}); join it again")
        if stamps is not None:
            stamps.append(time.perf_counter_ns())
        job.run(kind, tensors, reduce)
        if stamps is not None:
            stamps.append(time.perf_counter_ns())
        self.service.count("collectives")

    def _buffer(self, ref: object, dtype: str, what: str) -> tuple[int, torch.Tensor, Segment]:
        """(byte length, tensor view, its segment) of a reference. A reference checked before (same three integers, same
        dtype) is taken from the cache while its allocation is still live in the registry — the check's
        result depends on nothing else (the tenant of a session never changes, an allocation's size never
        does, ids are never reused) — so a training loop's repeated buffers are checked once."""
        if type(ref) is list and len(ref) == 3 and type(ref[0]) is int and type(ref[1]) is int \
                and type(ref[2]) is int:
            cached = self._views.get((ref[0], ref[1], ref[2], dtype))
            if cached is not None and self.service.registry.live(cached[0]):
                return ref[2], cached[1], cached[0]
        segment, checked = self.service.registry.resolve(self.tenant, ref, DTYPES[dtype], what)
        torch_dtype = TORCH_DTYPES[dtype]
        view = (torch.empty(0, dtype=torch_dtype) if checked.length == 0 else
                torch.frombuffer(segment.buffer, dtype=torch_dtype, count=checked.length // DTYPES[dtype],
                                 offset=checked.offset))
        if len(self._views) >= _VIEW_CACHE:
            self._views.pop(next(iter(self._views)))
        self._views[(checked.alloc_id, checked.offset, checked.length, dtype)] = (segment, view)
        return checked.length, view, segment

    def _bye(self, message: dict[str, Any]) -> dict[str, Any]:
        self._ending = True
        return {"op": "ok"}

    # ---- the end -------------------------------------------------------------------------------
    def _end(self) -> None:
        for job in self.jobs.values():
            try:
                job.close()
            except Exception:
                log.exception("mccl provider: closing job %s failed", job.spec.key)
            self.service.release_job(job.spec)
        self.jobs.clear()
        self._views.clear()
        self._prepared.clear()
        self._close_channel()
        self.service.registry.release_all(self.allocations)
        self.allocations.clear()
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)
        self.service.session_ended(self)


def _check_shapes(kind: str, lengths: list[int], size: int, itemsize: int) -> None:
    """The sizes of a collective's buffers against each other and the job's size, in bytes."""
    if kind == "all_gather" and lengths[0] != size * lengths[1]:
        raise BadReference(f"all_gather: the output is {lengths[0]} bytes; it must be {size} × the input's "
                           f"{lengths[1]}")
    if kind == "reduce_scatter" and lengths[1] != size * lengths[0]:
        raise BadReference(f"reduce_scatter: the input is {lengths[1]} bytes; it must be {size} × the output's "
                           f"{lengths[0]}")
    if kind == "all_to_all" and (lengths[0] != lengths[1] or (lengths[1] // itemsize) % size):
        raise BadReference(f"all_to_all: input and output must be the same size, a multiple of {size} elements "
                           f"(got {lengths[1]} and {lengths[0]} bytes)")
