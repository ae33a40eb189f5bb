"""Start a provider's service processes on this machine: one per emulated host (tests, benchmarks).

Each service is its own process (spawned: a fresh interpreter, as ``mccl provider serve`` is), rank
``host`` of ``hosts``, sharing a TCPStore on loopback that rank 0 hosts. :func:`start_services`
returns once every service answers at its endpoint; :meth:`Services.stop` ends them (SIGTERM, then
SIGKILL after a grace period).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from mccl.control.auth import JobSecret
from mccl.provider.errors import ProviderError

__all__ = ["Services", "start_services", "serve"]


def serve(host: int, hosts: int, store: str, secret_hex: str, tenants: Sequence[str], job_timeout_s: float,
          ready: object = None) -> None:
    """A service process's body: serve until stopped; tell ``ready`` (a pipe end) the endpoint first."""
    import signal

    import torch

    from mccl.provider.service import ProviderService, ServiceConfig

    torch.set_num_threads(1)
    service = ProviderService(host=host, hosts=hosts, store=store, secret=JobSecret.from_hex(secret_hex),
                              tenants=tenants, config=ServiceConfig(job_timeout_s=job_timeout_s))
    signal.signal(signal.SIGTERM, lambda *_: setattr(service, "stopping", True))  # end sessions, free memory
    if ready is not None:
        ready.send(service.address)
        ready.close()
    service.serve_forever()


@dataclass
class Services:
    """Running service processes and their endpoints, by host rank."""

    endpoints: list[str]
    processes: list[mp.process.BaseProcess] = field(repr=False)

    def stop(self, grace_s: float = 5.0) -> None:
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(timeout=grace_s)
            if process.is_alive():
                process.kill()
                process.join(timeout=grace_s)

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_services(hosts: int, secret: JobSecret, tenants: Sequence[str], *, store_port: int,
                   job_timeout_s: float = 60.0, timeout_s: float = 120.0) -> Services:
    """``hosts`` service processes on loopback; their endpoints once all answer (or :class:`ProviderError`)."""
    context = mp.get_context("spawn")
    processes, pipes = [], []
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        for host in range(hosts):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=serve, args=(host, hosts, f"127.0.0.1:{store_port}", secret.hex,
                                                          list(tenants), job_timeout_s, sender), daemon=True)
            process.start()
            sender.close()
            processes.append(process)
            pipes.append(receiver)
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
    services = Services([], processes)
    try:
        for host, pipe in enumerate(pipes):
            if not pipe.poll(timeout_s):
                raise ProviderError(f"the service of host {host} did not start within {timeout_s:g} s")
            services.endpoints.append(pipe.recv())
    except (ProviderError, EOFError) as error:
        services.stop()
        raise ProviderError(f"the provider services did not start: {error or 'a service exited'}") from None
    return services
