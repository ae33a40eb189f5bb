"""A job's end reaches its peers at once, whoever still holds the job (issue 16's crash bar, in this process).

Why this file: with the fast-path thread (``provider/fastpath.py``) a session's cache of checked requests
kept the ``Job`` alive after its session ended; gloo's ``abort()`` leaves the group's connections open
(torch 2.13), so the killed tenant's peer learned of it only at the job's timeout, and only when the cyclic
garbage collector had not freed the session first (``test_provider_tenants.py`` failed 2 of 3 CI runs).
Here the collector is off, so the outcome does not depend on when it runs.
"""

from __future__ import annotations

import gc
import threading
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from mccl.control.auth import new_secret  # noqa: E402
from mccl.provider.client import ProviderClient  # noqa: E402
from mccl.provider.errors import JobFailed  # noqa: E402
from mccl.provider.jobs import Job, JobSpec  # noqa: E402
from mccl.provider.keys import tenant_credential  # noqa: E402
from mccl.provider.service import ProviderService, ServiceConfig  # noqa: E402

TIMEOUT_S = 20.0  # the job's collective timeout: a peer told only by it fails the bound below
TOLD_WITHIN_S = 5.0


@pytest.fixture
def no_gc():
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _in_threads(*calls):
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _blocked_peer(run) -> tuple[dict, threading.Thread]:
    """Run ``run`` (a collective whose other rank never comes) on a thread; what it raised, and when."""
    outcome: dict = {}

    def peer() -> None:
        try:
            run()
            outcome["error"] = None
        except Exception as error:  # noqa: BLE001 - the test looks at it
            outcome["error"] = error
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=peer)
    thread.start()
    return outcome, thread


@pytest.mark.timeout(60)
def test_a_closed_job_tells_its_blocked_peer_though_something_still_holds_it(no_gc):
    store, spec, jobs = dist.HashStore(), JobSpec("t", "j", (0, 1)), [None, None]

    def make(host: int) -> None:
        jobs[host] = Job(spec, host, store, timeout_s=TIMEOUT_S, join_timeout_s=30)

    _in_threads(lambda: make(0), lambda: make(1))
    tensors = [torch.full((8,), 1.0), torch.full((8,), 2.0)]
    _in_threads(*(lambda h=h: jobs[h].run("all_reduce", [tensors[h]], "sum") for h in (0, 1)))
    assert torch.equal(tensors[0], torch.full((8,), 3.0))
    outcome, thread = _blocked_peer(lambda: jobs[1].run("all_reduce", [tensors[1]], "sum"))
    time.sleep(0.3)
    held = jobs[0]  # as a cache of checked requests holds it
    closed_at = time.monotonic()
    held.close()
    thread.join(TIMEOUT_S + 10)
    assert isinstance(outcome["error"], JobFailed), outcome
    assert outcome["at"] - closed_at < TOLD_WITHIN_S, outcome["at"] - closed_at
    with pytest.raises(JobFailed, match="closed"):
        held.run("all_reduce", [tensors[0]], "sum")
    assert held.broken and held.failure == "closed"
    jobs[1].close()


@pytest.mark.timeout(90)
def test_a_tenant_gone_mid_loop_on_the_fast_path_fails_its_peer_at_once(no_gc):
    """Two services in this process (hosts 0 and 1, one store); the tenant's host-0 client drops its
    connection and fast path (as a crash does) after a few fast-path collectives, which its session has
    cached; its host-1 rank, inside the next collective, must be told long before the job's timeout."""
    secret, store = new_secret(), dist.HashStore()
    config = ServiceConfig(job_timeout_s=TIMEOUT_S, join_timeout_s=30)
    services = [ProviderService(host=h, hosts=2, store=store, secret=secret, tenants=["t"], config=config).start()
                for h in (0, 1)]
    try:
        clients = [ProviderClient(s.address, tenant_credential(secret, "t"), timeout_s=60) for s in services]
        assert all(client.fast for client in clients)
        joined: list = [None, None]
        _in_threads(*(lambda h=h: joined.__setitem__(h, clients[h].join("j", [0, 1])) for h in (0, 1)))
        buffers = [client.alloc(4096) for client in clients]

        def reduce(h: int) -> None:
            clients[h].collective(joined[h], "all_reduce", "float32", [[buffers[h].alloc_id, 0, 4096]])

        for _ in range(3):  # checked once, then served from the session's cache
            _in_threads(lambda: reduce(0), lambda: reduce(1))
        outcome, thread = _blocked_peer(lambda: reduce(1))
        time.sleep(0.3)
        gone_at = time.monotonic()
        clients[0]._close_channel()  # a crash: no bye, the pipe and the socket simply close
        clients[0]._socket.close(linger=0)
        thread.join(TIMEOUT_S + 10)
        assert type(outcome["error"]).__name__ == "JobFailed", outcome
        assert outcome["at"] - gone_at < TOLD_WITHIN_S, outcome["at"] - gone_at
        clients[1].close()
        clients[0]._context.term()
    finally:
        for service in services:
            service.stop()
