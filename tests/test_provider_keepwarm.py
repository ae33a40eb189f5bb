"""The service keeps its CPUs out of deep idle while a tenant calls (mccl.provider.keepwarm): one pinned thread per
CPU ticks only while a session that keeps warm has called recently, never otherwise; a session may say no, and a
malformed say is refused."""

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
from mccl.provider.replyspin import IdleGate  # noqa: E402
from mccl.provider.service import ProviderService, ServiceConfig  # noqa: E402
from mccl.provider.shim import Shim  # noqa: E402


def _until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_the_threads_tick_on_their_cpus_only_while_a_tenant_is_active():
    cpu = min(os.sched_getaffinity(0))
    warm = KeepWarm({cpu}, tick_s=0.001, active_ns=150_000_000, gate=IdleGate(idle=lambda: True)).start()
    try:
        time.sleep(0.05)
        assert warm.ticks == 0  # nobody called yet: the thread waits
        assert [os.sched_getaffinity(thread.native_id) for thread in warm.threads] == [{cpu}]
        warm.touch(time.perf_counter_ns())
        assert _until(lambda: warm.ticks >= 5)
        time.sleep(0.5)  # past the active window: the thread goes back to waiting
        settled = warm.ticks
        time.sleep(0.1)
        assert warm.ticks == settled
        warm.gate = IdleGate(idle=lambda: False)  # a task waits for a core: one check in 50 ms, no ticking
        warm.touch(time.perf_counter_ns())
        time.sleep(0.1)
        assert 1 <= warm.ticks - settled <= 4
    finally:
        warm.stop()
    assert not any(thread.is_alive() for thread in warm.threads)


@pytest.fixture(scope="module")
def service():
    secret = new_secret()
    service = ProviderService(store=dist.HashStore(), secret=secret, tenants=["alice"],
                              config=ServiceConfig(job_timeout_s=10)).start()
    service.test_secret = secret
    yield service
    service.stop()
    assert not any(thread.is_alive() for thread in service.keep_warm.threads)


def test_a_session_keeps_warm_unless_it_says_no(service):
    shim = Shim(service.address, tenant_credential(service.test_secret, "alice"), timeout_s=20, spin_us=0.0)
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
    cold = Shim(service.address, tenant_credential(service.test_secret, "alice"), timeout_s=20, warm=False)
    try:
        comm = cold.join("cold", [0])
        x = cold.empty(8)
        before = service.keep_warm.last
        comm.all_reduce(x)
        assert service.keep_warm.last == before  # said no when it opened its channel
    finally:
        cold.close()
