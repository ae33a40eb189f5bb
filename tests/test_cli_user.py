"""Bad input a user gave the CLI by hand (sixth and seventh sessions), each one clear line and exit 2:
a capacity too small to schedule around (was a traceback from the tree packing's rate search,
and an AllToAll "with no chunks"), and a controller port libzmq would silently replace."""

from __future__ import annotations

import pytest

from mccl.cli.main import main
from mccl.errors import TopologyError
from mccl.topology import degrade, single_switch
from test_topology import GOOD


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


# test_topology's two-GPU file with a third GPU that has no links (it was reported as nodes[0], the first GPU)
ISOLATED = GOOD.replace("  - {id: s, kind: switch}", "  - {id: c, kind: gpu, host: h2}\n  - {id: s, kind: switch}")


@pytest.mark.parametrize(
    ("args", "message"),
    [  # seventh session, by hand as a new user: each was a traceback, a hang, or a line naming the wrong thing
        (("demo", "--fabric", "pacer", "--alpha", "2"), "alpha must be a finite number in (0, 1], got 2.0"),
        (("demo", "--fabric", "pacer", "--gamma", "-1"), "gamma must be"),
        (("controller-status", "--timeout", "-1"), "'--timeout': '-1' is not a finite number in [0.001"),
        (("synth", "ring", "--topology", "single_switch(4,100)", "--ranks", "gpu0,gpu1,gpu0", "--out", "x.json"),
         "'--ranks': GPU 'gpu0' is given twice"),
        (("synth", "alltoall", "--topology", "single_switch(4,100)", "--max-steps", "0", "--out", "x.json"),
         "'--max-steps': expected a positive integer or 'auto', got '0'"),
        (("eval", "x.json", "--topology", "single_switch(4,100)", "--size", "-5MB"), "size must be positive, got '-5MB'"),
        (("synth", "ring", "--topology", "single_switch(4,100)", "--out", "/nonexistent-dir/ring.json"),
         "cannot write /nonexistent-dir/ring.json: No such file or directory"),
    ],
)
def test_bad_input_found_by_hand_is_one_line(capsys, args, message):
    code, err = run(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err


def test_a_gpu_without_links_is_named_by_topo_check(capsys, tmp_path):
    path = tmp_path / "isolated.yaml"
    path.write_text(ISOLATED)
    code, err = run(capsys, "topo", "check", str(path))
    assert code == 2 and err.count("\n") == 1, err
    assert "isolated.yaml:6: nodes[2]: GPU 'c' has no links" in err, err


def test_group_help_lines_are_whole_sentences(capsys):
    assert main(["topo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "build  Write a fabric (a builder call, faults applied) to a file." in out, out


def test_provider_store_that_is_not_host_port_is_a_usage_error(capsys, tmp_path):
    code, err = run(capsys, "provider", "serve", "--secret-file", str(tmp_path / "s.key"), "--tenant", "a",
                    "--store", "nonsense")
    assert code == 2 and err.count("\n") == 1, err
    assert "--store nonsense: expected HOST:PORT" in err and not (tmp_path / "s.key").exists(), err
