"""The provider service in this process (one host, a HashStore): the shim's collectives, every refusal,
authentication, session ends and the strategy seam. The hostile tenant as a real process, and two hosts
with a tenant killed, are in test_provider_tenants.py."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import zmq  # noqa: E402

from conftest import provider_service  # noqa: E402
from mccl.control.auth import new_secret  # noqa: E402
from mccl.provider.client import ProviderClient, ask_status  # noqa: E402
from mccl.provider.errors import BadReference, BadRequest, ProviderError  # noqa: E402
from mccl.provider.keys import tenant_credential  # noqa: E402
from mccl.provider.protocol import encode  # noqa: E402
from mccl.provider.service import ProviderService, ServiceConfig  # noqa: E402
from mccl.provider.shim import Shim  # noqa: E402


class Recorder:
    """A strategy that records what the service shows it (the seam provpol's policies plug into)."""

    seen: list[tuple[str, str, int]] = []
    closed_jobs: list[str] = []

    def __init__(self, job) -> None:
        self.job = job

    def between(self, job, kind: str, nbytes: int) -> None:
        assert job.communicator.seq == job.collectives  # no collective of the job in flight
        Recorder.seen.append((job.spec.key, kind, nbytes))

    def closed(self, job) -> None:
        Recorder.closed_jobs.append(job.spec.key)


@pytest.fixture(scope="module")
def service():
    with provider_service(strategy=Recorder, job_timeout_s=10, max_allocations=64) as running:
        yield running


def _shim(service, tenant: str = "alice") -> Shim:
    return Shim(service.address, tenant_credential(service.test_secret, tenant), timeout_s=20)


def test_collectives_through_the_shim_equal_torchs(service):
    shim = _shim(service)
    try:
        comm = shim.join("train", [0])
        assert (comm.rank, comm.size) == (0, 1)
        x = shim.empty((3, 4))
        x.copy_(torch.arange(12.0).reshape(3, 4))
        comm.all_reduce(x)
        assert torch.equal(x, torch.arange(12.0).reshape(3, 4))  # one rank: the sum is itself
        for op in ("max", dist.ReduceOp.MIN, "avg"):
            comm.all_reduce(x, op)
        assert torch.equal(x, torch.arange(12.0).reshape(3, 4))
        out = shim.empty(12)
        comm.all_gather_into_tensor(out, x.reshape(-1))
        assert torch.equal(out, x.reshape(-1))
        small = torch.zeros(12)  # not in shared memory: staged through scratch allocations
        comm.reduce_scatter_tensor(small, x.reshape(-1))
        assert torch.equal(small, torch.arange(12.0))
        ints = torch.arange(6, dtype=torch.int64)
        got = torch.zeros(6, dtype=torch.int64)
        comm.all_to_all_single(got, ints)
        assert torch.equal(got, ints)
        keys = {key for key, _, _ in Recorder.seen}
        assert "alice/train@0" in keys
        assert ("alice/train@0", "all_gather", 48) in Recorder.seen
    finally:
        shim.close()
    deadline = time.monotonic() + 5
    while "alice/train@0" not in Recorder.closed_jobs and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "alice/train@0" in Recorder.closed_jobs


def test_every_bad_request_gets_its_error_and_the_session_keeps_serving(service):
    client = ProviderClient(service.address, tenant_credential(service.test_secret, "bob"), timeout_s=20)
    try:
        joined = client.join("j", [0])
        buffer = client.alloc(64)
        cases = [
            ({"op": "nope"}, BadRequest, "unknown operation"),
            ({"op": "collective", "comm": 99, "kind": "all_reduce", "dtype": "float32", "refs": []}, BadRequest,
             "no communicator"),
            ({"op": "collective", "comm": joined.comm, "kind": "broadcast", "dtype": "float32", "refs": []},
             BadRequest, "unknown collective"),
            ({"op": "collective", "comm": joined.comm, "kind": "all_reduce", "dtype": "complex", "refs": []},
             BadRequest, "unknown dtype"),
            ({"op": "collective", "comm": joined.comm, "kind": "all_reduce", "dtype": "int32", "reduce": "avg",
              "refs": [[buffer.alloc_id, 0, 4]]}, BadRequest, "avg"),
            ({"op": "collective", "comm": joined.comm, "kind": "all_reduce", "dtype": "float32",
              "refs": [[buffer.alloc_id, 0, 4], [buffer.alloc_id, 0, 4]]}, BadReference, "takes 1 buffer"),
            ({"op": "collective", "comm": joined.comm, "kind": "all_gather", "dtype": "float32",
              "refs": [[buffer.alloc_id, 0, 8], [buffer.alloc_id, 8, 4]]}, BadReference, "must be 1 ×"),
            ({"op": "collective", "comm": joined.comm, "kind": "all_reduce", "dtype": "float32",
              "refs": [[buffer.alloc_id, 60, 8]]}, BadReference, "outside allocation"),
            ({"op": "alloc", "nbytes": -1}, ProviderError, "an allocation is"),
            ({"op": "free", "alloc": 10**30}, BadReference, "not an allocation"),
            ({"op": "join", "job": "x", "hosts": [1]}, BadRequest, "hosts"),
            ({"op": "join", "job": "", "hosts": [0]}, BadRequest, "printable name"),
            ({"op": "join", "job": "j", "hosts": [0]}, BadRequest, "already has its host-0 rank"),
        ]
        for message, error, words in cases:
            with pytest.raises(error) as caught:
                client.request(message)
            assert words in str(caught.value), (message, str(caught.value))
        for frame in (b"garbage", b"{}", b"\x00" * 100, encode({"op": "alloc", "id": "x"})):
            reply = client.send_raw(frame)
            assert reply is not None and reply["op"] == "error" and reply["error"] == "BadRequest"
        client._socket.send_multipart([b"two", b"frames"])  # a ROUTER sees three: ignored, counted
        client.buffer_view = memoryview(buffer.buffer).cast("f")
        client.buffer_view[0] = 2.5
        client.collective(joined, "all_reduce", "float32", [[buffer.alloc_id, 0, 4]])  # still serving
        assert client.buffer_view[0] == 2.5
        client.buffer_view.release()
    finally:
        client.close()


def test_a_wrong_key_never_gets_through_and_is_counted(service):
    before = ask_status(service.address, tenant_credential(service.test_secret, "alice"))["stats"]["auth_failures"]
    for stranger in (tenant_credential(new_secret(), "alice"), tenant_credential(service.test_secret, "mallory")):
        with pytest.raises(ProviderError, match="did not answer"):
            ProviderClient(service.address, stranger, timeout_s=0.5)
    context = zmq.Context()
    plain = context.socket(zmq.DEALER)  # no CURVE at all
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(service.address)
    plain.send(encode({"op": "hello", "id": 1}))
    assert not plain.poll(300)
    plain.close()
    context.term()
    # alice's credential on bob's session endpoint: the session's ZAP domain takes bob's key only
    bob = ProviderClient(service.address, tenant_credential(service.test_secret, "bob"), timeout_s=20)
    try:
        intruder = ProviderClient.__new__(ProviderClient)
        intruder.credential = tenant_credential(service.test_secret, "alice")
        intruder._context = zmq.Context()
        socket = intruder._connect(bob.endpoint)
        socket.send(encode({"op": "alloc", "id": 1, "nbytes": 8}))
        assert not socket.poll(300)
        socket.close()
        intruder._context.term()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            after = ask_status(service.address, tenant_credential(service.test_secret, "bob"))["stats"]
            if after["auth_failures"] >= before + 4:
                break
            time.sleep(0.05)
        assert after["auth_failures"] >= before + 3  # two strangers and the intruder (plain: no handshake at all)
        bob.alloc(8)  # bob's session was not disturbed
    finally:
        bob.close()


def test_a_dropped_connection_ends_the_session_and_frees_its_memory(service):
    credential = tenant_credential(service.test_secret, "alice")
    client = Shim(service.address, credential, timeout_s=20)
    client.join("gone", [0])
    tensor = client.empty(1024)
    before = ask_status(service.address, credential)
    assert before["allocations"] >= 1
    client._socket.close(linger=0)  # as a crash would: no bye
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = ask_status(service.address, credential)
        if status["stats"]["sessions_lost"] > before["stats"]["sessions_lost"]:
            break
        time.sleep(0.05)
    assert status["stats"]["sessions_lost"] == before["stats"]["sessions_lost"] + 1
    assert status["allocations"] < before["allocations"]
    tensor.fill_(1.0)  # this process's own mapping stays valid
    again = Shim(service.address, credential, timeout_s=20)
    try:
        again.join("gone", [0])  # the job's rank on this host is free again: a new generation
    finally:
        again.close()


def test_one_tenant_cannot_take_every_session():
    secret = new_secret()
    service = ProviderService(store=dist.HashStore(), secret=secret, tenants=["alice", "bob"],
                              config=ServiceConfig(max_sessions_per_tenant=1)).start()
    try:
        first = ProviderClient(service.address, tenant_credential(secret, "alice"), timeout_s=20)
        with pytest.raises(ProviderError, match="sessions open"):
            ProviderClient(service.address, tenant_credential(secret, "alice"), timeout_s=20)
        ProviderClient(service.address, tenant_credential(secret, "bob"), timeout_s=20).close()
        first.close()
    finally:
        service.stop()
