"""The controller service and client over real ZeroMQ sockets on loopback (no mocks)."""

from __future__ import annotations

import socket as socket_module
import time

import pytest
import zmq

from mccl.control import ControlConfig, ControllerClient, ControllerService, Sample, ScheduleManager
from mccl.control.auth import new_secret, read_secret_file, write_secret_file
from mccl.control.protocol import decode, encode, telemetry_message
from mccl.errors import ControllerError
from mccl.schedule import validate
from mccl.synth import optimize
from mccl.topology import rail_optimized

pytestmark = pytest.mark.timeout(60)

TOPOLOGY = rail_optimized(1, 2, 2)


def round_of(seq: int, slow: bool) -> list[Sample]:
    """Telemetry of 4 ranks on 2 hosts; ``slow``: gpu0's NIC cable at 1/8."""
    out = []
    for i in range(4):
        out.append(Sample("intra", "job", i, -1, 10**7, 0.008, time.time(), seq))
        for j in range(4):
            if (i < 2) != (j < 2):
                rate = 10.0 / 8 if slow and 0 in (i, j) else 10.0
                out.append(Sample("inter", "job", i, j, int(rate * 1e9 / 8 * 0.01), 0.01, time.time(), seq))
    return out


def poll_until(client: ControllerClient, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        schedule = client.poll()
        if schedule is not None:
            return schedule
        time.sleep(0.01)
    raise AssertionError("no schedule arrived")


def wait_for_samples(clients: list[ControllerClient], count: int, timeout_s: float = 10.0) -> None:
    """Until the service has taken ``count`` telemetry samples in all."""
    deadline = time.monotonic() + timeout_s
    while clients[0].status()["stats"]["samples"] < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"the service took fewer than {count} samples in {timeout_s:g} s")
        time.sleep(0.01)


@pytest.fixture()
def service():
    manager = ScheduleManager(TOPOLOGY, ControlConfig(alpha=0.5, gamma=0.2, warmup=2, settle_collectives=1))
    server = ControllerService(manager, "tcp://127.0.0.1:*", check_interval_s=0.01).start()
    yield server
    server.stop()


def test_round_trip_telemetry_in_new_schedule_out(service):
    schedule = optimize(TOPOLOGY, "allgather").schedule.with_meta(version=1)
    clients = [ControllerClient(service.address, "job", rank, installed=[schedule], interval_s=0.01,
                                 timeout_s=10.0, secret=service.secret)  # a loaded 2-core machine can starve the service thread
               for rank in range(4)]
    try:
        assert clients[0].register(schedule) == 1
        for client in clients:
            assert client.poll() is None  # nothing newer than what it runs
            assert client.telemetry_ready(timeout_s=5.0)  # else the first samples would be dropped
        for seq in range(1, 5):
            clients[seq % 4].submit(round_of(seq, slow=False))
        # Each client has its own socket, and the service takes them in turn: without this wait a
        # slow round could be counted before another client's healthy one and become the reference.
        wait_for_samples(clients, sum(client.sent_samples for client in clients))
        for seq in range(5, 12):
            clients[seq % 4].submit(round_of(seq, slow=True))
        received = [poll_until(client) for client in clients]
        assert {item.meta.version for item in received} == {2}
        validate(received[0], TOPOLOGY)
        assert all(client.dropped == 0 for client in clients)
        status = clients[1].status()
        kinds = [event["kind"] for event in status["events"]]
        assert kinds[:1] == ["registered"] and "issued" in kinds
        assert status["stats"]["samples"] == sum(client.sent_samples for client in clients) > 0
        assert clients[2].poll() is None  # already has v2
    finally:
        for client in clients:
            client.close()


def test_telemetry_is_ready_only_with_a_controller_to_send_to(service):
    with socket_module.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        nobody = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    lonely = ControllerClient(nobody, "job", 0, timeout_s=0.3, interval_s=0.01)
    connected = ControllerClient(service.address, "job", 1, timeout_s=10.0, interval_s=0.01, secret=service.secret)
    try:
        assert not lonely.telemetry_ready(timeout_s=0.1)
        lonely.submit(round_of(1, slow=False))
        assert lonely.dropped > 0 and lonely.sent_samples == 0  # dropped and counted, not queued
        assert connected.telemetry_ready(timeout_s=5.0)
    finally:
        lonely.close()
        connected.close()
    assert not lonely.telemetry_ready()


@pytest.mark.slow  # a few seconds: out of the fast loop, run by CI
def test_a_poll_before_the_controller_listens_is_sent_again_not_waited_out():
    """A rank that polls before it is connected must not wait out the timeout for an answer to a
    request that never left (it used to: the controller then counted as lost 10 s into a run)."""
    with socket_module.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    secret = new_secret()
    client = ControllerClient(endpoint, "job", 0, timeout_s=0.5, interval_s=0.01, secret=secret)
    server = None
    try:
        assert client.poll() is None  # nobody listens yet: nothing goes out
        time.sleep(0.2)
        server = ControllerService(ScheduleManager(TOPOLOGY), endpoint, secret=secret).start()
        deadline = time.monotonic() + 1.5  # three timeouts
        while time.monotonic() < deadline:
            assert client.poll() is None  # answered "nothing new", never "did not answer"
            time.sleep(0.01)
    finally:
        client.close()
        if server is not None:
            server.stop()


