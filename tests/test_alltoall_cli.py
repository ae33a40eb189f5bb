"""``mccl synth alltoall``: cold, warm under Fail2, budget, and the errors it must name."""

from __future__ import annotations

import pytest

from mccl.cli.main import main
from mccl.schedule import load_schedule, validate
from mccl.topology import fail2, rail_optimized
from test_msccl import check_msccl_xml


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cold_then_warm_under_fail2(capsys, tmp_path):
    healthy, degraded = tmp_path / "a2a.json", tmp_path / "a2a-fail2.json"
    code, out, err = run(capsys, "synth", "alltoall", "--topology", "rail_optimized(1,2,8)", "--out", str(healthy))
    assert code == 0, err
    assert "alltoall.cg" in out and "100.00 GB/s" in out and "LP bound 100.00 GB/s" in out
    code, out, err = run(capsys, "synth", "alltoall", "--topology", "rail_optimized(1,2,8)", "--fault", "Fail2",
                         "--warm", str(healthy), "--time-limit", "30", "--chunks", "10", "--out", str(degraded))
    assert code == 0, err
    assert "LP bound 89.06 GB/s" in out
    schedule = load_schedule(degraded)
    validate(schedule, fail2(rail_optimized(1, 2, 8)))
    assert schedule.meta.achieved_gbs == pytest.approx(88.89, abs=0.5)
    assert dict(schedule.meta.inputs)["warm"] == "true"


def test_msccl_xml_export(capsys, tmp_path):
    xml = tmp_path / "a2a.xml"
    code, _, err = run(capsys, "synth", "alltoall", "--topology", "rail_optimized(1,2,4)+Fail2", "--out",
                       str(tmp_path / "a2a.json"), "--msccl-xml", str(xml))
    assert code == 0, err
    check_msccl_xml(xml.read_text())


def test_step_bound_option(capsys, tmp_path):
    out_file = tmp_path / "s.json"
    code, out, err = run(capsys, "synth", "alltoall", "--topology", "rail_optimized(1,2,8)+Fail2", "--max-steps", "1",
                         "--out", str(out_file))
    assert code == 0, err
    assert load_schedule(out_file).transfers.n_steps == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--max-steps", "zero"], "positive integer or 'auto'"),
    (["--chunks", "0"], "--chunks"),
    (["--time-limit", "0"], "--time-limit"),
])
def test_bad_options_are_one_line_errors(capsys, tmp_path, args, message):
    code, _, err = run(capsys, "synth", "alltoall", "--topology", "single_switch(3,10)", "--out",
                       str(tmp_path / "x.json"), *args)
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_warm_schedule_of_another_fabric_is_refused(capsys, tmp_path):
    small = tmp_path / "small.json"
    assert run(capsys, "synth", "alltoall", "--topology", "single_switch(3,10)", "--out", str(small))[0] == 0
    code, _, err = run(capsys, "synth", "alltoall", "--topology", "rail_optimized(1,2,8)", "--warm", str(small),
                       "--out", str(tmp_path / "x.json"))
    assert code == 2 and "made for topology" in err
