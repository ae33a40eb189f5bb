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
    # One retry, only for a loop that did not close, for two failure modes of a loaded 2-core machine (the pacer's 4
    # ranks are CPU-bound): the fault barely shows in the collective times and is not flagged within its 30 degraded
    # collectives (2026-12-01, two CPU burners: 1 run in 4, on main and on the merged tree alike); or noisy healthy
    # collective times make a false flag just before the fault, the guard finds that fabric explained and issues a
    # version whose reference window then absorbs the fault (seen at load 12, eighth session). The quiet failure of
    # 2026-12-01 (flagged at once, kept by the guard, never flagged again) was a defect, fixed: a kept schedule's
    # re-based cut was blind to its one binding link (tests/test_control_kept_blind.py). A broken loop fails both
    # runs; the assertions are on the kept run.
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
