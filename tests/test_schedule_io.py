import json

import pytest

from mccl.errors import InvalidSchedule, ScheduleFileError
from mccl.schedule import Collective, dump_schedule, dumps_schedule, load_schedule, loads_schedule, validate
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import nccl_ring


@pytest.mark.parametrize("collective", [Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE])
def test_ring_round_trip(hpn, collective, tmp_path):
    schedule = nccl_ring(hpn, collective, chunks=2)
    path = tmp_path / "s.json"
    dump_schedule(schedule, path)
    again = load_schedule(path)
    assert again == schedule
    validate(again, hpn)


def test_alltoall_round_trip_keeps_metadata(hpn):
    schedule = direct_alltoall(hpn)
    again = loads_schedule(dumps_schedule(schedule))
    assert again.meta == schedule.meta and again.meta.bottleneck_cut
    assert dict(again.meta.inputs)["pxn"] == "true"


def test_bad_schedule_files(hpn, tmp_path):
    with pytest.raises(ScheduleFileError, match="not valid JSON"):
        loads_schedule("{", "s.json")
    data = json.loads(dumps_schedule(nccl_ring(hpn, Collective.ALLGATHER)))
    with pytest.raises(ScheduleFileError, match="format: expected 'mccl-schedule/1'"):
        loads_schedule(json.dumps({**data, "format": "other"}))
    with pytest.raises(ScheduleFileError, match="unknown collective 'broadcast'"):
        loads_schedule(json.dumps({**data, "collective": "broadcast"}))
    broken = {**data, "transfers": {k: v for k, v in data["transfers"].items() if k != "step"}}
    with pytest.raises(ScheduleFileError, match="transfers: missing field 'step'"):
        loads_schedule(json.dumps(broken))
    short = {**data, "transfers": {**data["transfers"], "step": data["transfers"]["step"][:-1]}}
    with pytest.raises(InvalidSchedule, match="differ in length"):
        loads_schedule(json.dumps(short))
    with pytest.raises(ScheduleFileError, match="cannot read"):
        load_schedule(tmp_path / "missing.json")
