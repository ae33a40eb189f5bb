"""Tenant credentials: each tenant its own CURVE key pair, derived from the provider's secret.

The service authenticates with :mod:`mccl.control.auth` (CURVE, a ZAP handler): its server key pair
is the provider secret's ``server_keys``. A tenant's key pair comes from
``HMAC-SHA256(provider secret, tenant name)`` taken as a :class:`~mccl.control.auth.JobSecret` — so
every service of the provider (one per host) recognizes every tenant without a key registry to
keep in step, and no tenant's key tells anything about another's. The service only needs the
tenant *names* it serves; it maps the public key a connection authenticated with (ZMQ's
``User-Id``) back to the name, and that name — never a field of a message — decides whose memory a
request may touch. A connection with any other key fails the handshake, is dropped by libzmq
before a byte reaches the service, and is counted (``auth_failures``).

A credential file (``mccl provider credential``) is JSON, mode 0600, refused when group or others
can read it, holding the tenant's name, its key pair and the server's public key (z85).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq

from mccl.control.auth import JobSecret
from mccl.provider.errors import ProviderError

__all__ = ["TenantCredential", "check_tenant_name", "tenant_credential", "write_credential", "read_credential"]


@dataclass(frozen=True)
class TenantCredential:
    """One tenant's CURVE key pair and the key of the service it may talk to (z85 bytes)."""

    tenant: str
    public: bytes
    secret: bytes
    server_public: bytes

    def make_client(self, socket: zmq.Socket) -> None:
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.curve_serverkey = self.server_public

    def __repr__(self) -> str:  # never print the secret key
        return f"TenantCredential({self.tenant!r}, <hidden>)"


def check_tenant_name(tenant: str) -> None:
    """Refuse a name no credential can be made for (before anything is written for it)."""
    if not isinstance(tenant, str) or not tenant or not tenant.isprintable() or len(tenant) > 128:
        raise ProviderError(f"a tenant name is 1..128 printable characters, not {tenant!r}")


def tenant_credential(provider: JobSecret, tenant: str) -> TenantCredential:
    """The credential of ``tenant`` under the provider's secret (see module docstring)."""
    check_tenant_name(tenant)
    raw = hmac.new(provider.raw, b"mccl-provider/tenant/1\0" + tenant.encode(), hashlib.sha256).digest()
    public, secret_key = JobSecret(raw).client_keys
    return TenantCredential(tenant, public, secret_key, provider.server_keys[0])


def write_credential(path: str | Path, credential: TenantCredential) -> Path:
    """Create ``path`` (mode 0600, never over an existing file) holding ``credential``."""
    path = Path(path)
    text = json.dumps({"tenant": credential.tenant, "public": credential.public.decode(),
                       "secret": credential.secret.decode(), "server_public": credential.server_public.decode()})
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise ProviderError(f"{path}: cannot create the tenant credential: {error.strerror}") from None
    with os.fdopen(descriptor, "w", encoding="ascii") as handle:
        handle.write(text + "\n")
    return path


def read_credential(path: str | Path) -> TenantCredential:
    path = Path(path)
    try:
        mode = path.stat().st_mode
        fields = json.loads(path.read_text(encoding="ascii"))
        credential = TenantCredential(str(fields["tenant"]), fields["public"].encode(), fields["secret"].encode(),
                                      fields["server_public"].encode())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ProviderError(f"{path}: not a tenant credential file: {error}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ProviderError(f"{path}: the tenant credential is readable by group or others "
                            f"(mode {stat.S_IMODE(mode):o}); chmod 600 it")
    return credential
