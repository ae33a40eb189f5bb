"""The binary schedule format (``mccl-schedule-bin/1``): equal round trips, every damage refused clearly."""

from __future__ import annotations

import json
import struct

import pytest

from mccl.errors import ScheduleFileError
from mccl.schedule import (
    dump_schedule,
    dumps_schedule,
    dumps_schedule_binary,
    load_schedule,
    loads_schedule,
    loads_schedule_binary,
    schedule_binary_text,
    validate,
)
from mccl.schedule.binary import MAGIC
from mccl.synth import optimize
from mccl.synth.ring import nccl_ring
from mccl.topology import rail_optimized


@pytest.fixture(scope="module")
def schedules():
    """A ring AllGather (many steps) and a synthesized AllToAll (metadata: cut, stats, fractions)."""
    fabric = rail_optimized(1, 2, 4)
    return fabric, [nccl_ring(fabric, "allgather").with_meta(version=7),
                    optimize(fabric, "alltoall").schedule.with_meta(version=7)]


def _same(back, schedule) -> None:
    """``back`` equals what the JSON file reads back as (metadata stats are floats in both)."""
    via_json = loads_schedule(dumps_schedule(schedule))
    assert back.collective == via_json.collective and back.ranks == via_json.ranks and back.meta == via_json.meta
    assert back.chunks == schedule.chunks and back.transfers == schedule.transfers
    assert dumps_schedule(back) == dumps_schedule(via_json)


def test_round_trip_bytes_text_and_file(schedules, tmp_path) -> None:
    fabric, items = schedules
    for schedule in items:
        data = dumps_schedule_binary(schedule)
        assert data.startswith(MAGIC) and len(data) < len(dumps_schedule(schedule))
        back = loads_schedule_binary(data)
        _same(back, schedule)
        validate(back, fabric)
        _same(loads_schedule(data), schedule)  # recognized by its magic
        _same(loads_schedule(schedule_binary_text(schedule)), schedule)  # the text form for JSON channels
        dump_schedule(schedule, tmp_path / "s.bin", binary=True)
        _same(load_schedule(tmp_path / "s.bin"), schedule)
        dump_schedule(schedule, tmp_path / "s.json")  # JSON stays the default and readable
        assert json.loads((tmp_path / "s.json").read_text())["format"] == "mccl-schedule/1"


def test_truncated_and_corrupt_files_are_refused(schedules) -> None:
    schedule = schedules[1][1]
    data = dumps_schedule_binary(schedule)
    with pytest.raises(ScheduleFileError, match="truncated.*payload bytes are missing"):
        loads_schedule(data[:-10], "x.bin")
    with pytest.raises(ScheduleFileError, match="truncated.*header"):
        loads_schedule(data[:30])
    with pytest.raises(ScheduleFileError, match="truncated"):
        loads_schedule(data[:10])
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF
    with pytest.raises(ScheduleFileError, match="CRC-32"):
        loads_schedule(bytes(flipped))
    with pytest.raises(ScheduleFileError, match="unexpected bytes"):
        loads_schedule(data + b"\0")
    with pytest.raises(ScheduleFileError, match="format version 9"):
        loads_schedule(MAGIC + struct.pack("<II", 9, 0) + data[16:])
    with pytest.raises(ScheduleFileError, match="base64"):
        loads_schedule(schedule_binary_text(schedule)[:-3] + "!!!")


def test_header_lies_are_refused(schedules) -> None:
    """A header whose CRC matches but whose layout does not (a forged or buggy writer)."""
    schedule = schedules[1][1]
    data = dumps_schedule_binary(schedule)
    (length,) = struct.unpack_from("<I", data, 12)
    header = json.loads(data[16:16 + length])
    payload = data[16 + length:]

    def rebuilt(change) -> bytes:
        forged = json.loads(json.dumps(header))
        change(forged)
        head = json.dumps(forged).encode()
        return data[:12] + struct.pack("<I", len(head)) + head + payload

    with pytest.raises(ScheduleFileError, match="dtype 'u8' not allowed"):
        loads_schedule(rebuilt(lambda h: h["columns"][4].__setitem__(2, "u8")))
    with pytest.raises(ScheduleFileError, match="columns take|need more"):
        loads_schedule(rebuilt(lambda h: h["columns"][3].__setitem__(3, h["columns"][3][3] + 1)))
    with pytest.raises(ScheduleFileError, match="columns must be"):
        loads_schedule(rebuilt(lambda h: h["columns"].pop()))
    with pytest.raises(ScheduleFileError, match="unknown collective"):
        loads_schedule(rebuilt(lambda h: h.__setitem__("collective", "allmagic")))
