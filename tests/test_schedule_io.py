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


def test_large_schedules_are_written_in_slices_with_the_same_text(hpn):
    """dumps_schedule encodes columns above 65536 values slice by slice (the controller writes schedules
    on a worker thread whose socket thread must keep answering); the text is one json.dumps's."""
    from mccl.schedule.serialize import schedule_to_dict
    from mccl.topology import rail_optimized

    schedule = nccl_ring(rail_optimized(2, 8, 8), Collective.ALLGATHER)
    assert len(schedule.transfers) > 65536
    text = dumps_schedule(schedule)
    assert text == json.dumps(schedule_to_dict(schedule), separators=(",", ":")) + "\n"
    assert loads_schedule(text) == schedule


def test_reading_compacts_sparse_steps_and_refuses_bad_columns(hpn):
    schedule = nccl_ring(hpn, Collective.ALLGATHER)
    data = json.loads(dumps_schedule(schedule))
    data["transfers"]["step"] = [s * 1_000_000 for s in data["transfers"]["step"]]
    again = loads_schedule(json.dumps(data))
    assert again.transfers.step.tolist() == schedule.transfers.step.tolist()  # renumbered in order
    validate(again, hpn)
    for key, value, message in (("chunk", [[0]] * len(data["transfers"]["chunk"]), "nested lists"),
                                ("chunk", [0.5] * len(data["transfers"]["chunk"]), "fractional number"),
                                ("op", [True] * len(data["transfers"]["op"]), "boolean")):
        with pytest.raises(ScheduleFileError, match=message):
            loads_schedule(json.dumps({**data, "transfers": {**data["transfers"], key: value}}))
    with pytest.raises(ScheduleFileError, match="not a finite number"):
        loads_schedule(dumps_schedule(schedule).replace('"fraction":[', '"fraction":[NaN,', 1))
    with pytest.raises(ScheduleFileError, match="not UTF-8"):
        loads_schedule(b'{"format": "\xff"}')


def test_a_failed_write_keeps_the_previous_file(hpn, tmp_path):
    path = tmp_path / "s.json"
    path.write_text("previous")
    with pytest.raises(OSError):
        dump_schedule(nccl_ring(hpn, Collective.ALLGATHER), tmp_path / "missing" / "s.json")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(OSError):
        dump_schedule(nccl_ring(hpn, Collective.ALLGATHER), tmp_path / "dir.json")
    assert path.read_text() == "previous" and sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "s.json"]
