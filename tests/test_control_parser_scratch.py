"""The parser process's temporary files (issue 13): they live in one directory per service, removed when the
parser closes, and a service killed mid-parse leaves a directory the next parser removes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mccl.control.parser import SCRATCH_PREFIX, ParserProcess, sweep_stale_directories
from mccl.control.protocol import encode
from mccl.schedule import dumps_schedule
from mccl.synth import optimize
from mccl.topology import rail_optimized


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_directories_of_dead_services_are_swept_and_live_ones_kept(tmp_path):
    dead = tmp_path / f"{SCRATCH_PREFIX}{_dead_pid()}-abc"
    live = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def"
    stranger = tmp_path / "mccl-parser-notapid"
    for directory in (dead, live, stranger):
        directory.mkdir()
        (directory / "mccl-message-x").write_bytes(b"left behind")
    assert sweep_stale_directories(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.exists() and stranger.exists()


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_a_parse_leaves_no_file_behind_and_close_removes_the_directory():
    topology = rail_optimized(1, 2, 2)
    schedule = optimize(topology, "allgather").schedule
    parser = ParserProcess(topology, 1 << 20)
    try:
        message, parsed = parser.parse(encode("register", communicator="job", schedule=dumps_schedule(schedule)))
        assert message["op"] == "register" and parsed is not None
        scratch = Path(parser._directory)
        assert scratch.parent == Path(tempfile.gettempdir()) and scratch.name.startswith(f"{SCRATCH_PREFIX}{os.getpid()}-")
        assert list(scratch.iterdir()) == []  # frame and reply removed after each parse
    finally:
        parser.close()
    assert not scratch.exists()
