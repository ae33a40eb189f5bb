"""Control-plane authentication: ZeroMQ CURVE keys derived from one per-job secret.

Threat model (DESIGN.md terms: the controller and the executors of one job, the
fabric they share with other tenants). The attacker is any process of another user
on the same hosts, or any host that can reach the controller's port, that cannot
read the job's secret (a 0600 file, or the job's environment). Without the secret it
must not be able to: read ``status``, forge telemetry (which would make the
controller issue new schedule versions), ``register`` a schedule, ``stop`` the
service, nor read the schedules the controller sends. Out of scope: a process
running as the job's own user (it can read the secret, and ptrace the ranks
anyway), denial of service by flooding the port (bounded, not prevented: see the
limits in :mod:`.protocol` and :mod:`.service`), traffic analysis.

Why CURVE and not our own HMAC: libzmq's CURVE (CurveZMQ, Curve25519 + XSalsa20-
Poly1305) authenticates both ends at the handshake, encrypts and authenticates every
frame after it and carries per-connection nonces, so replay protection comes with it;
pyzmq's wheels ship it (``zmq.has("curve")``). Nothing here implements cryptography.

Keys. The job's secret is 32 random bytes (64 hex digits). The server's and the
clients' CURVE key pairs are derived from it with SHA-256 (domain-separated), so
one value reaches every rank — through ``MCCL_CONTROL_SECRET_FILE`` (a path, the
launcher's way: the file is created 0600 and refused when group or others can read
it) or ``MCCL_CONTROL_SECRET`` (the hex itself). The service accepts exactly the
clients' public key (a ZAP handler); a connection that fails the handshake is
dropped by libzmq before any of its bytes reach the service, and counted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from mccl.errors import ControllerError

__all__ = ["SECRET_ENV", "SECRET_FILE_ENV", "JobSecret", "CurveServer", "new_secret", "secret_from_env", "read_secret_file",
           "write_secret_file", "is_loopback"]

SECRET_ENV = "MCCL_CONTROL_SECRET"
SECRET_FILE_ENV = "MCCL_CONTROL_SECRET_FILE"
_SECRET_BYTES = 32


@dataclass(frozen=True)
class JobSecret:
    """One job's control-plane secret and the CURVE keys derived from it (z85 bytes)."""

    raw: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.raw, bytes) or len(self.raw) != _SECRET_BYTES:
            raise ControllerError(f"a control-plane secret is {_SECRET_BYTES} bytes ({2 * _SECRET_BYTES} hex digits)")
        if not zmq.has("curve"):
            raise ControllerError("this libzmq has no CURVE support, so the control plane cannot be authenticated")

    @classmethod
    def from_hex(cls, text: str, where: str = "the secret") -> JobSecret:
        try:
            raw = bytes.fromhex(text.strip())
        except ValueError:
            raise ControllerError(f"{where}: not {2 * _SECRET_BYTES} hex digits") from None
        if len(raw) != _SECRET_BYTES:
            raise ControllerError(f"{where}: not {2 * _SECRET_BYTES} hex digits")
        return cls(raw)

    @property
    def hex(self) -> str:
        return self.raw.hex()

    def _pair(self, role: bytes) -> tuple[bytes, bytes]:
        secret_key = z85.encode(hashlib.sha256(b"mccl-control/1/" + role + b"\0" + self.raw).digest())
        return zmq.curve_public(secret_key), secret_key

    @property
    def server_keys(self) -> tuple[bytes, bytes]:
        """(public, secret) of the service."""
        return self._pair(b"server")

    @property
    def client_keys(self) -> tuple[bytes, bytes]:
        """(public, secret) every client of the job uses."""
        return self._pair(b"client")

    def make_server(self, socket: zmq.Socket) -> None:
        public, secret_key = self.server_keys
        socket.curve_secretkey = secret_key
        socket.curve_publickey = public
        socket.curve_server = True

    def make_client(self, socket: zmq.Socket) -> None:
        public, secret_key = self.client_keys
        socket.curve_secretkey = secret_key
        socket.curve_publickey = public
        socket.curve_serverkey = self.server_keys[0]

    def __repr__(self) -> str:  # never print the secret
        return "JobSecret(<hidden>)"


def new_secret() -> JobSecret:
    """A fresh per-job secret from the OS's CSPRNG."""
    return JobSecret(secrets.token_bytes(_SECRET_BYTES))


def read_secret_file(path: str | Path) -> JobSecret:
    """The secret in ``path``; refused when the file is readable by group or others."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as error:
        raise ControllerError(f"{path}: cannot read the control-plane secret: {error}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ControllerError(f"{path}: the control-plane secret is readable by group or others "
                              f"(mode {stat.S_IMODE(mode):o}); chmod 600 it")
    return JobSecret.from_hex(text, str(path))


def write_secret_file(path: str | Path, secret: JobSecret) -> Path:
    """Create ``path`` (mode 0600, never an existing file) holding ``secret``."""
    path = Path(path)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise ControllerError(f"{path}: cannot create the control-plane secret file: {error.strerror}") from None
    with os.fdopen(descriptor, "w", encoding="ascii") as handle:
        handle.write(secret.hex + "\n")
    return path


def secret_from_env(environ: dict[str, str] | None = None) -> JobSecret | None:
    """The secret the launcher gave this process (``MCCL_CONTROL_SECRET_FILE`` first), or None."""
    environ = os.environ if environ is None else environ
    if environ.get(SECRET_FILE_ENV):
        return read_secret_file(environ[SECRET_FILE_ENV])
    if environ.get(SECRET_ENV):
        return JobSecret.from_hex(environ[SECRET_ENV], SECRET_ENV)
    return None


def as_secret(value: JobSecret | str | bytes | None) -> JobSecret | None:
    """A JobSecret from what a caller passed: a JobSecret, hex text, or the raw 32 bytes."""
    if value is None or isinstance(value, JobSecret):
        return value
    if isinstance(value, bytes):
        return JobSecret(value)
    return JobSecret.from_hex(value)


def is_loopback(endpoint: str) -> bool:
    """Whether a ZeroMQ endpoint is reachable from this host only (loopback TCP, ipc, inproc)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"


HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class CurveServer:
    """The server half of CURVE on one socket, as the controller and the provider service run it: a
    ZAP authenticator thread that lets in whom ``credentials`` accepts (an object with
    ``callback(domain, key) -> bool``), and a monitor of failed handshakes. libzmq drops a connection
    that fails the handshake before any of its bytes reach the socket's reader, so the monitor is the
    only place such an attempt can be counted."""

    def __init__(self, context: zmq.Context, socket: zmq.Socket, secret: JobSecret, credentials: object, *,
                 log_name: str) -> None:
        self.socket = socket
        self.monitor: zmq.Socket | None = None
        self.authenticator = ThreadAuthenticator(context, log=logging.getLogger(log_name))
        self.authenticator.start()
        try:
            self.authenticator.configure_curve_callback("*", credentials)
            secret.make_server(socket)
            self.monitor = socket.get_monitor_socket(HANDSHAKE_FAILED)
        except BaseException:
            self.close()
            raise

    def failed_handshakes(self) -> int:
        """How many handshakes failed since the last call (drains the monitor; never blocks)."""
        failed = 0
        while self.monitor is not None:
            try:
                self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            failed += 1
        return failed

    def close(self) -> None:
        """Stop monitoring and authenticating (the socket itself is its owner's to close)."""
        if self.monitor is not None:
            self.socket.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None
        self.authenticator.stop()
