"""The driver protocol in-process (no process group): programs are prepared once per size and cached
with the binding, the binding knows no driver, and private torch names stay in torch_private.py.

Results against torch's own collectives are checked by the multi-process tests
(test_runtime_collectives.py); these only guard the structure, with a transport whose
operations complete at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from mccl.runtime import executor  # noqa: E402
from mccl.runtime.drivers import DRIVERS  # noqa: E402
from mccl.runtime.plan import build_plan  # noqa: E402
from mccl.synth.direct import direct_alltoall  # noqa: E402
from mccl.synth.ring import naive_ring  # noqa: E402
from mccl.topology import single_switch  # noqa: E402

RUNTIME = Path(__file__).resolve().parents[1] / "src" / "mccl" / "runtime"
# private torch names the runtime needs (see torch_private.py); none may appear anywhere else
TORCH_PRIVATE_NAMES = {"_start_coalescing", "_end_coalescing", "_allgather_base", "_reduce_scatter_base",
                       "_get_backend_name", "_get_default_store", "_create_work_from_future", "_plugins"}


class _Done:
    completed_at = None

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Instant:
    """A gloo-like transport of ``size`` ranks whose every operation has completed already."""

    backend = "gloo"
    dependency_driven = True

    def __init__(self, size: int, rank: int) -> None:
        self.size, self.rank = size, rank
        self.posted = 0

    def post(self, op) -> _Done:
        self.posted += 1
        return _Done()

    def post_group(self, ops) -> list[_Done]:
        return [self.post(op) for op in ops]

    def wait(self, work, peer) -> None:  # (Transport.wait: the drivers wait through the transport)
        work.wait()

    def native_all_to_all(self, output, input, output_split_sizes, input_split_sizes) -> None:
        self.posted += 1


def test_every_driver_has_the_protocol_shape():
    assert set(DRIVERS) == {"eager", "exchange", "stepwise"}
    for name, driver in DRIVERS.items():
        assert driver.name == name and isinstance(driver.gloo_only, bool)
        assert callable(driver.prepare) and callable(driver.run)
    assert not DRIVERS["stepwise"].gloo_only  # NCCL runs the stepwise driver


@pytest.mark.parametrize("driver", sorted(DRIVERS))
@pytest.mark.parametrize("collective", ["allgather", "alltoall"])
def test_program_prepared_once_per_size_and_cached_with_the_binding(monkeypatch, driver, collective):
    n = 4
    topology = single_switch(n, 100)
    schedule = direct_alltoall(topology) if collective == "alltoall" else naive_ring(topology, "allgather")
    plan = build_plan(schedule, 1)
    runner = DRIVERS[driver]
    prepared = []
    original = runner.prepare

    def counting(*args):
        prepared.append(args)
        return original(*args)

    monkeypatch.setattr(runner, "prepare", counting)
    cache: dict = {}
    transport = _Instant(n, 1)

    def call(per_rank: int) -> None:
        if collective == "alltoall":
            buffers = executor.all_to_all_buffers(plan, torch.empty(per_rank * n), torch.ones(per_rank * n), None, None,
                                                  cache=cache)
        else:
            buffers = executor.all_gather_buffers(plan, torch.empty(per_rank * n), torch.ones(per_rank))
        executor.execute(transport, plan, buffers, seq=1, layout_cache=cache, driver=driver)

    for per_rank in (64, 64, 64, 96, 96):
        call(per_rank)
    assert len(prepared) == 2  # one program per block sizes
    bounds = [value for value in cache.values() if isinstance(value, executor.Bound)]
    assert len(bounds) == 2 and all(set(bound.programs) == {driver} for bound in bounds)
    assert transport.posted > 0


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_binding_imports_no_driver():
    imported = _imports(RUNTIME / "binding.py")
    assert not any(name.startswith(("mccl.runtime.drivers", "mccl.runtime.executor")) for name in imported), imported


def _identifiers(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.FunctionDef):
        return [node.name]
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
        return [part for part in node.module.split(".") if part.startswith("_")] + [alias.name for alias in node.names]
    return []


def test_private_torch_names_only_in_torch_private():
    for path in RUNTIME.rglob("*.py"):
        if path.name == "torch_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            private = [name for name in _identifiers(node)
                       if name in TORCH_PRIVATE_NAMES or (isinstance(node, ast.ImportFrom) and name.startswith("_"))]
            assert not private, f"{path.name}:{node.lineno}: private torch {private} outside torch_private.py"
