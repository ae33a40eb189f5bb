"""DESIGN.md's layering, guarded: which mccl packages may import what, and no import cycles.

Imports are read from the source (ast), wherever they are: at module level, inside
functions (lazy imports) and under ``if TYPE_CHECKING:``. A lazy import still couples
two modules, so it counts like any other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mccl"

CORE = {"topology", "schedule", "synth", "sim", "control", "runtime"}
ROOT = "mccl"  # src/mccl/__init__.py: __version__, and mccl.init & co., which load the runtime (and torch) on first use

# DESIGN.md's package table: package -> mccl packages it may import (besides itself and the leaf modules).
# Arrows point down the table's reverse order only.
ALLOWED: dict[str, set[str]] = {
    "topology": set(),
    "schedule": {"topology"},
    "synth": {"schedule", "topology"},
    "sim": {"schedule", "topology"},  # it never learns how a schedule was synthesized
    "control": {"schedule", "topology", "synth"},  # and zmq; never torch or the runtime
    # and torch; it asks the controller, never synthesizes or simulates. DESIGN.md lets it reach "only the
    # controller's client, through the schedule-source / telemetry-sink seam": that seam is
    # mccl.runtime.sources (ScheduleSource, TelemetrySink), which mccl.control.client.ControllerClient
    # implements and the caller passes in (mccl.init(controller=..., sink=...)), so the runtime imports
    # nothing of mccl.control at all, and this table keeps it that way.
    "runtime": {"schedule", "topology"},
    # the provider-run collective service (MCCS §3.1): it runs the runtime's communicators for tenants and
    # authenticates them with control's CURVE keys; nothing but the cli imports it
    "provider": {"runtime", "control", "schedule", "topology"},
    "experiments": CORE,  # everything but the cli
    "cli": CORE | {"experiments", "provider", ROOT},  # everything
}
LEAF_MODULES = {"mccl.errors", "mccl.telemetry", "mccl.jitcache"}  # import nothing of mccl; anyone may use them
FORBIDDEN_THIRD_PARTY = {"torch", "zmq"}
ALSO_ALLOWED = {"control": {"zmq"}, "runtime": {"torch"}, "provider": {"torch", "zmq"}, "experiments": {"torch", "zmq"},
                "cli": {"torch", "zmq"}}

# Module-level import cycles that exist today and are being removed; each entry is one strongly connected
# component. Delete an entry once its cycle is gone; never add one.
KNOWN_MODULE_CYCLES: list[set[str]] = []  # none: add one here only with the reason it cannot be broken


@cache
def _modules() -> dict[str, Path]:
    """Every module of src/mccl by dotted name (a package by its ``__init__.py``)."""
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@cache
def _imports(name: str, path: Path) -> frozenset[str]:
    """What ``name`` imports, as written: ``from a.b import c`` is a.b.c when that is a module of mccl, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in _modules() else base)
    return frozenset(names)


def _module_of(name: str) -> str:
    """The mccl module an imported name lives in (``mccl.sim.engine.simulate`` -> ``mccl.sim.engine``)."""
    while name not in _modules():
        name = name.rpartition(".")[0]
    return name


def _package_of(module: str) -> str:
    """``mccl.sim.engine`` -> ``sim``; the leaf modules are their own packages; the root is ``mccl``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


@cache
def _module_graph() -> dict[str, frozenset[str]]:
    graph = {}
    for name, path in _modules().items():
        inside = {_module_of(imported) for imported in _imports(name, path) if imported.split(".")[0] == "mccl"}
        graph[name] = frozenset(inside - {name})
    return graph


def _cycles(graph: dict[str, frozenset[str]] | dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_the_table_names_every_package():
    packages = {_package_of(module) for module in _modules()} - {ROOT} - {m.split(".")[1] for m in LEAF_MODULES}
    assert packages == set(ALLOWED), "a package of src/mccl is missing from DESIGN.md's table (or the table here)"
    for leaf in LEAF_MODULES:
        assert not {m for m in _module_graph()[leaf] if m.startswith("mccl")}, f"{leaf} must import nothing of mccl"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_design(package):
    for name, path in sorted(_modules().items()):
        if _package_of(name) != package:
            continue
        for imported in _imports(name, path):
            root = imported.split(".")[0]
            assert root not in FORBIDDEN_THIRD_PARTY - ALSO_ALLOWED.get(package, set()), f"{path} imports {imported}"
            if root != "mccl" or _module_of(imported) in LEAF_MODULES:
                continue
            target = _package_of(_module_of(imported))
            assert target == package or target in ALLOWED[package], f"{path} imports {imported}"


def test_root_package_imports_only_the_leaf_modules():
    """``mccl/__init__.py`` loads the runtime only on first use of ``mccl.init`` & co. (importlib, not an import)."""
    assert _module_graph()[ROOT] <= LEAF_MODULES


def test_no_cycles_between_packages():
    graph: dict[str, set[str]] = {}
    for module, imported in _module_graph().items():
        graph.setdefault(_package_of(module), set()).update(
            _package_of(other) for other in imported if _package_of(other) != _package_of(module))
    assert _cycles(graph) == []


def test_no_cycles_between_modules():
    cycles = _cycles(_module_graph())
    unexpected = [sorted(cycle) for cycle in cycles if cycle not in KNOWN_MODULE_CYCLES]
    assert unexpected == [], f"module import cycles: {unexpected}"


def test_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(map(sorted, _cycles(graph))) == [["a", "b", "c"], ["d", "e"]]


@pytest.mark.multiprocess  # a fresh interpreter
def test_core_packages_do_not_load_torch_or_zmq():
    code = ("import sys, mccl.topology, mccl.schedule, mccl.synth, mccl.sim;"
            "bad = [m for m in ('torch', 'zmq') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.multiprocess  # a fresh interpreter
def test_control_does_not_load_torch_or_the_runtime():
    code = ("import sys, mccl.control, mccl.cli.main;"
            "bad = [m for m in ('torch', 'mccl.runtime', 'mccl.experiments.demo') if m in sys.modules]; print(bad);"
            "sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
