"""Candidates: a synthesis made ahead of the flag is pushed to the ranks before the flag (issue 15, the reaction
path; :mod:`mccl.control.candidates`). Real ZeroMQ sockets on loopback and real tree-packing synthesis on a
2 × 2 fabric; the clients ask only every 30 s, so what arrives was pushed."""

from __future__ import annotations

import time

import pytest

from mccl.control import ControlConfig, ControllerClient, ControllerService, Sample, ScheduleManager
from mccl.control.client import Candidate
from mccl.schedule.serialize import schedule_digest
from mccl.synth import optimize
from mccl.topology import rail_optimized

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]  # ~2–5 s: a service, 4 clients, real synthesis

TOPOLOGY = rail_optimized(1, 2, 2)


def _round(seq: int, factor: float) -> list[Sample]:
    """One collective's telemetry of 4 ranks on 2 hosts; gpu0's NIC at ``factor``."""
    out = [Sample("intra", "job", i, -1, 10**7, 0.008, time.time(), seq) for i in range(4)]
    for i in range(4):
        for j in range(4):
            if (i < 2) != (j < 2):
                rate = 10.0 * (factor if 0 in (i, j) else 1.0)
                out.append(Sample("inter", "job", i, j, int(rate * 1e9 / 8 * 0.01), 0.01, time.time(), seq))
    return out


def _until(manager: ScheduleManager, service: ControllerService, clients: list[ControllerClient],
           sender: ControllerClient, rounds, want, latest: dict) -> list:
    """Submit ``rounds`` (seq, factor) one at a time, each waited into the manager, until every client got
    something ``want`` accepts; what each got (``latest``: each client's newest candidate, by index)."""
    got: list = [None] * len(clients)
    for seq, factor in rounds:
        sender.submit(_round(seq, factor))
        deadline = time.monotonic() + 5
        while manager.samples_taken + manager.samples_ignored < sender.sent_samples and time.monotonic() < deadline:
            time.sleep(0.002)
        checked = service.stats["checks"] + 2  # two checks after the ingest (not a sleep: under load a 12 ms
        while service.stats["checks"] < checked and time.monotonic() < deadline:  # sleep saw none, and the flag
            time.sleep(0.002)  # then came in the same check as the speculation: no candidate before it)
        for index, client in enumerate(clients):
            item = client.wait(0.002)
            while item is not None:
                if isinstance(item, Candidate):
                    latest[index] = item
                if got[index] is None and want(item):
                    got[index] = item
                item = client.wait(0.0)
        if all(item is not None for item in got):
            return got
    return got


def test_a_speculation_is_pushed_as_a_candidate_before_the_flag_and_only_to_who_asked():
    manager = ScheduleManager(TOPOLOGY, ControlConfig(alpha=0.3, gamma=0.3, warmup=2, settle_collectives=1))
    service = ControllerService(manager, "tcp://127.0.0.1:*", check_interval_s=0.005).start()
    schedule = optimize(TOPOLOGY, "allgather").schedule.with_meta(version=1)
    clients = [ControllerClient(service.address, "job", rank, installed=[schedule], interval_s=30.0, timeout_s=60.0,
                                secret=service.secret, candidates=rank < 3) for rank in range(4)]
    try:
        assert clients[0].register(schedule) == 1
        for client in clients:
            assert client.wait(0.2) is None  # asks once (subscribes), answered "idle"
            assert client.telemetry_ready(timeout_s=5.0)
        deadline = time.monotonic() + 10
        while clients[0].status()["stats"]["polls"] < len(clients):
            assert time.monotonic() < deadline
            for client in clients:
                client.wait(0.02)
        sender = clients[0]
        healthy = [(seq, 1.0) for seq in range(1, 5)]
        latest: dict = {}
        _until(manager, service, clients[:3], sender, healthy, lambda item: False, latest)
        # the NIC drifts down a step per collective, as the EWMA sees a NIC halve: ahead of the flag first
        candidates = _until(manager, service, clients[:3], sender, [(seq, 0.5) for seq in range(5, 40)],
                            lambda item: isinstance(item, Candidate), latest)
        assert all(isinstance(item, Candidate) and item.version == 2 for item in candidates), candidates
        assert manager.versions("job") == {"allgather": 1}  # not issued: only prepared ahead
        assert len(clients[3].candidate_arrivals) == 0 and clients[3].have == {"allgather": 1}  # it did not ask
        issued = _until(manager, service, clients, sender, [(seq, 0.5) for seq in range(40, 80)],
                        lambda item: not isinstance(item, Candidate), latest)
        assert [item.meta.version for item in issued] == [2, 2, 2, 2]
        reaction = sender.status()["reactions"][-1]
        assert reaction["outcome"] == "issued"
        if reaction["ahead"]:  # the flag reused the speculation: the ranks had its content (the newest one) before
            assert {schedule_digest(latest[index].schedule) for index in range(3)} == {schedule_digest(issued[0])}
            # ... so the three that asked for candidates got the issued version as a digest (activation by digest),
            # the one that did not got it whole; every rank stages the same content
            assert [client.activations for client in clients] == [1, 1, 1, 0]
            assert service.stats["activations"] == 3
            assert {schedule_digest(item) for item in issued} == {schedule_digest(latest[0].schedule)}
        status = sender.status()
        assert status["stats"]["candidates_pushed"] >= 3
        pushed = [row for row in status["candidates"] if row["version"] == 2]
        assert pushed and pushed[0]["pushed_at"] <= reaction["flagged_at"]
    finally:
        for client in clients:
            client.close()
        service.stop()


