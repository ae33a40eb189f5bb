"""A rank's controller client against malformed replies (a bare ROUTER socket stands for the controller): every
schedule, candidate or ``activate`` frame with a missing or mistyped field is a :class:`ControllerError` naming it.
Before, a frame without an int ``version`` raised ``KeyError`` / ``ValueError`` out of ``poll()`` — on the
runtime's swap thread, which catches ``ControllerError`` (fail-static) but not those, so hot swapping ended."""

from __future__ import annotations

import time

import pytest
import zmq

from mccl.control import ControllerClient
from mccl.control.protocol import decode, encode
from mccl.errors import ControllerError
from mccl.schedule import dumps_schedule, schedule_binary_text
from mccl.synth import optimize
from mccl.topology import rail_optimized

pytestmark = pytest.mark.timeout(60)

TOPOLOGY = rail_optimized(1, 2, 2)
SCHEDULE = optimize(TOPOLOGY, "allgather").schedule.with_meta(version=1)
TEXT = schedule_binary_text(SCHEDULE.with_meta(version=2))

MALFORMED = [
    (dict(op="schedule", collective="allgather", schedule=TEXT), "'version'"),
    (dict(op="schedule", collective="allgather", version="2", schedule=TEXT), "'version'"),
    (dict(op="schedule", collective="allgather", version=2.5, schedule=TEXT), "'version'"),
    (dict(op="schedule", collective="allgather", version=True, schedule=TEXT), "'version'"),
    (dict(op="schedule", collective="allgather", version=2**70, schedule=TEXT), "'version'"),
    (dict(op="activate", collective="allgather", digest="0" * 32), "'version'"),
    (dict(op="activate", collective="allgather", version="x", digest="0" * 32), "'version'"),
    (dict(op="activate", collective="allgather", version=2), "'digest'"),
    (dict(op="candidate", collective="allgather", schedule=TEXT), "'version'"),
    (dict(op="schedule", version=2, schedule=TEXT), "'collective'"),
    (dict(op="schedule", collective=["allgather"], version=2, schedule=TEXT), "'collective'"),
    (dict(op="schedule", collective="broadcast", version=2, schedule=TEXT), "unknown collective 'broadcast'"),
    (dict(op="schedule", collective="allgather", version=2), "'schedule' must be"),
    (dict(op="schedule", collective="allgather", version=2, schedule={"format": 1}), "'schedule' must be"),
    (dict(op="schedule", collective="allgather", version=2, schedule="garbage"), "unreadable schedule"),
    (dict(op="schedule", collective="alltoall", version=2, schedule=TEXT), "allgather schedule sent as version 2 of alltoall"),
    (dict(op="error"), "refused a poll: None"),
]


@pytest.fixture()
def peer():
    """(router, identity of the client's request socket, client)."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = ControllerClient(f"tcp://127.0.0.1:{port}", "job", 0, installed=[SCHEDULE], interval_s=30.0,
                              timeout_s=60.0, candidates=True)
    try:
        deadline = time.monotonic() + 10
        while not router.poll(0):  # its first poll goes out once connected
            assert client.poll() is None and time.monotonic() < deadline
        identity, frame = router.recv_multipart()
        assert decode(frame)["op"] == "poll"
        yield router, identity, client
    finally:
        client.close()
        router.close(linger=0)
        context.term()


def _answer(client: ControllerClient):
    """Poll until the client returns something or raises (the raised error is returned)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            found = client.poll()
        except ControllerError as error:
            return error
        if found is not None:
            return found
        time.sleep(0.005)
    raise AssertionError("the client took nothing within 10 s")


def test_malformed_frames_are_controller_errors_naming_the_field_and_the_client_keeps_working(peer):
    router, identity, client = peer
    for fields, named in MALFORMED:
        op = fields.pop("op")
        router.send_multipart([identity, encode(op, **fields)])
        error = _answer(client)
        assert isinstance(error, ControllerError), (op, fields, error)
        assert named in str(error), (op, fields, str(error))
        assert client.have == {"allgather": 1} and client.received == 0
    router.send_multipart([identity, encode("schedule", collective="allgather", version=2,
                                            schedule=dumps_schedule(SCHEDULE.with_meta(version=2)))])
    taken = _answer(client)
    assert not isinstance(taken, Exception) and taken.meta.version == 2 and client.have == {"allgather": 2}
