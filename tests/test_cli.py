"""The mccl command: in-process for speed, one real subprocess for the console script."""

import csv
import subprocess
import sys

import pytest

from mccl.cli.main import main


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_topo_show_prints_the_hpn_fabric(capsys):
    code, out, _ = run(capsys, "topo", "show", "rail_optimized(1,2,8)")
    assert code == 0
    assert "16 GPUs on 2 hosts" in out and "gpu15" in out and "tor0.7" in out and "2880/2880" in out


def test_build_check_synth_eval_healthy_and_fail2(capsys, tmp_path):
    topo, schedule = tmp_path / "hpn.yaml", tmp_path / "ring.json"
    assert run(capsys, "topo", "build", "rail_optimized(1,2,8)", "--out", str(topo))[0] == 0
    code, out, _ = run(capsys, "topo", "check", str(topo))
    assert code == 0 and out.startswith("ok:")
    code, out, _ = run(capsys, "synth", "ring", "--topology", str(topo), "--out", str(schedule))
    assert code == 0 and "426.67" in out
    table = tmp_path / "eval.csv"
    code, out, _ = run(capsys, "eval", str(schedule), "--topology", str(topo), "--size", "2GB", "--csv", str(table))
    assert code == 0 and "437.33" in out and "97.6%" in out and "2147483648" in out
    healthy = float(_csv_rows(table)[0]["algbw_gbs"])
    code, out, _ = run(capsys, "eval", str(schedule), "--topology", str(topo), "--fault", "Fail2", "--size", "2GB",
                       "--csv", str(table))
    degraded = float(_csv_rows(table)[0]["algbw_gbs"])
    assert code == 0 and healthy / degraded == pytest.approx(8.0, rel=0.01)


def test_eval_refuses_a_csv_in_a_missing_folder_before_it_prints_the_table(capsys, tmp_path):
    schedule = tmp_path / "ring.json"
    assert run(capsys, "synth", "ring", "--topology", "rail_optimized(1,2,8)", "--out", str(schedule))[0] == 0
    code, out, err = run(capsys, "eval", str(schedule), "--topology", "rail_optimized(1,2,8)", "--csv",
                         str(tmp_path / "missing" / "eval.csv"))
    assert code == 2 and "no folder" in err and str(tmp_path / "missing") in err
    assert "algbw" not in out  # nothing printed before the refusal

def test_eval_on_the_flow_simulator(capsys, tmp_path):
    """--model flow runs the flow-level simulator: a ring under Fail2 is paced by gpu0's NIC as in the α-β
    model, and the critical chain says so; the two models' options are not mixed."""
    schedule, table = tmp_path / "ring.json", tmp_path / "flow.csv"
    assert run(capsys, "synth", "ring", "--topology", "rail_optimized(1,2,8)", "--out", str(schedule))[0] == 0
    code, out, _ = run(capsys, "eval", str(schedule), "--topology", "rail_optimized(1,2,8)", "--fault", "Fail2",
                       "--size", "2GB", "--model", "flow", "--csv", str(table))
    flat = " ".join(out.split())  # the table title wraps
    assert code == 0 and "flow simulation, 4 slices per chunk" in flat and "critical chain: 2GB:" in flat
    assert "gpu0->tor0.0" in out.split("critical chain:")[1]
    simulated = float(_csv_rows(table)[0]["algbw_gbs"])
    run(capsys, "eval", str(schedule), "--topology", "rail_optimized(1,2,8)", "--fault", "Fail2", "--size", "2GB",
        "--csv", str(table))
    assert simulated == pytest.approx(float(_csv_rows(table)[0]["algbw_gbs"]), rel=0.02)
    code, _, err = run(capsys, "eval", str(schedule), "--topology", "rail_optimized(1,2,8)", "--slices", "2")
    assert code == 2 and "--slices belongs to the flow model" in err
    code, _, err = run(capsys, "eval", str(schedule), "--topology", "rail_optimized(1,2,8)", "--model", "flow",
                       "--step-overhead-us", "5")
    assert code == 2 and "alpha-beta model" in err


def _csv_rows(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow  # `mccl sim`: fig2 synthesized and simulated (4 slices, the literal model)
def test_synth_direct_and_sim(capsys, tmp_path):
    code, out, _ = run(capsys, "synth", "direct", "--topology", "rail_optimized(1,2,8)", "--out", str(tmp_path / "a.json"))
    assert code == 0 and "100.00 GB/s" in out
    code, out, _ = run(capsys, "sim", "--slices", "4")  # the default scenario (fig2), literal model: ~30x cheaper
    assert code == 0 and "gpu0 NIC -88%" in out and "NCCL ring" in out and "cut bound" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("topo", "show", "nowhere.yaml"), "no such topology file"),
        (("topo", "show", "rail_optimized(1,2,8)", "--fault", "Fail7"), "unknown fault 'Fail7'"),
        (("topo", "check", "nowhere.yaml"), "cannot read topology file"),
        (("eval", "nowhere.json", "--topology", "single_switch(4,100)"), "cannot read schedule file"),
        (("eval", "x.json", "--topology", "single_switch(4,100)", "--size", "lots"), "cannot read size 'lots'"),
        (("synth", "ring", "--topology", "single_switch(1,100)", "--out", "x.json"), "at least 2 ranks"),
        (("synth", "ring", "--topology", "single_switch(4,100)", "--ranks", "gpu0,gpu9", "--out", "x.json"), "'gpu9' is not a GPU"),
        (("frobnicate",), "No such command"),
        (("controller-status", "--endpoint", "garbage[/x]"), "cannot connect to the controller at 'garbage[/x]'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, _, err = run(capsys, *args)
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_schedule_that_does_not_fit_the_topology(capsys, tmp_path):
    schedule = tmp_path / "ring.json"
    assert run(capsys, "synth", "ring", "--topology", "rail_optimized(1,2,8)", "--out", str(schedule))[0] == 0
    code, _, err = run(capsys, "eval", str(schedule), "--topology", "single_switch(16,100)")
    assert code == 2 and "does not start at the sender's GPU" in err or "uses link" in err


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_console_script_runs():
    result = subprocess.run([sys.executable, "-m", "mccl.cli.main", "topo", "show", "single_switch(3,100)"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "3 GPUs on 3 hosts" in result.stdout
    result = subprocess.run([sys.executable, "-m", "mccl.cli.main", "topo", "check", "/nonexistent"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
