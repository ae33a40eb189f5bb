"""Every benchmark script still imports and parses its options (they run outside the suite,
so an API change would otherwise break them silently)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))
SCRIPTS = [path for path in BENCHMARKS if "argparse" in path.read_text()]

pytestmark = pytest.mark.multiprocess  # every script starts in an interpreter of its own


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_benchmark_script_starts(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
