"""Issue 13, the command line: every bad input of the report ends in one line on stderr and exit 2,
nothing is written before the error is known, and a failed write never damages the previous file."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mccl.cli.main import main
from mccl.schedule import load_schedule

pytestmark = pytest.mark.timeout(120)

BOMB = "".join(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
               for prev, name in zip([None, *"abcdefgh"], "abcdefghi", strict=True))


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and message in err, err


@pytest.fixture(scope="module")
def schedule_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("schedule") / "ring.json"
    assert main(["synth", "ring", "--topology", "single_switch(4,100)", "--out", str(path)]) == 0
    return str(path)


def _edited(schedule_file: str, tmp_path, edit) -> str:
    data = json.loads(Path(schedule_file).read_text())
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(("name", "content", "message"), [
    ("latin1.yaml", b"name: caf\xe9\n", "not UTF-8"),
    ("deep.json", b"{" + b'"a":{' * 200_000 + b"}" * 200_001, "nested too deeply"),
    ("deep.yaml", b"- " * 200_000 + b"x\n", "nesting depth"),
    ("deepflow.yaml", b"[" * 200_000 + b"]" * 200_000, "nesting depth"),
    ("bomb.yaml", BOMB.encode(), "aliases expand"),
])
def test_hostile_topology_files(capsys, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    start = time.perf_counter()
    code, _, err = run(capsys, "topo", "check", str(path))
    assert_one_line(code, err, message)
    assert time.perf_counter() - start < 20  # the alias bomb ran > 240 s past 1 GB, deep YAML 52 s


def test_alias_bomb_through_a_builder_path_argument(capsys, tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    code, _, err = run(capsys, "topo", "show", str(path))
    assert_one_line(code, err, "aliases expand")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["transfers"].__setitem__("step", [[s] for s in d["transfers"]["step"]]), "flat list"),
    (lambda d: d["transfers"].__setitem__("chunk", [c + 0.5 for c in d["transfers"]["chunk"]]), "fractional"),
    (lambda d: d["chunks"].__setitem__("source", "oops"), "must be a list"),
    (lambda d: d["transfers"].__setitem__("sender", [10**400] * len(d["transfers"]["sender"])), "beyond 64 bits"),
    (lambda d: d["transfers"].__setitem__("sender", [2**40] * len(d["transfers"]["sender"])), "32 bits"),
    (lambda d: d["meta"].__setitem__("version", [1]), "meta.version"),
    (lambda d: d["meta"].__setitem__("achieved_gbs", "fast"), "meta.achieved_gbs"),
])
def test_hostile_schedule_fields(capsys, tmp_path, schedule_file, edit, message):
    path = _edited(schedule_file, tmp_path, edit)
    code, _, err = run(capsys, "eval", path, "--topology", "single_switch(4,100)")
    assert_one_line(code, err, message)


def test_non_utf8_and_deep_schedule_files(capsys, tmp_path):
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"format": "caf\xe9"}')
    assert_one_line(*run(capsys, "eval", str(latin), "--topology", "single_switch(4,100)")[::2], "not UTF-8")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    assert_one_line(*run(capsys, "eval", str(deep), "--topology", "single_switch(4,100)")[::2], "nested too deeply")


def test_sparse_steps_are_compacted_on_reading(capsys, tmp_path, schedule_file):
    """Steps {0, 2e9}: reading renumbers them, so eval is quick and small (it allocated 14.9 GiB)."""
    steps = json.loads(Path(schedule_file).read_text())["transfers"]["step"]
    path = _edited(schedule_file, tmp_path, lambda d: d["transfers"].__setitem__(
        "step", [1_000_000_000 * s for s in d["transfers"]["step"]]))  # {0, 1e9, 2e9}
    schedule = load_schedule(path)
    assert schedule.transfers.n_steps == len(set(steps)) and schedule.transfers.step.tolist() == steps
    code, out, _ = run(capsys, "eval", path, "--topology", "single_switch(4,100)", "--size", "1MB")
    assert code == 0 and "1048576" in out


@pytest.mark.parametrize(("args", "message"), [
    (("--size", "1" * 400), "larger than"),
    (("--size", "0.1"), "whole number of bytes"),
    (("--step-overhead-us", "nan"), "not a finite number"),
    (("--step-overhead-us", "-1e9"), "not a finite number"),
    (("--step-overhead-us", "inf"), "not a finite number"),
])
def test_hostile_eval_flags(capsys, schedule_file, args, message):
    code, _, err = run(capsys, "eval", schedule_file, "--topology", "single_switch(4,100)", *args)
    assert_one_line(code, err, message)


@pytest.mark.parametrize(("spec", "message"), [
    ("rail_optimized(True,2,2)", "finite numbers"),
    ("rail_optimized(1,2," + "9" * 400 + ")", "finite numbers"),
    ("spine_leaf(2,2,2,2,1e400,50)", "finite numbers"),
])
def test_hostile_topology_specs(capsys, spec, message):
    code, _, err = run(capsys, "topo", "show", spec)
    assert_one_line(code, err, message)


def test_an_exponent_with_a_plus_sign_is_one_fault(capsys):
    code, out, _ = run(capsys, "topo", "show", "rail_optimized(1,2,2)+gpu0<->tor0.0*5e+0", "--fault",
                       "gpu1<->tor0.1=1e+1")
    assert code == 0 and "/10" in out  # gpu1's NIC at 10 Gbit/s; the factor 5 raised gpu0's


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_controller_refuses_non_finite_gamma_before_binding(capsys, value):
    code, _, err = run(capsys, "controller", "--topology", "single_switch(4,100)", "--gamma", value,
                       "--bind", "tcp://127.0.0.1:1")
    assert_one_line(code, err, "finite")


def test_controller_refuses_insecure_beyond_loopback(capsys):
    code, _, err = run(capsys, "controller", "--topology", "single_switch(4,100)", "--insecure", "--bind", "tcp://*:1")
    assert_one_line(code, err, "loopback")


def test_markup_in_names_and_paths_is_printed_as_is(capsys, tmp_path):
    (tmp_path / "[").mkdir()
    out_path = tmp_path / "[" / "x][bold].yaml"  # the path holds "[/x]"
    code, out, err = run(capsys, "topo", "build", "single_switch(3,100)", "--out", str(out_path))
    assert code == 0 and "[/x][bold].yaml" in out, err  # it raised MarkupError after writing the file
    data = out_path.read_text().replace("name: single_switch(3,100)", "name: '[/x] [red]evil'")
    out_path.write_text(data)
    code, out, err = run(capsys, "topo", "check", str(out_path))
    assert code == 0 and "[/x] [red]evil" in out, err
    code, out, err = run(capsys, "topo", "show", str(out_path))
    assert code == 0 and "[/x] [red]evil" in out, err


def test_a_failed_command_writes_nothing_and_keeps_the_old_file(capsys, tmp_path):
    out = tmp_path / "a.json"
    code, _, err = run(capsys, "synth", "allgather", "--topology", "single_switch(4,100)", "--out", str(out),
                       "--msccl-xml", str(tmp_path / "missing" / "a.xml"))
    assert code == 2 and not out.exists() and err.count("\n") == 1
    out.write_text("old and good")
    code, _, _ = run(capsys, "synth", "alltoall", "--topology", "single_switch(4,100)", "--out", str(out),
                     "--msccl-xml", str(tmp_path / "missing" / "a.xml"))
    assert code == 2 and out.read_text() == "old and good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]  # no temporary left behind


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_write_cut_short_leaves_the_previous_file(tmp_path):
    """``ulimit -f``: the write fails (EFBIG), the command exits 2, the old file is intact."""
    out = tmp_path / "ring.json"
    out.write_text("old and good")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    result = subprocess.run([sys.executable, "-m", "mccl.cli.main", "synth", "ring", "--topology",
                             "rail_optimized(1,2,8)", "--out", str(out)], capture_output=True, text=True,
                            preexec_fn=limit, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert out.read_text() == "old and good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ring.json"]
