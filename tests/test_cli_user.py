"""Bad input a user gave the CLI by hand (sixth session), each one clear line and exit 2:
a capacity too small to schedule around (was a traceback from the tree packing's rate search,
and an AllToAll "with no chunks"), and a controller port libzmq would silently replace."""

from __future__ import annotations

import pytest

from mccl.cli.main import main
from mccl.errors import TopologyError
from mccl.topology import degrade, single_switch


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", ["allgather", "alltoall"])
def test_a_capacity_too_small_to_schedule_is_one_line(capsys, tmp_path, command):
    code, err = run(capsys, "synth", command, "--topology", "single_switch(4,100)", "--fault", "gpu3->sw0=1e-300",
                    "--out", str(tmp_path / "s.json"))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "link 6 (gpu3 -> sw0)" in err and "too slow to schedule around" in err, err
    assert not (tmp_path / "s.json").exists()


def test_the_capacity_floor_is_relative_to_the_fastest_link():
    fabric = single_switch(4, 100)
    degrade(fabric, ("gpu3", "sw0"), gbps=100 * 2e-9)  # just above the floor: kept
    with pytest.raises(TopologyError, match="too slow to schedule around"):
        degrade(fabric, ("gpu3", "sw0"), gbps=100 * 0.5e-9)


@pytest.mark.parametrize("bind", ["tcp://127.0.0.1:99999", "tcp://127.0.0.1", "tcp://127.0.0.1:0"])
def test_controller_refuses_a_port_libzmq_would_replace(capsys, bind):
    code, err = run(capsys, "controller", "--topology", "single_switch(4,100)", "--bind", bind)
    assert code == 2 and err.count("\n") == 1 and "port of 1-65535" in err, err
