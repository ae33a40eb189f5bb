"""DESIGN.md's layering, guarded: which mccl packages may import what."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mccl"

# package -> mccl packages it may import (besides itself and the leaf modules)
ALLOWED = {
    "topology": set(),
    "schedule": {"topology"},
    "synth": {"schedule", "topology"},
    "sim": {"schedule", "topology", "synth"},
    "control": {"schedule", "topology", "synth"},  # and zmq, never torch or the runtime
    "runtime": {"schedule", "topology"},  # and torch; it asks the controller, never synthesizes or simulates
}
LEAF_MODULES = {"mccl.errors", "mccl.telemetry"}  # import nothing of mccl; anyone may use them
FORBIDDEN_THIRD_PARTY = {"torch", "zmq"}
ALSO_ALLOWED = {"control": {"zmq"}, "runtime": {"torch"}}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_design(package):
    for path in (SRC / package).rglob("*.py"):
        for name in _imports(path):
            root = name.split(".")[0]
            assert root not in FORBIDDEN_THIRD_PARTY - ALSO_ALLOWED.get(package, set()), f"{path} imports {name}"
            if root == "mccl" and name not in LEAF_MODULES:
                target = name.split(".")[1]
                assert target == package or target in ALLOWED[package], f"{path} imports {name}"


def test_core_packages_do_not_load_torch_or_zmq():
    code = ("import sys, mccl.topology, mccl.schedule, mccl.synth, mccl.sim;"
            "bad = [m for m in ('torch', 'zmq') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_control_does_not_load_torch_or_the_runtime():
    code = ("import sys, mccl.control, mccl.cli.main;"
            "bad = [m for m in ('torch', 'mccl.runtime', 'mccl.experiments.demo') if m in sys.modules]; print(bad);"
            "sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
