"""The service pushes a newly issued version to the sockets that polled (the reaction path's dispatch term).

Real ZeroMQ sockets on loopback. The clients ask only every 30 s here, so a version that arrives
within the test arrived because the service pushed it, not because a poll fetched it.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mccl.control import ControlConfig, ControllerClient, ControllerService, Sample, ScheduleManager
from mccl.errors import ControllerError
from mccl.synth import optimize
from mccl.topology import rail_optimized

pytestmark = pytest.mark.timeout(60)

TOPOLOGY = rail_optimized(1, 2, 2)


def _round(seq: int, slow: bool) -> list[Sample]:
    """One collective's telemetry of 4 ranks on 2 hosts; ``slow``: gpu0's NIC at 1/8."""
    out = [Sample("intra", "job", i, -1, 10**7, 0.008, time.time(), seq) for i in range(4)]
    for i in range(4):
        for j in range(4):
            if (i < 2) != (j < 2):
                rate = 10.0 / 8 if slow and 0 in (i, j) else 10.0
                out.append(Sample("inter", "job", i, j, int(rate * 1e9 / 8 * 0.01), 0.01, time.time(), seq))
    return out


@pytest.fixture()
def service():
    manager = ScheduleManager(TOPOLOGY, ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1))
    server = ControllerService(manager, "tcp://127.0.0.1:*", check_interval_s=0.01).start()
    yield server
    server.stop()


def test_an_issued_version_is_pushed_to_waiting_clients_without_a_poll(service):
    schedule = optimize(TOPOLOGY, "allgather").schedule.with_meta(version=1)
    clients = [ControllerClient(service.address, "job", rank, installed=[schedule], interval_s=30.0, timeout_s=60.0,
                                secret=service.secret) for rank in range(4)]
    try:
        assert clients[0].register(schedule) == 1
        for client in clients:
            assert client.wait(0.2) is None  # asks once (subscribes), answered "idle"
            assert client.telemetry_ready(timeout_s=5.0)
        deadline = time.monotonic() + 10
        while clients[0].status()["stats"]["polls"] < len(clients):  # every client has asked once
            assert time.monotonic() < deadline
            for client in clients:
                client.wait(0.02)
        sender = clients[0]
        for seq in range(1, 5):
            sender.submit(_round(seq, slow=False))
        deadline = time.monotonic() + 10
        while sender.status()["stats"]["samples"] < sender.sent_samples and time.monotonic() < deadline:
            time.sleep(0.01)
        for seq in range(5, 12):
            sender.submit(_round(seq, slow=True))
        with ThreadPoolExecutor(len(clients)) as pool:  # no poll goes out in 30 s: only a push gets here
            received = list(pool.map(lambda client: client.wait(10.0), clients))
        assert [None if item is None else item.meta.version for item in received] == [2, 2, 2, 2]
        status = sender.status()
        assert status["stats"]["pushes"] >= 4
        issued = next(event["time"] for event in status["events"] if event["kind"] == "issued")
        for client in clients:
            kind, version, at = client.arrivals[-1]
            assert (kind, version) == ("allgather", 2) and at >= issued
        assert all(client.wait(0.05) is None for client in clients)  # nothing newer
        delivery = next(row for row in status["deliveries"] if row["version"] == 2)
        assert delivery["pushed_to"] == 4 and issued <= delivery["encoded_at"] <= delivery["pushed_at"]
        reaction = status["reactions"][-1]
        assert reaction["outcome"] == "issued" and reaction["flagged_at"] <= reaction["issued_at"] <= issued
    finally:
        for client in clients:
            client.close()


def test_wait_on_a_lost_controller_idles_out_its_timeout_instead_of_spinning():
    client = ControllerClient("tcp://127.0.0.1:9", "job", 0, timeout_s=0.05, interval_s=0.01)
    try:
        with pytest.raises(ControllerError):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                client.wait(0.01)
        start = time.monotonic()
        with pytest.raises(ControllerError):
            client.wait(0.2)
        assert time.monotonic() - start >= 0.15  # a swap thread looping on wait() sleeps, it does not spin
    finally:
        client.close()
