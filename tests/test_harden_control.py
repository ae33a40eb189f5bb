"""Issue 13, the controller: no message crashes, stalls or steers it; only the job's secret gets in.

Real ZeroMQ sockets on loopback, the inputs of the issue's report, then a fixed-seed hypothesis fuzz.
"""

from __future__ import annotations

import contextlib
import json
import math
import time

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mccl.control import ControlConfig, ControllerClient, ControllerService, Sample, ScheduleManager
from mccl.control.auth import JobSecret, new_secret, read_secret_file, secret_from_env, write_secret_file
from mccl.control.protocol import decode, encode
from mccl.errors import ControllerError
from mccl.schedule import dumps_schedule, loads_schedule
from mccl.synth import optimize
from mccl.topology import rail_optimized

pytestmark = pytest.mark.timeout(120)

TOPOLOGY = rail_optimized(1, 2, 2)
SCHEDULE = optimize(TOPOLOGY, "allgather").schedule.with_meta(version=1)


@pytest.fixture()
def service():
    server = ControllerService(ScheduleManager(TOPOLOGY, ControlConfig(settle_collectives=0)), "tcp://127.0.0.1:*",
                               check_interval_s=0.01, max_message_bytes=4 << 20, max_communicators=3).start()
    yield server
    server.stop()
    assert not server._thread.is_alive()


