"""The examples' flags as a user mistypes them: a usage error (exit 2) naming the flag, not a
traceback on every rank (``--steps 0`` was a StatisticsError, ``--width 0`` trained NaN to the end,
``--backend bogus`` an AssertionError inside torch) and, outside torchrun, one line saying how to
start it (was a ValueError about a missing RANK variable)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_ddp import parse_args  # noqa: E402 - the examples directory is not a package


@pytest.mark.parametrize(("argv", "message"), [
    (["--steps", "0"], "must be at least 1"), (["--width", "-3"], "must be at least 1"),
    (["--layers", "two"], "not an integer"), (["--backend", "bogus"], "invalid choice"),
])
def test_a_bad_flag_is_a_usage_error(monkeypatch, capsys, argv, message):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(sys, "argv", ["train_ddp.py", *argv])
    with pytest.raises(SystemExit) as stop:
        parse_args("example")
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_outside_torchrun_says_how_to_start_it(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sys, "argv", ["train_ddp.py"])
    with pytest.raises(SystemExit) as stop:
        parse_args("example")
    assert stop.value.code == 2 and "torchrun --standalone" in capsys.readouterr().err


def test_good_flags_pass(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(sys, "argv", ["train_ddp.py", "--backend", "gloo", "--steps", "3"])
    args = parse_args("example")
    assert (args.backend, args.steps, args.width, args.layers) == ("gloo", 3, 256, 4)
