"""Which path ran each call, in the telemetry: rank → ControllerClient → ControllerService → ``status``.

The fast tests check the pieces on real objects (the call log, the telemetry thread with a
memory sink, the wire format's bounds, a real service on loopback); the multiprocess test runs
two gloo ranks with an "mccl" group reporting to a real service, whose ``status`` must show the
AllGather and ReduceScatter calls under their schedule version and broadcast as delegated.
"""

from __future__ import annotations

import json
import time

import pytest
import zmq

from mccl.cli.main import main
from mccl.control import ControlConfig, ControllerClient, ControllerService, ScheduleManager
from mccl.control.auth import write_secret_file
from mccl.control.protocol import MAX_CALL_ROWS, calls_of, decode, encode, telemetry_message
from mccl.errors import ControllerError
from mccl.runtime.calls import CallLog, CallTotals
from mccl.runtime.launch import run_ranks
from mccl.runtime.sources import MemorySink
from mccl.runtime.telemetry import TelemetryBuffer, TelemetryConfig
from mccl.topology import single_switch

pytestmark = pytest.mark.timeout(60)


def _log() -> CallLog:
    log = CallLog()
    log.record(1, "all_gather_into_tensor", 3)
    log.record(2, "all_gather_into_tensor", 3)
    log.record(3, "all_gather_into_tensor", 4)
    log.record(0, "broadcast", None)
    return log


def test_totals_by_version_and_generation():
    log = _log()
    totals = log.totals("job", 1)
    assert totals.counts == {("all_gather_into_tensor", "schedule", 3): 2, ("all_gather_into_tensor", "schedule", 4): 1,
                             ("broadcast", "delegated", None): 1}
    assert totals.generation == log.generation == 4 and (totals.communicator, totals.rank) == ("job", 1)


def test_the_telemetry_thread_reports_calls_when_they_changed_and_retries_a_refused_report():
    log = _log()
    sink = MemorySink()
    buffer = TelemetryBuffer(sink, TelemetryConfig(flush_interval_s=10.0), calls=lambda: log.totals("job", 0))
    try:
        buffer.flush()
        assert sink.calls[("job", 0)].counts == log.totals("job", 0).counts and buffer.call_reports == 1
        buffer.flush()
        assert buffer.call_reports == 1  # nothing new: no report
        log.record(5, "broadcast", None)
        buffer.flush()
        assert sink.calls[("job", 0)].counts[("broadcast", "delegated", None)] == 2 and buffer.call_reports == 2
    finally:
        buffer.close()

    class Refusing(MemorySink):
        refuse = True

        def submit_calls(self, totals: CallTotals) -> bool:
            return not self.refuse and super().submit_calls(totals)

    refusing = Refusing()
    buffer = TelemetryBuffer(refusing, TelemetryConfig(flush_interval_s=10.0), calls=lambda: log.totals("job", 0))
    try:
        buffer.flush()
        assert refusing.calls == {} and buffer.call_reports == 0
        refusing.refuse = False
        buffer.flush()  # the same totals, sent again because the first report was not taken
        assert refusing.calls[("job", 0)].generation == log.generation
    finally:
        buffer.close()


def test_calls_round_trip_the_wire():
    report = calls_of(decode(telemetry_message((), _log().totals("job", 1))))
    assert report[0] == "job" and report[1] == 1
    assert sorted(report[2], key=str) == sorted([("all_gather_into_tensor", "schedule", 3, 2),
                                                 ("all_gather_into_tensor", "schedule", 4, 1),
                                                 ("broadcast", "delegated", None, 1)], key=str)
    assert calls_of(decode(telemetry_message(()))) is None


def test_too_many_rows_keep_the_delegated_and_the_newest_versions():
    counts = {("all_reduce", "schedule", version): 1 for version in range(MAX_CALL_ROWS + 10)}
    counts[("broadcast", "delegated", None)] = 7
    _, _, rows = calls_of(decode(telemetry_message((), CallTotals("job", 0, counts, 1))))
    assert len(rows) == MAX_CALL_ROWS and ("broadcast", "delegated", None, 7) in rows
    assert min(version for _, path, version, _ in rows if path == "schedule") == 11


def _with_calls(calls) -> dict:
    return json.loads(encode("telemetry", samples=[], calls=calls))


GOOD = {"communicator": "job", "rank": 0, "counts": [["broadcast", "delegated", None, 1]]}


@pytest.mark.parametrize(("calls", "phrase"), [
    ([1, 2], "must be an object"),
    ({**GOOD, "communicator": ""}, "'communicator' must be a string"),
    ({**GOOD, "rank": -1}, "'rank' must be an integer"),
    ({**GOOD, "rank": True}, "'rank' must be an integer"),
    ({**GOOD, "counts": {}}, "'counts' must be a list"),
    ({**GOOD, "counts": [["x", "delegated", None, 1]] * (MAX_CALL_ROWS + 1)}, "at most 1024 rows"),
    ({**GOOD, "counts": [["x", "delegated", None]]}, "a list of 4 fields"),
    ({**GOOD, "counts": [[7, "delegated", None, 1]]}, "op must be a string"),
    ({**GOOD, "counts": [["x", "elsewhere", None, 1]]}, "path must be 'schedule' or 'delegated'"),
    ({**GOOD, "counts": [["x", "schedule", None, 1]]}, "schedule version of 'x' must be an integer"),
    ({**GOOD, "counts": [["x", "schedule", 10**400, 1]]}, "schedule version of 'x' must be an integer"),
    ({**GOOD, "counts": [["x", "delegated", 3, 1]]}, "has no version"),
    ({**GOOD, "counts": [["x", "delegated", None, 0]]}, "count of 'x' must be an integer in 1"),
    ({**GOOD, "counts": [["x", "delegated", None, 1.5]]}, "count of 'x' must be an integer"),
    ({**GOOD, "counts": [["x", "delegated", None, 1], ["x", "delegated", None, 2]]}, "appears twice"),
])
def test_a_malformed_calls_field_is_named(calls, phrase):
    with pytest.raises(ControllerError, match="calls") as error:
        calls_of(_with_calls(calls))
    assert phrase in str(error.value)