def test_fail_static_when_the_service_dies():
    manager = ScheduleManager(TOPOLOGY)
    server = ControllerService(manager, "tcp://127.0.0.1:*").start()
    client = ControllerClient(server.address, "job", 0, timeout_s=0.3, interval_s=0.01, secret=server.secret)
    try:
        client.poll()
        time.sleep(0.05)
        assert client.poll() is None  # answered: idle
        server.stop()
        deadline = time.monotonic() + 5
        with pytest.raises(ControllerError, match="did not answer"):
            while time.monotonic() < deadline:
                client.poll()
                time.sleep(0.02)
        with pytest.raises(ControllerError):  # and stays lost: the runtime keeps its schedule
            client.poll()
        client.submit(round_of(1, slow=False))  # telemetry to a dead service is dropped, never blocks
        assert client.dropped > 0
    finally:
        client.close()


def test_telemetry_without_a_service_is_dropped_and_counted():
    with socket_module.socket() as probe:  # a port nobody serves
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = ControllerClient(f"tcp://127.0.0.1:{port}", "job", 0)
    try:
        start = time.perf_counter()
        for _ in range(100):
            client.submit(round_of(1, slow=False))
        assert time.perf_counter() - start < 1.0
        assert client.dropped == 100 * len(round_of(1, slow=False)) and client.sent_samples == 0
    finally:
        client.close()


def test_bad_messages_are_answered_and_counted(service):
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    service.secret.make_client(socket)
    socket.connect(service.address)
    try:
        socket.send(b"not json")
        socket.send(encode("bogus"))
        assert socket.poll(5000)
        reply = decode(socket.recv())
        assert reply["op"] == "error" and "not JSON" in reply["message"]  # every bad request is answered
        assert socket.poll(5000)
        reply = decode(socket.recv())
        assert reply["op"] == "error" and "unknown" in reply["message"]
        socket.send(b'{"v": 99, "op": "status"}')
        socket.send(telemetry_message([]).replace(b'"samples":[]', b'"samples":[["inter"]]'))
        socket.send(encode("status"))
        assert socket.poll(5000)
        reply = decode(socket.recv())
        while reply["op"] != "status":
            assert socket.poll(5000)
            reply = decode(socket.recv())
        assert reply["stats"]["malformed"] >= 3
    finally:
        socket.close()
    with pytest.raises(ControllerError, match="protocol version"):
        decode(b'{"v": 2, "op": "poll"}')


def test_register_of_an_invalid_schedule_is_refused(service):
    client = ControllerClient(service.address, "job", 0, secret=service.secret)
    try:
        other = optimize(rail_optimized(1, 2, 4), "allgather").schedule  # GPUs the service's fabric lacks
        with pytest.raises(ControllerError, match="refused"):
            client.register(other)
    finally:
        client.close()


def test_bind_errors_are_named(service):
    with pytest.raises(ControllerError, match="cannot bind"):
        ControllerService(ScheduleManager(TOPOLOGY), service.address)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)  # its warm-up compiles the synthesizers where no earlier test did (a cold cache)
def test_controller_command_serves_and_bad_input_is_one_line(tmp_path):
    import subprocess
    import sys

    with socket_module.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    key = write_secret_file(tmp_path / "job.key", new_secret())
    process = subprocess.Popen([sys.executable, "-m", "mccl.cli.main", "controller", "--topology",
                                "rail_optimized(1,2,2)", "--bind", endpoint, "--secret-file", str(key)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = ControllerClient(endpoint, "job", 0, secret=read_secret_file(key))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert client.request("status", timeout_s=1.0)["op"] == "status"
                break
            except ControllerError:
                assert time.monotonic() < deadline and process.poll() is None
        assert client.register(optimize(TOPOLOGY, "allgather").schedule.with_meta(version=3)) == 3
        printed: list[str] = []  # the warm-up (--warm, the default) ends with one line, the service serving meanwhile
        while not any("synthesizers warmed on rail_optimized(1,2,2)" in line for line in printed):
            line = process.stdout.readline()
            assert line, f"the controller ended before its warm-up did: {printed}"
            printed.append(line)
        assert client.request("status", timeout_s=5.0)["op"] == "status"
    finally:
        client.close()
        process.terminate()
        process.communicate(timeout=10)
    bad = subprocess.run([sys.executable, "-m", "mccl.cli.main", "controller", "--topology", "nonsense(1)"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "mccl:" in bad.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_controller_command_ends_on_sigterm_as_on_ctrl_c_and_removes_its_temporary_secret():
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path

    process = subprocess.Popen([sys.executable, "-m", "mccl.cli.main", "controller", "--topology",
                                "rail_optimized(1,2,2)", "--bind", "tcp://127.0.0.1:*", "--no-warm"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        printed = []
        while not any("MCCL_CONTROL_SECRET_FILE=" in line for line in printed):
            line = process.stdout.readline()
            assert line, f"the controller ended before serving: {printed} {process.stderr.read()}"
            printed.append(line)
        secret_file = Path(re.search(r"MCCL_CONTROL_SECRET_FILE=(\S+)", "".join(printed)).group(1))
        assert secret_file.exists()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0 and "stopped" in out, err
    assert not secret_file.exists() and not secret_file.parent.exists()  # the private directory, gone
