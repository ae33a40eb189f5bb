"""``mccl synth allgather``: cold, warm under a fault, MSCCL XML, and one-line errors."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from mccl.cli.main import main
from mccl.schedule import load_schedule, validate
from mccl.topology import parse_topology


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cold_then_warm_under_fail2(capsys, tmp_path):
    healthy, faulted, xml = tmp_path / "h.json", tmp_path / "f.json", tmp_path / "h.xml"
    code, out, _ = run(capsys, "synth", "allgather", "--topology", "rail_optimized(1,2,8)", "--out", str(healthy),
                       "--msccl-xml", str(xml))
    assert code == 0
    assert "optimum 437.33 GB/s" in out and "achieved 436.36 GB/s" in out and "solve time" in out
    assert "bottleneck cut [" in out and "gpu0" in out
    assert ET.parse(xml).getroot().get("coll") == "allgather"
    code, out, _ = run(capsys, "synth", "allgather", "--topology", "rail_optimized(1,2,8)", "--fault", "Fail2",
                       "--warm", str(healthy), "--chunks", "4", "--latency-aware", "--out", str(faulted))
    assert code == 0 and "warm start kept" in out and "optimum 390.67 GB/s" in out
    schedule = load_schedule(faulted)
    validate(schedule, parse_topology("rail_optimized(1,2,8)+Fail2"))
    assert schedule.meta.stat("trees_per_source") <= 4


def test_errors_are_one_line(capsys, tmp_path):
    healthy = tmp_path / "h.json"
    assert run(capsys, "synth", "allgather", "--topology", "rail_optimized(1,2,8)", "--out", str(healthy))[0] == 0
    code, _, err = run(capsys, "synth", "allgather", "--topology", "rail_optimized(2,2,4)", "--warm", str(healthy),
                       "--out", str(tmp_path / "x.json"))
    assert code == 2 and "does not fit topology" in err and err.count("\n") == 1
    code, _, err = run(capsys, "synth", "allgather", "--topology", "rail_optimized(1,2,8)", "--chunks", "11",
                       "--out", str(tmp_path / "x.json"))
    assert code == 2 and "chunks" in err