def raw_socket(endpoint: str, secret: JobSecret | None) -> zmq.Socket:
    """A DEALER to the service. A send that cannot go out within 10 s raises zmq.Again instead of
    blocking forever: a DEALER whose only connection failed the CURVE handshake has no peer left, and
    a blocking send then waits for one that never comes (the 120 s timeouts this file had under load)."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDTIMEO, 10_000)
    if secret is not None:
        secret.make_client(socket)
    socket.connect(endpoint)
    return socket


def ask(socket: zmq.Socket, frame: bytes, timeout_s: float = 10.0) -> dict:
    socket.send(frame)
    assert socket.poll(int(timeout_s * 1000)), "the service did not answer"
    return decode(socket.recv())


def status(service: ControllerService) -> dict:
    socket = raw_socket(service.address, service.secret)
    try:
        reply = ask(socket, encode("status"))
    finally:
        socket.close()
    assert reply["op"] == "status"
    return reply


def telemetry_row(**changes) -> list:
    row = {"kind": "inter", "comm": "job", "rank": 0, "peer": 2, "bytes": 10**7, "seconds": 0.01, "end": 1.0, "seq": 5}
    row.update(changes)
    return list(row.values())


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


HOSTILE = [
    b"[" * 100_000,
    b"{" * 100_000,
    b'{"v":1,"op":"telemetry","samples":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
    b'{"v":1,"op":"telemetry","samples":[["inter","job",1e400,2,1,0.01,1,5]]}',
    b'{"v":1,"op":"telemetry","samples":[["inter","job",0,2,1e400,0.01,1,5]]}',
    ('{"v":1,"op":"telemetry","samples":[["inter","job",0,2,' + "1" + "0" * 400 + ',0.01,1,5]]}').encode(),
    ('{"v":1,"op":"telemetry","samples":[["inter","job",' + "1" + "0" * 400 + ',2,1,0.01,1,5]]}').encode(),
    b'{"v":1,"op":"telemetry","samples":[["inter","job",0,2,1,NaN,1,5]]}',
    b'{"v":1,"op":"telemetry","samples":[["inter","job",0,2,1,Infinity,1,5]]}',
    b'{"v":1,"op":"telemetry","samples":[["inter","job",0,2,1,-0.0,1,5]]}',
    b'{"v":1,"op":"telemetry","samples":[["inter",["job"],0,2,1,0.01,1,5]]}',
    b'{"v":1,"op":"telemetry","samples":[[true,"job",true,2,1,0.01,1,5]]}',
    b'{"v":1,"op":"telemetry","samples":{"a":1}}',
    b'{"v":1,"op":"poll","communicator":"job","have":{"allgather":1e400}}',
    b'{"v":1,"op":"poll","communicator":"job","have":{"allgather":' + b"9" * 400 + b"}}",
    b'{"v":1,"op":"poll","communicator":"job","have":[1,2]}',
    b'{"v":1,"op":"poll","communicator":{"x":1}}',
    b'{"v":1,"op":"poll","communicator":"' + b"x" * 10_000 + b'"}',
    b'{"v":1,"op":"register","communicator":"job","schedule":"' + deep(50_000).encode() + b'"}',
    b'{"v":1,"op":"register","communicator":"job","schedule":5}',
    b'{"v":1,"op":"register","communicator":"job","schedule":"{\\"format\\":\\"mccl-schedule/1\\"}"}',
    b'{"v":1,"op":["stop"]}',
    b'{"v":1e400,"op":"status"}',
    b"\xff\xfe\x00garbage",
    b"",
    b"null",
    b'"just a string"',
]


@pytest.mark.parametrize("frame", HOSTILE, ids=lambda frame: repr(frame[:40]))
def test_a_hostile_message_is_answered_and_counted_and_the_service_keeps_serving(service, frame):
    socket = raw_socket(service.address, service.secret)
    try:
        before = status(service)["stats"]["malformed"]
        socket.send(frame)
        reply = ask(socket, encode("status"))  # a reply to the bad frame (if any) or the status comes first
        while reply["op"] != "status":
            assert reply["op"] == "error" and reply["message"]
            reply = decode(socket.recv()) if socket.poll(10_000) else pytest.fail("no status reply")
        assert reply["stats"]["malformed"] == before + 1
        assert service._thread.is_alive()
    finally:
        socket.close()
    assert service.manager.samples_taken == 0


def test_a_frame_above_the_limit_is_refused_without_buffering_it(service):
    socket = raw_socket(service.address, service.secret)
    try:
        socket.send(b"x" * (6 << 20))  # above max_message_bytes + envelope: libzmq drops that connection
    finally:
        socket.close()
    assert status(service)["stats"]["polls"] == 0  # still serving


def test_registrations_are_bounded(service):
    client = ControllerClient(service.address, "a", 0, secret=service.secret)
    try:
        for name in ("a", "b", "c"):
            client.communicator = name
            assert client.register(SCHEDULE) == 1
        client.communicator = "d"
        with pytest.raises(ControllerError, match="at most 3 communicators"):
            client.register(SCHEDULE)
        client.communicator = "a"
        assert client.register(SCHEDULE.with_meta(version=2)) == 2  # a known name still registers
    finally:
        client.close()


@pytest.mark.parametrize("who", ["no secret", "another job's secret"])
def test_without_the_secret_nothing_is_acted_on(service, who):
    """Forged telemetry, registration, status and stop from a peer without the job's secret change
    nothing: the handshake fails, no byte reaches the service, and the failure is counted."""
    client = ControllerClient(service.address, "job", 0, secret=service.secret)
    assert client.register(SCHEDULE) == 1
    intruder_secret = None if who == "no secret" else new_secret()
    intruder = raw_socket(service.address, intruder_secret)
    forged = ControllerClient(service.address, "job", 0, secret=intruder_secret, timeout_s=0.5)
    try:
        rows = [telemetry_row(seq=seq, bytes=10**5) for seq in range(1, 50)]
        deadline = time.monotonic() + 30  # the intruder's handshake fails first: what made a blocking send hang
        while status(service)["stats"]["auth_failures"] == 0:
            assert time.monotonic() < deadline, "the intruder's failed handshake was never counted"
            time.sleep(0.02)
        for frame in (encode("telemetry", samples=rows), encode("register", communicator="job",
                      schedule=dumps_schedule(SCHEDULE.with_meta(version=9))),
                      encode("register", communicator="squat", schedule=dumps_schedule(SCHEDULE)), encode("stop")):
            with contextlib.suppress(zmq.Again):  # the handshake failed: libzmq may have no connection to send on
                intruder.send(frame, zmq.NOBLOCK)
        assert not intruder.poll(1500)  # no answer, not even to status
        forged.submit([Sample("inter", "job", 0, 2, 10**5, 0.01, time.time(), 9)] * 10)
        with pytest.raises(ControllerError, match="refused this client's handshake|did not answer"):
            forged.request("stop", timeout_s=0.5)
        reply = status(service)
        assert reply["stats"]["auth_failures"] >= 1
        assert reply["stats"]["telemetry_messages"] == 0 and service.manager.samples_taken == 0
        assert service.manager.versions("job") == {"allgather": 1}
        assert service.manager.versions("squat") == {}
        assert service._thread.is_alive()
    finally:
        intruder.close()
        forged.close()
        client.close()


def test_unauthenticated_service_binds_loopback_only():
    with pytest.raises(ControllerError, match="without authentication"):
        ControllerService(ScheduleManager(TOPOLOGY), "tcp://*:0", authenticate=False)
    insecure = ControllerService(ScheduleManager(TOPOLOGY), "tcp://127.0.0.1:*", authenticate=False).start()
    client = ControllerClient(insecure.address, "job", 0)
    try:
        assert client.request("status")["op"] == "status"
    finally:
        client.close()
        insecure.stop()


def test_the_secret_file_is_private_and_reaches_clients_through_the_environment(tmp_path, monkeypatch):
    secret = new_secret()
    path = write_secret_file(tmp_path / "job.key", secret)
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ControllerError, match="cannot create"):
        write_secret_file(path, new_secret())  # never overwritten
    monkeypatch.setenv("MCCL_CONTROL_SECRET_FILE", str(path))
    assert secret_from_env() == secret
    service = ControllerService(ScheduleManager(TOPOLOGY), "tcp://127.0.0.1:*").start()
    client = ControllerClient(service.address, "job", 0)  # both sides from the environment
    try:
        assert service.secret == secret and client.request("status")["op"] == "status"
    finally:
        client.close()
        service.stop()
    path.chmod(0o644)
    with pytest.raises(ControllerError, match="readable by group or others"):
        read_secret_file(path)
    assert "hidden" in repr(secret) and secret.hex not in repr(secret)


@pytest.mark.parametrize("field,value", [("gamma", math.nan), ("gamma", math.inf), ("gamma", -1.0),
                                         ("alpha", math.nan), ("alpha", 1.5), ("alpha_level", math.nan),
                                         ("warmup", 0), ("settle_collectives", -1)])
def test_non_finite_or_out_of_range_config_is_refused(field, value):
    with pytest.raises(ControllerError, match=field):
        ControlConfig(**{field: value})


def test_a_client_that_declared_the_controller_lost_recovers_when_it_answers_again():
    secret = new_secret()
    first = ControllerService(ScheduleManager(TOPOLOGY), "tcp://127.0.0.1:*", secret=secret).start()
    endpoint = first.address
    client = ControllerClient(endpoint, "job", 0, timeout_s=0.3, interval_s=0.01, secret=secret)
    second = None
    try:
        assert client.poll() is None
        first.stop()
        deadline = time.monotonic() + 5
        with pytest.raises(ControllerError, match="did not answer"):
            while time.monotonic() < deadline:
                client.poll()
                time.sleep(0.02)
        second = ControllerService(ScheduleManager(TOPOLOGY), endpoint, secret=secret).start()
        deadline = time.monotonic() + 10
        while True:
            try:
                client.poll()
                break
            except ControllerError:
                assert time.monotonic() < deadline, "the client never recovered"
                time.sleep(0.02)
        assert client.recoveries == 1
        assert client.poll() is None
    finally:
        client.close()
        if second is not None:
            second.stop()


@pytest.mark.multiprocess  # the parser process
def test_polls_are_answered_while_a_large_registration_is_validated(service):
    """The socket thread stays responsive while a large ``register`` is parsed and validated."""
    big = optimize(rail_optimized(1, 2, 2), "allgather").schedule.with_meta(version=5)
    text = dumps_schedule(big)
    document = json.loads(text)
    document["meta"]["inputs"] = [["pad", "x" * 200]] * 10_000  # ~2 MiB: a large, valid file
    frame = encode("register", communicator="job", schedule=json.dumps(document))
    assert len(frame) > 2 << 20
    registrar = raw_socket(service.address, service.secret)
    poller = raw_socket(service.address, service.secret)
    try:
        registrar.send(frame)
        worst = 0.0
        for _ in range(20):
            start = time.perf_counter()
            assert ask(poller, encode("poll", communicator="job", rank=0, have={}))["op"] in ("idle", "schedule")
            worst = max(worst, time.perf_counter() - start)
        assert registrar.poll(20_000)
        assert decode(registrar.recv()) == {"v": 1, "op": "ok", "version": 5}
        served = ask(poller, encode("poll", communicator="job", rank=0, have={}))  # the parser process's reply
        assert (served["op"], served["version"]) == ("schedule", 5)
        assert loads_schedule(served["schedule"]).transfers == big.transfers
        assert worst < 2.0  # the client's default timeout; the 100 ms bar is measured in benchmarks/harden.py
    finally:
        registrar.close()
        poller.close()


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children,
                                                                                        max_size=5), max_leaves=30)
_MESSAGES = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda op, body: {"v": 1, "op": op, **body}, st.sampled_from(["telemetry", "poll", "register",
              "status", "bogus"]), st.dictionaries(st.sampled_from(["samples", "communicator", "have", "schedule",
                                                                     "rank"]), _JSON, max_size=4)),
    st.builds(lambda row: {"v": 1, "op": "telemetry", "samples": [row]}, st.lists(_JSON, min_size=8, max_size=8)),
)


@pytest.fixture(scope="module")
def fuzz_service():
    server = ControllerService(ScheduleManager(TOPOLOGY), "tcp://127.0.0.1:*", check_interval_s=0.01).start()
    socket = raw_socket(server.address, server.secret)
    yield server, socket
    socket.close()
    server.stop()


FUZZ_EXAMPLES = 300  # ~5 s: slow (CI)


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(message=_MESSAGES)
def test_fuzzed_messages_never_end_the_service(fuzz_service, message):
    server, socket = fuzz_service
    frame = message if isinstance(message, bytes) else json.dumps(message).encode()
    socket.send(frame)
    reply = ask(socket, encode("status"))
    while reply["op"] != "status":
        assert reply["op"] in ("error", "ok", "idle", "schedule")
        assert socket.poll(10_000)
        reply = decode(socket.recv())
    assert server._thread.is_alive()


def test_non_finite_values_never_reach_the_wire(service):
    """A sample with a non-finite time is dropped and counted by the client (JSON has no NaN and the
    service refuses it); a non-finite value in the manager's events is sent as null."""
    from mccl.control.manager import Event

    client = ControllerClient(service.address, "job", 0, secret=service.secret)
    try:
        assert client.telemetry_ready(timeout_s=5.0)
        client.submit([Sample("inter", "job", 0, 2, 10**6, math.nan, time.time(), 5),
                       Sample("inter", "job", 0, 2, 10**6, 0.01, time.time(), 5)])
        assert client.dropped == 1 and client.sent_samples == 1
        service.manager.events.append(Event(time.time(), "flagged", "job", "allgather", 1, math.inf, "test"))
        assert client.status()["events"][-1]["value"] is None
    finally:
        client.close()
