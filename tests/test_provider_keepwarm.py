"""The service keeps its CPUs out of deep idle while a tenant calls (mccl.provider.keepwarm): one pinned thread per
CPU ticks only while a session that keeps warm has called recently, never otherwise; a session keeps warm only when
it asks (not by default), and a malformed say is refused."""

from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from mccl.control.auth import new_secret  # noqa: E402
from mccl.provider.errors import BadRequest  # noqa: E402
from mccl.provider.keepwarm import KeepWarm  # noqa: E402
from mccl.provider.keys import tenant_credential  # noqa: E402
from mccl.provider.service import ProviderService, ServiceConfig  # noqa: E402
from mccl.provider.shim import Shim  # noqa: E402


def _until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.multiprocess  # (the ticking process)
@pytest.mark.timeout(60)
def test_the_threads_tick_on_their_cpus_only_while_a_tenant_is_active():
    cpu = min(os.sched_getaffinity(0))
    warm = KeepWarm({cpu}, tick_s=0.001, active_ns=150_000_000).start()
    try:
        time.sleep(0.3)
        assert warm.ticks == 0 and warm.process.poll() is None  # nobody called yet: the process waits
        # (under load its gate lets a thread tick once in 50 ms: keep calling until it has ticked a few times)
        assert _until(lambda: warm.touch(time.perf_counter_ns()) or warm.ticks >= 3)
        tids = os.listdir(f"/proc/{warm.process.pid}/task")
        assert {cpu} in [os.sched_getaffinity(int(tid)) for tid in tids]  # a thread pinned to its CPU
        time.sleep(0.6)  # past the active window: the process goes back to waiting
        settled = warm.ticks
        time.sleep(0.2)
        assert warm.ticks == settled
    finally:
        warm.stop()
    assert warm.process.returncode == 0  # it ends when the service's end of its pipe closes


@pytest.fixture(scope="module")
def service():
    secret = new_secret()
    service = ProviderService(store=dist.HashStore(), secret=secret, tenants=["alice"],
                              config=ServiceConfig(job_timeout_s=10)).start()
    service.test_secret = secret
    yield service
    service.stop()
    assert service.keep_warm.process.poll() is not None


@pytest.mark.timeout(60)
def test_a_session_keeps_warm_only_when_it_asks(service):
    shim = Shim(service.address, tenant_credential(service.test_secret, "alice"), timeout_s=20, spin_us=0.0,
                warm=True)
    try:
        comm = shim.join("warm", [0])
        x = shim.empty(8)
        before = service.keep_warm.last
        comm.all_reduce(x)
        assert service.keep_warm.last > before  # the request kept the CPUs warm
        with pytest.raises(BadRequest, match="'on' must be true or false"):
            shim.request({"op": "warm", "on": "yes"})
        shim.keep_warm(False)
        before = service.keep_warm.last
        comm.all_reduce(x)
        assert service.keep_warm.last == before
        shim.keep_warm(True)
        comm.all_reduce(x)
        assert service.keep_warm.last > before
    finally:
        shim.close()
    for cold in (Shim(service.address, tenant_credential(service.test_secret, "alice"), timeout_s=20, warm=False),
                 Shim(service.address, tenant_credential(service.test_secret, "alice"), timeout_s=20)):
        try:  # said no when it opened its channel, or said nothing (the default: client.WARM)
            comm = cold.join(f"cold-{cold.warm}-{id(cold)}", [0])
            x = cold.empty(8)
            before = service.keep_warm.last
            comm.all_reduce(x)
            assert service.keep_warm.last == before
        finally:
            cold.close()
