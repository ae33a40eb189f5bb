"""A registration prepared in the parser process (issue 13, the poll bar): the manager takes the validated
schedule's overlay map and profile, and the poll reply, instead of computing them; the same state results.

``parse_message`` is the helper process's function, called here in this process (the process itself is
exercised by tests/test_harden_control.py's large registration)."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.parser import parse_message
from mccl.control.prepared import prepare
from mccl.control.protocol import decode, encode
from mccl.errors import ControllerError, InvalidSchedule
from mccl.schedule import dumps_schedule, loads_schedule
from mccl.synth import optimize
from mccl.topology import rail_optimized

TOPOLOGY = rail_optimized(1, 2, 2)
SCHEDULE = optimize(TOPOLOGY, "allgather").schedule.with_meta(version=3)


def test_a_prepared_registration_gives_the_manager_the_same_state():
    frame = encode("register", communicator="job", schedule=dumps_schedule(SCHEDULE))
    message, parsed = parse_message(frame, 1 << 20, TOPOLOGY)
    assert message["op"] == "register" and message["schedule"] is None  # the text is not sent back
    here, there = ScheduleManager(TOPOLOGY, ControlConfig()), ScheduleManager(TOPOLOGY, ControlConfig())
    assert here.register("job", SCHEDULE) == there.register("job", parsed.schedule, prepared=parsed.prepared) == 3
    mine, theirs = here._comms["job"], there._comms["job"]
    assert np.array_equal(mine.coverage.offsets, theirs.coverage.offsets)
    assert np.array_equal(mine.coverage.links, theirs.coverage.links)
    for field in ("links", "n", "cut", "base_slack"):
        assert np.array_equal(getattr(mine.active[SCHEDULE.collective].cut, field),
                              getattr(theirs.active[SCHEDULE.collective].cut, field))
    reply = decode(parsed.reply)  # the poll reply encoded in the helper serves the schedule at its version
    assert (reply["op"], reply["collective"], reply["version"]) == ("schedule", "allgather", 3)
    assert loads_schedule(reply["schedule"]).transfers == SCHEDULE.transfers


def test_an_invalid_schedule_fails_in_the_parser_and_a_mismatched_preparation_is_refused():
    broken = SCHEDULE.with_meta(version=4)
    text = dumps_schedule(broken).replace('"ranks":["', '"ranks":["nowhere","', 1)
    with pytest.raises(InvalidSchedule):
        parse_message(encode("register", communicator="job", schedule=text), 1 << 20, TOPOLOGY)
    other = rail_optimized(1, 2, 4)
    wrong = prepare(optimize(other, "allgather").schedule, other)  # another fabric's preparation
    with pytest.raises(ControllerError, match="does not match"):
        ScheduleManager(TOPOLOGY, ControlConfig()).register("job", SCHEDULE, prepared=wrong)
