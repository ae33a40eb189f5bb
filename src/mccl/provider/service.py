"""The provider service (MCCS §3.1): one per host, it owns the communicators and runs tenants' collectives.

Processes. One service process per (emulated) host; service rank ``host`` of ``hosts``. The
services of a provider share a torch.distributed store (rank 0 hosts a TCPStore), through which
the services of each tenant job build that job's gloo group (:mod:`.jobs`). Tenant processes
talk only to their host's service, through the shim (:mod:`.shim`).

Threads. The main thread owns the main ROUTER socket (``hello``, ``status``); every ``hello``
starts a :class:`~.session.Session` on a thread of its own with its own socket, where the
tenant's allocations, joins and collectives go. One tenant's garbage, crash or stuck collective
therefore stops at its own session: no other session waits for it, and the main socket keeps
answering (:mod:`.session`).

Authentication (:mod:`.keys`): CURVE with :mod:`mccl.control.auth`; the service's key pair is the
provider secret's, each tenant's is derived from it and its name, and the service lets in only the
tenants it was told to serve (``tenants``, :meth:`ProviderService.add_tenant`). A connection with
another key never gets a message through; its failed handshakes are counted (``auth_failures``).
The name a request acts for is the one its connection authenticated as, never a message field.
Without a secret (``secret=None``) the service serves everybody as tenant ``"anonymous"``: for
in-process tests only, and only on ipc endpoints in its private run directory.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import zmq

from mccl.control.auth import CurveServer, JobSecret
from mccl.provider.errors import BadRequest, ProviderError, QuotaExceeded
from mccl.provider.jobs import JobSpec, StrategyFactory
from mccl.provider.keepwarm import KeepWarm
from mccl.provider.keys import tenant_credential
from mccl.provider.memory import Registry
from mccl.provider.protocol import MAX_MESSAGE_BYTES, decode, encode, error_reply
from mccl.provider.session import Session

__all__ = ["ServiceConfig", "ProviderService", "ANONYMOUS"]

log = logging.getLogger("mccl.provider")

ANONYMOUS = "anonymous"


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """Limits and policies of one service.

    ``max_sessions``: tenant processes served at once; ``max_sessions_per_tenant``: of one tenant (so no
    tenant can take every session). ``max_bytes`` / ``max_allocations``: shared
    memory one tenant may hold on this host (bytes, live allocations). ``max_jobs``: jobs one session
    may join. ``join_timeout_s``: how long a join waits for the job's tenant processes on the other
    hosts. ``job_timeout_s``: how long a job's collective waits for a peer host before the job is
    declared broken. ``strategy``: the per-job policy factory
    (:class:`~.jobs.JobStrategy`), None for none. ``hot_swap``: give each job's communicator a
    control channel, so a strategy can stage schedule versions (costs one store poll every 20 ms per job).
    ``keep_warm``: offer to keep the service's CPUs out of deep idle while a tenant that asks is active
    (:mod:`.keepwarm`; the ticking process waits, costing nothing, until a session asks — none does by default,
    ``client.WARM`` says why). ``poll_us``: how long a session's fast-path thread polls for the tenant's next
    request after each reply before it sleeps, while no task waits for a core (0: it sleeps at once;
    :meth:`.fastpath.FastPath._next`).
    """

    max_sessions: int = 256
    max_sessions_per_tenant: int = 32
    max_bytes: int = 8 << 30
    max_allocations: int = 1024
    max_jobs: int = 64
    join_timeout_s: float = 120.0
    job_timeout_s: float = 60.0
    strategy: StrategyFactory | None = None
    hot_swap: bool = False
    keep_warm: bool = True
    poll_us: int = 2000

    def __post_init__(self) -> None:
        if type(self.poll_us) is not int or not 0 <= self.poll_us <= 1_000_000:
            raise ValueError(f"poll_us must be an integer of 0 to 1000000 µs, not {self.poll_us!r}")


class _TenantKeys:
    """The ZAP credentials provider: a domain's allowed keys (z85) -> their tenant."""

    def __init__(self) -> None:
        self.by_domain: dict[str, dict[bytes, str]] = {"*": {}}

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.by_domain.get(domain, {})


