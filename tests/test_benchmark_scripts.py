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


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("script", "args", "names"), [
    ("provider.py", ["--direct-ab", "--sizes", "4096"], "--direct-ab, --sizes only with --single-host"),
    ("provider_bar.py", ["--ab", "bogus"], "--ab"),
    ("provider_bar.py", ["--runs", "0"], "--runs"),
    ("reaction.py", ["--runs", "0"], "--runs"),
    ("flag_synthesis.py", ["--trials", "0"], "--trials"),
    ("netemu_candidates.py", ["--candidates", "healthy:bogus"], "unknown shape 'bogus'"),
    ("netemu_candidates.py", ["--fabrics", "0.5,2"], "--fabrics"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_bad_options_are_one_line_usage_errors_before_any_run(script, args, names):
    """A bad option is refused before anything runs (a benchmark that ignored it would run minutes for nothing)."""
    path = next(path for path in BENCHMARKS if path.name == script)
    result = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=110)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and names in result.stderr.strip().splitlines()[-1], result.stderr