@pytest.fixture(params=[1 << 20])
def service(request):
    manager = ScheduleManager(single_switch(2, 100), ControlConfig())
    server = ControllerService(manager, "tcp://127.0.0.1:*", check_interval_s=0.05, max_call_rows=request.param).start()
    yield server
    server.stop()


def _wait(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the service did not get there in time"
        time.sleep(0.01)


@pytest.mark.parametrize("service", [3], indirect=True)  # the service keeps at most 3 rows in all
def test_the_service_refuses_a_malformed_report_keeps_serving_and_bounds_what_it_keeps(service, tmp_path, capsys):
    client = ControllerClient(service.address, "job", 0, secret=service.secret, timeout_s=10.0)
    raw = zmq.Context.instance().socket(zmq.DEALER)
    service.secret.make_client(raw)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(service.address)
    try:
        raw.send(encode("telemetry", samples=[], calls={**GOOD, "counts": [["x", "schedule", -1, 1]]}))
        _wait(lambda: client.status()["stats"]["malformed"] == 1)
        status = client.status()  # still serving
        assert status["calls"] == {} and status["stats"]["call_reports"] == 0
        assert client.telemetry_ready(timeout_s=10.0)
        assert client.submit_calls(_log().totals("job", 0))  # 3 rows: the service's whole allowance
        _wait(lambda: client.status()["stats"]["call_reports"] == 1)
        assert sorted(client.status()["calls"]["job"]["0"], key=str) == sorted(
            [["all_gather_into_tensor", "schedule", 3, 2], ["all_gather_into_tensor", "schedule", 4, 1],
             ["broadcast", "delegated", None, 1]], key=str)
        assert client.submit_calls(CallTotals("job", 1, {("broadcast", "delegated", None): 1}, 1))  # a 4th row
        _wait(lambda: client.status()["stats"]["call_reports_dropped"] == 1)
        assert client.submit_calls(CallTotals("job", 0, {("broadcast", "delegated", None): 2}, 5))  # replaces rank 0's
        _wait(lambda: client.status()["stats"]["call_reports"] == 2)
        assert client.status()["calls"] == {"job": {"0": [["broadcast", "delegated", None, 2]]}}
        secret_file = tmp_path / "control.key"
        write_secret_file(secret_file, service.secret)
        capsys.readouterr()
        assert main(["controller-status", "--endpoint", service.address, "--secret-file", str(secret_file)]) == 0
        out = capsys.readouterr().out
        assert "calls of communicator job by path" in out and "broadcast" in out and "delegated" in out
    finally:
        raw.close(linger=0)
        client.close()


# ---- two real ranks ------------------------------------------------------------------------

def _setup(rank, n):
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    topology = single_switch(n, 100)
    return topology, [naive_ring(topology, "allgather").with_meta(version=2),
                      naive_ring(topology, "reducescatter").with_meta(version=5)]


def _rank(rank, n, address, secret_hex):
    import torch
    import torch.distributed as dist

    import mccl.runtime.backend as mb
    from mccl.control import ControllerClient

    mb.register(_setup)
    group = dist.new_group(list(range(n)), backend="mccl")
    comm = mb.communicator(group)
    client = ControllerClient(address, "mccl", rank, secret=secret_hex, timeout_s=30.0)
    comm.attach_telemetry(client)
    try:
        x = torch.arange(4, dtype=torch.float32) + rank
        for _ in range(3):
            dist.all_gather_into_tensor(torch.empty(4 * n), x, group=group)
        for _ in range(2):
            dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n), group=group)
        dist.broadcast(x, src=0, group=group)
        mine = comm.calls.totals(comm.name, rank)
        deadline = time.monotonic() + 60
        while True:  # until the service shows this rank's totals (a report the socket refused is sent again)
            comm.flush_telemetry()
            shown = client.status()["calls"].get(comm.name, {}).get(str(rank))
            if shown is not None and sum(row[3] for row in shown) == mine.generation:
                break
            assert time.monotonic() < deadline, f"rank {rank}: the service shows {shown}"
            time.sleep(0.05)
        dist.barrier()
        return comm.name, {f"{op}|{path}|{version}": count for (op, path, version), count in mine.counts.items()}
    finally:
        comm.close()
        client.close()


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_status_shows_which_path_ran_each_call_of_two_real_ranks(service):
    reported = run_ranks(_rank, 2, service.address, service.secret.hex, timeout_s=240)
    name = reported[0][0]
    assert name.startswith("mccl:") and reported[1][0] == name
    calls = ControllerClient(service.address, "probe", -1, secret=service.secret).status()["calls"]
    for rank, (_, mine) in enumerate(reported):
        rows = {(op, path, version): count for op, path, version, count in calls[name][str(rank)]}
        assert rows[("all_gather_into_tensor", "schedule", 2)] == 3
        assert rows[("reduce_scatter_tensor", "schedule", 5)] == 2
        assert rows[("broadcast", "delegated", None)] == 1
        assert {f"{op}|{path}|{version}": count for (op, path, version), count in rows.items()} == mine