class ProviderService:
    """See module docstring. ``store``: ``"host:port"`` of the provider's TCPStore (rank 0 creates it)
    or a ready ``dist.Store``; ``bind``: the main endpoint (default: ipc in a private run directory)."""

    def __init__(self, *, host: int = 0, hosts: int = 1, store: str | dist.Store, secret: JobSecret | None,
                 tenants: Iterable[str] = (), bind: str | None = None, config: ServiceConfig | None = None,
                 store_timeout_s: float = 60.0) -> None:
        if not 0 <= host < hosts:
            raise ProviderError(f"host rank {host} is not in 0..{hosts - 1}")
        self.host, self.hosts = host, hosts
        self.config = config or ServiceConfig()
        self.secret = secret
        self.registry = Registry(max_bytes=self.config.max_bytes, max_allocations=self.config.max_allocations)
        self.stats: dict[str, int] = dict.fromkeys(
            ("hellos", "sessions", "sessions_lost", "auth_failures", "malformed", "rejected_refs", "refused",
             "collectives"), 0)
        self._stats_lock = threading.Lock()
        self.stopping = False
        self.keep_warm = KeepWarm() if self.config.keep_warm else None  # (its threads start with serve_forever)
        self._sessions: dict[int, Session] = {}
        self._next_session = 1
        self._jobs: dict[str, int] = {}  # job key -> the session holding this host's rank of it
        self._lock = threading.Lock()
        self.store = store if isinstance(store, dist.Store) else _connect_store(store, host, hosts, store_timeout_s)
        self._store_address = None if isinstance(store, dist.Store) else store
        self._store_timeout_s = store_timeout_s
        self.run_dir = tempfile.mkdtemp(prefix="mccl-provider-")  # 0700: the ipc endpoints live here
        self.context = zmq.Context()
        self._keys = _TenantKeys()
        self._curve: CurveServer | None = None
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        try:
            if secret is not None:
                self._curve = CurveServer(self.context, self.socket, secret, self._keys, log_name="mccl.provider.zap")
            elif bind is not None:
                raise ProviderError("an unauthenticated service binds only its private ipc endpoint (bind=None)")
            self.socket.bind(bind or f"ipc://{self.run_dir}/service.sock")
        except (zmq.ZMQError, ProviderError) as error:
            self._close()
            raise ProviderError(f"cannot start the provider service at {bind}: {error}") from None
        self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        for tenant in tenants:
            self.add_tenant(tenant)
        self._thread: threading.Thread | None = None

    # ---- tenants and jobs --------------------------------------------------------------------
    def add_tenant(self, tenant: str) -> None:
        """Serve ``tenant`` from now on (its key is derived from the provider secret and its name)."""
        if self.secret is None:
            raise ProviderError("an unauthenticated service serves everybody as one tenant")
        self._keys.by_domain["*"][tenant_credential(self.secret, tenant).public] = tenant

    def user_id(self, tenant: str) -> str:
        """The ZAP User-Id a connection of ``tenant`` carries (its public key, z85)."""
        return tenant_credential(self.secret, tenant).public.decode() if self.secret is not None else ""

    @contextlib.contextmanager
    def claim_job(self, spec: JobSpec, session_id: int) -> Iterator[None]:
        """Reserve this host's rank of ``spec`` for one session while (and after) it joins."""
        with self._lock:
            holder = self._jobs.get(spec.key)
            if holder is not None:
                raise BadRequest(f"job {spec.name!r} of tenant {spec.tenant!r} already has its host-{self.host} rank "
                                 f"in session {holder}")
            self._jobs[spec.key] = session_id
        try:
            yield
        except BaseException:
            self.release_job(spec)
            raise

    def release_job(self, spec: JobSpec) -> None:
        with self._lock:
            self._jobs.pop(spec.key, None)

    def job_store(self) -> dist.Store:
        """A store connection of a job's own: a TCPStore client serves one blocking call at a time (a join's
        wait holds it), so sessions joining jobs at once must not share one. A given Store object is shared."""
        if self._store_address is None:
            return self.store
        name, _, port = self._store_address.rpartition(":")
        return dist.TCPStore(name or "127.0.0.1", int(port), self.hosts, False, timedelta(seconds=self._store_timeout_s),
                             wait_for_workers=False)

    def count(self, name: str, amount: int = 1) -> None:
        with self._stats_lock:
            self.stats[name] = self.stats.get(name, 0) + amount

    def seal_session(self, session_id: int) -> None:
        """The session's tenant has connected: its endpoint authenticates nobody else from now on."""
        if self._curve is not None:
            self._keys.by_domain[f"session-{session_id}"] = {}

    def session_ended(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.session_id, None)
        if self._curve is not None:
            self._keys.by_domain.pop(f"session-{session.session_id}", None)
            self._curve.authenticator.credentials_providers.pop(f"session-{session.session_id}", None)

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> ProviderService:
        self._thread = threading.Thread(target=self.serve_forever, name="mccl-provider", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stopping = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        if self._curve is not None:
            poller.register(self._curve.monitor, zmq.POLLIN)
        if self.keep_warm is not None:
            self.keep_warm.start()
        try:
            while not self.stopping:
                ready = dict(poller.poll(100))
                if self._curve is not None and self._curve.monitor in ready:
                    self._count_handshakes()
                if self.socket in ready:
                    self._drain()
        finally:
            self.stopping = True
            for session in list(self._sessions.values()):
                session.thread.join(timeout=5)
            if self.keep_warm is not None:
                self.keep_warm.stop()
            self._close()

    def _close(self) -> None:
        if self._curve is not None:
            self._curve.close()
        self.socket.close(linger=0)
        self.context.term()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _count_handshakes(self) -> None:
        failed = self._curve.failed_handshakes()
        if failed and self.stats.get("auth_failures", 0) == 0:
            log.warning("mccl provider: a peer failed the authentication handshake; further ones are counted")
        self.count("auth_failures", failed)

    def _drain(self) -> None:
        while not self.stopping:
            try:
                parts = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(parts) != 2:
                self.count("malformed")
                continue
            identity, frame = parts
            tenant = self._tenant_of(frame)
            self.socket.send_multipart([identity.bytes, encode(self._handle(tenant, frame.bytes))])

    def _tenant_of(self, frame: zmq.Frame) -> str:
        if self.secret is None:
            return ANONYMOUS
        return self._keys.by_domain["*"][frame.get("User-Id").encode()]

    def _handle(self, tenant: str, frame: bytes) -> dict[str, Any]:
        request_id = 0
        try:
            message = decode(frame)
            request_id = message["id"]
            if message["op"] == "hello":
                reply = self._hello(tenant)
            elif message["op"] == "status":
                with self._stats_lock:
                    reply = {"op": "status", "stats": dict(self.stats), "foreign_refs": self.registry.foreign,
                             "allocations": len(self.registry), "sessions": len(self._sessions)}
            else:
                raise BadRequest(f"unknown operation {message['op'][:40]!r} at the main endpoint (hello, status)")
        except ProviderError as error:
            self.count("malformed" if isinstance(error, BadRequest) else "refused")
            return error_reply(request_id, error)
        except Exception as error:  # a bug: answer it, keep serving
            log.exception("mccl provider: request failed")
            return error_reply(request_id, ProviderError(f"internal error: {type(error).__name__}: {error}"))
        reply["id"] = request_id
        return reply

    def _hello(self, tenant: str) -> dict[str, Any]:
        with self._lock:
            if len(self._sessions) >= self.config.max_sessions:
                raise QuotaExceeded(f"the service serves at most {self.config.max_sessions} tenant processes")
            if sum(session.tenant == tenant for session in self._sessions.values()) >= \
                    self.config.max_sessions_per_tenant:
                raise QuotaExceeded(f"tenant {tenant!r} has {self.config.max_sessions_per_tenant} sessions open, "
                                    "the most one tenant may")
            session_id = self._next_session
            self._next_session += 1
        if self._curve is not None:  # the session's socket takes this tenant's key only
            domain = f"session-{session_id}"
            self._keys.by_domain[domain] = {self.user_id(tenant).encode(): tenant}
            self._curve.authenticator.configure_curve_callback(domain, self._keys)
        session = Session(self, session_id, tenant)
        with self._lock:
            self._sessions[session_id] = session
        session.start()
        self.count("hellos")
        self.count("sessions")
        return {"op": "session", "endpoint": session.endpoint, "host": self.host, "hosts": self.hosts,
                "tenant": tenant}


def _connect_store(address: str, host: int, hosts: int, timeout_s: float) -> dist.Store:
    name, _, port = address.rpartition(":")
    try:
        return dist.TCPStore(name or "127.0.0.1", int(port), hosts, host == 0, timedelta(seconds=timeout_s),
                             wait_for_workers=False)
    except (ValueError, RuntimeError) as error:
        raise ProviderError(f"cannot reach the provider store at {address}: {str(error).splitlines()[0]}") from None