def test_an_activate_frame_hands_over_the_kept_candidate_and_a_missing_one_is_asked_for_whole():
    """The client's side of "Activation by digest" against a bare ROUTER socket (no service): a kept candidate
    becomes the new version from a 3-field frame; one that is not kept makes the client poll at once, and the
    whole schedule that answers it is taken. Fails when ``activate`` is ignored or a miss waits for the next
    liveness poll (every 30 s here)."""
    import zmq

    from mccl.control.protocol import decode, encode
    from mccl.schedule import dumps_schedule

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    schedule = optimize(TOPOLOGY, "allgather").schedule.with_meta(version=1)
    client = ControllerClient(f"tcp://127.0.0.1:{port}", "job", 0, installed=[schedule], interval_s=30.0,
                              timeout_s=60.0, candidates=True)
    try:
        deadline = time.monotonic() + 10
        while not router.poll(0):  # its first poll goes out once connected (IMMEDIATE: not queued before)
            assert client.wait(0.05) is None and time.monotonic() < deadline
        identity, frame = router.recv_multipart()
        assert decode(frame)["op"] == "poll"
        candidate = schedule.with_meta(version=2)
        digest = schedule_digest(candidate)
        router.send_multipart([identity, encode("candidate", communicator="job", collective="allgather", version=2,
                                                schedule=dumps_schedule(candidate), digest=digest)])
        got = client.wait(5.0)
        assert isinstance(got, Candidate) and got.version == 2
        router.send_multipart([identity, encode("activate", collective="allgather", version=2, digest=digest)])
        issued = client.wait(5.0)
        assert not isinstance(issued, Candidate) and issued.meta.version == 2 and schedule_digest(issued) == digest
        assert client.activations == 1 and client.have == {"allgather": 2}
        # version 3, announced by the digest of a candidate this client never got: it asks at once
        router.send_multipart([identity, encode("activate", collective="allgather", version=3, digest="0" * 32)])
        started = time.monotonic()
        assert client.wait(0.5) is None
        assert router.poll(5000)
        identity, frame = router.recv_multipart()
        asked = decode(frame)
        assert asked["op"] == "poll" and asked["have"] == {"allgather": 2} and time.monotonic() - started < 5
        router.send_multipart([identity, encode("schedule", collective="allgather", version=3,
                                                schedule=dumps_schedule(schedule.with_meta(version=3)))])
        whole = client.wait(5.0)
        assert whole is not None and whole.meta.version == 3 and client.activations == 1
    finally:
        client.close()
        router.close(linger=0)
        context.term()


def test_warm_synthesis_runs_each_collective_once_cold_and_once_warm_and_names_an_unknown_one():
    from mccl.control.ahead import warm_synthesis
    from mccl.errors import ControllerError

    seconds = warm_synthesis(TOPOLOGY, ["allgather", "alltoall"])
    assert set(seconds) == {"allgather", "alltoall"} and all(value > 0 for value in seconds.values())
    with pytest.raises(ControllerError, match="allgathr"):
        warm_synthesis(TOPOLOGY, ["allgathr"])
