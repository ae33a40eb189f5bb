"""``mccl provider serve`` (one host's provider service) and ``mccl provider credential`` (a tenant's key file).

The provider's secret (``--secret-file``, 0600) is shared by the services of every host; a tenant's
credential is derived from it and the tenant's name (:mod:`mccl.provider.keys`). Both import the
service (and torch) lazily.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import click

from mccl.cli.common import FiniteFloat, console

__all__ = ["provider_group"]


def _provider_secret(path: Path, create: bool):  # noqa: ANN202 - a mccl.control.auth.JobSecret
    from mccl.control.auth import new_secret, read_secret_file, write_secret_file

    if path.exists():
        return read_secret_file(path)
    if not create:
        raise click.UsageError(f"{path}: no provider secret there (mccl provider serve creates it)")
    write_secret_file(path, new_secret())
    return read_secret_file(path)


@click.group("provider")
def provider_group() -> None:
    """The provider-run collective service (MCCS): one per host, several tenants."""


@provider_group.command("serve")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="the provider's secret, shared by every host's service (created 0600 if missing)")
@click.option("--tenant", "tenants", multiple=True, required=True, help="a tenant to serve (repeat)")
@click.option("--credentials-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="write each tenant's credential file here (<tenant>.key, 0600) if it is not there yet")
@click.option("--host", "host", default=0, show_default=True, type=click.IntRange(0), help="this service's host rank")
@click.option("--hosts", default=1, show_default=True, type=click.IntRange(1), help="services of the provider")
@click.option("--store", default="127.0.0.1:29400", show_default=True,
              help="host:port of the provider's store (host rank 0 serves it)")
@click.option("--bind", default=None, help="the main endpoint (default: ipc in a private run directory)")
@click.option("--job-timeout", "job_timeout_s", default=60.0, show_default=True, type=FiniteFloat(),
              help="seconds a job waits for a peer host before it is declared broken")
@click.option("--poll-us", default=2000, show_default=True, type=click.IntRange(0, 1_000_000),
              help="µs a session's thread polls for the tenant's next request after each reply, on a free core "
                   "(0: it sleeps at once; lower latency for a core's time)")
def serve_command(secret_file: Path, tenants: tuple[str, ...], credentials_dir: Path | None, host: int, hosts: int,
                  store: str, bind: str | None, job_timeout_s: float, poll_us: int) -> None:
    """Run this host's provider service until interrupted; tenants connect with mccl.provider.shim.Shim."""
    from mccl.provider.keys import check_tenant_name, tenant_credential, write_credential
    from mccl.provider.service import ProviderService, ServiceConfig

    if host >= hosts:
        raise click.UsageError(f"--host {host} is not below --hosts {hosts}")
    if job_timeout_s <= 0:
        raise click.UsageError("--job-timeout must be positive")
    store_host, _, store_port = store.rpartition(":")
    if not store_host or not store_port.isdigit() or not 1 <= int(store_port) <= 65535:
        raise click.UsageError(f"--store {store}: expected HOST:PORT with a port of 1-65535, e.g. 127.0.0.1:29400")
    for tenant in tenants:  # before the secret file is created: a refused name leaves nothing behind
        check_tenant_name(tenant)
    secret = _provider_secret(secret_file, create=True)
    credentials = {tenant: tenant_credential(secret, tenant) for tenant in tenants}
    if credentials_dir is not None:
        credentials_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for tenant, credential in credentials.items():
            path = credentials_dir / f"{tenant}.key"
            if not path.exists():
                write_credential(path, credential)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    service = ProviderService(host=host, hosts=hosts, store=store, secret=secret, tenants=tenants, bind=bind,
                              config=ServiceConfig(job_timeout_s=job_timeout_s, poll_us=poll_us))
    console.print(f"mccl provider service, host {host} of {hosts}, at {service.address}; tenants "
                  f"{', '.join(tenants)}; Ctrl-C stops", soft_wrap=True)
    if credentials_dir is not None:
        console.print(f"tenant credentials in {credentials_dir}", soft_wrap=True)
    # SIGTERM ends it like Ctrl-C: sessions end, shared memory is freed, the run directory removed
    signal.signal(signal.SIGTERM, lambda *_: setattr(service, "stopping", True))
    try:
        service.serve_forever()
    except KeyboardInterrupt:
        service.stopping = True
    console.print("stopped")


@provider_group.command("credential")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="the provider's secret")
@click.option("--tenant", required=True, help="the tenant's name")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="the credential file to create (0600; never over an existing file)")
def credential_command(secret_file: Path, tenant: str, out: Path) -> None:
    """Write a tenant's credential file (its CURVE key pair and the service's public key)."""
    from mccl.provider.keys import tenant_credential, write_credential

    write_credential(out, tenant_credential(_provider_secret(secret_file, create=False), tenant))
    console.print(f"credential of tenant {tenant!r} in {out}", soft_wrap=True)
