"""``mccl demo --fabric pacer --quick``: the closed loop end to end, as a user runs it without root (one bounded
subprocess). The default fabric, netemu, is tested in tests/test_netemu.py (as root; it falls back to this without)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess  # the demo: a controller process and gloo ranks


def _closed(out: str) -> bool:
    """The loop closed: the fault flagged and a new version ran (the "recovered" phase)."""
    return ("allgather after the fault: detection" in out and "after the fault: detection -" not in out
            and "recovered" in out)


@pytest.mark.timeout(360)
def test_demo_quick_closes_the_loop(tmp_path):
    # One retry, only for a loop that did not close: the pacer's 4 ranks are CPU-bound on a loaded 2-core machine,
    # and then the fault barely shows in the collective times (measured 2026-12-01 with two CPU burners: 1 run in 4
    # not flagged within its 30 degraded collectives, on main and on the merged tree alike; quiet, this test failed
    # 1 run in 3 on the merged tree — flagged at once, kept by the guard, not flagged again — and 0 in 3 on main:
    # see the closing note of 2026-12-01). A broken loop fails both runs; the assertions are on the kept run.
    for attempt in range(2):
        result = subprocess.run([sys.executable, "-m", "mccl.cli.main", "demo", "--fabric", "pacer", "--quick", "--out",
                                 str(tmp_path / f"run{attempt}")], capture_output=True, text=True, timeout=170)
        out = result.stdout
        assert result.returncode == 0, out + result.stderr
        if _closed(out):
            break
    assert "rank 0's NIC (gpu0 -> tor0.0) degraded" in out
    assert "allgather after the fault: detection" in out and "after the fault: detection -" not in out  # flagged
    assert "recovered" in out  # and swapped
    assert "WRONG" not in out and "every output equal to the known answer" in out and "to torch's gloo collective" in out
    assert "timeline: " in out and out.rstrip().endswith(".png")
