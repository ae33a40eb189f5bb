"""``mccl demo --fabric pacer --quick``: the closed loop end to end, as a user runs it without root (one bounded
subprocess). The default fabric, netemu, is tested in tests/test_netemu.py (as root; it falls back to this without)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess  # the demo: a controller process and gloo ranks


@pytest.mark.timeout(180)
def test_demo_quick_closes_the_loop(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mccl.cli.main", "demo", "--fabric", "pacer", "--quick", "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=170)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "rank 0's NIC (gpu0 -> tor0.0) degraded" in out
    assert "allgather after the fault: detection" in out and "after the fault: detection -" not in out  # flagged
    assert "recovered" in out  # and swapped
    assert "WRONG" not in out and "every output equal to the known answer" in out and "to torch's gloo collective" in out
    assert "timeline: " in out and out.rstrip().endswith(".png")
