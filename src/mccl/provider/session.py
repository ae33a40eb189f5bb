"""One tenant process's session: a service thread with its own socket, allocations and jobs.

The thread that reads a request is the thread that runs it, collectives included, so a collective
costs one round trip and no hand-off. Once the tenant opens the session's fast path
(:mod:`.fastpath`), a second thread of the session waits on its pipe and runs the collectives sent
there: a pipe round trip instead of a ZeroMQ one; the two threads take the session's :attr:`Session.lock`
per request, so the session's requests still run one at a time. Both paths check a collective the same
way (:mod:`.checks`). Sessions never share a thread, so a session blocked in a
collective (its job's peer host is slow, or gone until the job's timeout) delays nobody else; and
nothing a session receives can raise out of its loop: every failure becomes an ``error`` reply
and a count.

The session's socket accepts only its own tenant's key (a ZAP domain of its own), and its end
follows the connection: when the tenant process's connection drops (exit, crash, SIGKILL) the
session ends — its jobs are closed (their groups destroyed, so the job's ranks on other hosts stop
waiting) and its allocations are freed. A collective the tenant was inside when it died still
completes on this side (the service holds the mapping), so the job's other ranks finish it too.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import zmq
from zmq.utils.monitor import recv_monitor_message

from mccl.provider.checks import CollectiveChecks
from mccl.provider.errors import BadReference, BadRequest, ProviderError, QuotaExceeded
from mccl.provider.fastpath import FastPath
from mccl.provider.jobs import Job, JobSpec
from mccl.provider.memory import Registry, Segment
from mccl.provider.pollwait import compile_in_background
from mccl.provider.protocol import MAX_MESSAGE_BYTES, decode, encode, error_reply, hosts_field, name_field

__all__ = ["Session", "SessionHost"]

log = logging.getLogger("mccl.provider")

_POLL_MS = 100
_CONNECT_S = 30.0  # a session whose tenant does not connect within this is ended


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
    keep_warm: Any  # a KeepWarm, or None


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
        self.direct = True  # whether this session's world-1 jobs run their collectives directly (.direct)
        self.checks = CollectiveChecks(tenant, service.registry, self.jobs, service.count)
        self.lock = threading.Lock()  # held while a request runs, on the socket thread or the fast path's
        self.fast: FastPath | None = None
        self._user_id = service.user_id(tenant)  # (derived from the secret: ~0.2 ms, so once)
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
            "channel_attached": self._channel_attached, "warm": self._warm, "direct": self._direct,
            "poll": self._poll}
        self._ending = False
        self._lost = False  # ended by its connection's loss, not a bye: counted once its memory is freed
        self._pending: set[int] = set()  # accepted connections not yet authenticated (file descriptors)
        self._tenant_fds: set[int] | None = None  # the tenant's connection, once authenticated
        self._created = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=f"mccl-session-{session_id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # ---- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        try:
            while not self._ending and not self.service.stopping:
                ready = dict(poller.poll(_POLL_MS))
                if self.monitor in ready:
                    self._connection_events()
                if self.socket in ready:
                    self._drain()
                if self._tenant_fds is None and time.monotonic() - self._created > _CONNECT_S:
                    self._lost = self._ending = True  # said hello, never connected to its session
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
                        self._lost = self._ending = True

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
            with self.lock:
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

    # ---- the fast path (mccl.provider.fastpath) -----------------------------------------------
    def _open_channel(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.fast is not None and not self.fast.closed:
            raise BadRequest("this session has its fast-path channel already")
        self.fast = FastPath(self.session_id, self.checks, self.lock, self._refusal, self.service.count,
                             self.service.keep_warm, poll_ns=self.service.config.poll_us * 1000)
        if "warm" in message:
            self._warm({"on": message["warm"]})
        return {"op": "channel", **self.fast.paths()}

    def _channel_attached(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.fast is None:
            raise BadRequest("this session has no fast-path channel to attach")
        self.fast.attached()
        return {"op": "ok"}

    def _warm(self, message: dict[str, Any]) -> dict[str, Any]:
        """Whether this session's fast-path requests keep the service's CPUs warm (:mod:`.keepwarm`; default yes)."""
        on = message.get("on")
        if type(on) is not bool:
            raise BadRequest(f"warm: 'on' must be true or false, not {str(on)[:20]}")
        if self.fast is None:
            raise BadRequest("this session has no fast-path channel to keep warm")
        self.fast.keeps_warm = on
        return {"op": "ok"}

    def _poll(self, message: dict[str, Any]) -> dict[str, Any]:
        """Whether this session's fast-path thread polls for the next request for the service's ``poll_us`` before
        it sleeps (:meth:`.fastpath.FastPath._next`; default yes) or sleeps at once: the benchmarks' same-run A/B."""
        on = message.get("on")
        if type(on) is not bool:
            raise BadRequest(f"poll: 'on' must be true or false, not {str(on)[:20]}")
        if self.fast is None:
            raise BadRequest("this session has no fast-path channel to poll")
        self.fast.poll_ns = self.service.config.poll_us * 1000 if on else 0
        if on:
            compile_in_background()
        return {"op": "ok"}

    def _direct(self, message: dict[str, Any]) -> dict[str, Any]:
        """Whether this session's world-1 jobs run their collectives directly (:mod:`.direct`; default yes) or all
        on gloo, as before it: the benchmarks' same-run A/B of the two paths."""
        on = message.get("on")
        if type(on) is not bool:
            raise BadRequest(f"direct: 'on' must be true or false, not {str(on)[:20]}")
        self.direct = on
        for job in self.jobs.values():
            job.direct = on and job.can_direct
        return {"op": "ok"}

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
        self.checks.forget(segment.alloc_id)
        if self.fast is not None:
            self.fast.forget()
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
        job.direct = self.direct and job.can_direct
        comm = self._next_comm
        self._next_comm += 1
        self.jobs[comm] = job
        return {"op": "joined", "comm": comm, "rank": job.rank, "size": job.size}

    def _collective(self, message: dict[str, Any]) -> dict[str, Any]:
        """One collective request of the JSON protocol."""
        self.checks.execute(self.checks.prepare(message))
        return {"op": "ok"}

    def _bye(self, message: dict[str, Any]) -> dict[str, Any]:
        self._ending = True
        return {"op": "ok"}

    # ---- the end -------------------------------------------------------------------------------
    def _end(self) -> None:
        if self.fast is not None:
            self.fast.stop()  # (its collective in flight completes first)
            self.fast.forget()  # its checked requests hold the jobs (Job.close releases their groups anyway)
        for job in self.jobs.values():
            try:
                job.close()
            except Exception:
                log.exception("mccl provider: closing job %s failed", job.spec.key)
            self.service.release_job(job.spec)
        self.jobs.clear()
        self.checks.forget()
        self.service.registry.release_all(self.allocations)
        self.allocations.clear()
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)
        if self._lost:  # (after the cleanup: a status that counts the loss shows its memory freed)
            self.service.count("sessions_lost")
        self.service.session_ended(self)

