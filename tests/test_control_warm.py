"""The controller's warm-up covers its whole reaction: after :func:`~mccl.control.ahead.warm_synthesis`, a gray
failure's re-synthesis, the flag's validation of it and the way back after the repair compile no numba kernel.

Why it matters: on a fresh clone every kernel a controller first calls compiles on its check thread (seconds
each); one that the warm-up missed compiled during ``mccl demo``'s fault and no drift test ran until it was done
(eleventh session: six kernels, ~18 s, the fault phase ended without a flag). Counted in-process: a numba
dispatcher gains a signature when it compiles or loads one, so the count does not depend on the disk cache."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from numba.core.dispatcher import Dispatcher

from mccl.control import ScheduleManager
from mccl.control.ahead import warm_in_background, warm_synthesis
from mccl.control.prepared import prepare_update
from mccl.experiments.demo import DemoConfig, synth_options
from mccl.schedule import Collective
from mccl.synth import optimize
from mccl.topology import Topology, parse_topology, rail_optimized

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # ~15 s warm (a cold kernel cache compiles first)


def _signatures() -> dict[str, int]:
    """Signatures held by every numba dispatcher of mccl's modules imported so far."""
    held: dict[str, int] = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("mccl"):
            for value in vars(module).values():
                if isinstance(value, Dispatcher):
                    held[f"{value.py_func.__module__}.{value.py_func.__qualname__}"] = len(value.signatures)
    return held


def _slowed(topology: Topology, node: str, factor: float) -> Topology:
    touches = np.array([node in (link.src, link.dst) for link in topology.links])
    return topology.with_capacities(topology.capacities_gbps * np.where(touches, factor, 1.0))


def test_a_fault_and_its_repair_after_the_warm_up_compile_nothing():
    config = DemoConfig()
    topology = parse_topology(config.topology_spec)
    options = synth_options(config.chunks)
    warm_synthesis(topology, list(config.kinds), options)
    before = _signatures()
    # not only the warm-up's own faults: every GPU slowed as a whole (two depths), every single link at 0.4
    faults = [(_slowed(topology, gpu, factor), f"{gpu} × {factor}") for gpu in topology.gpus for factor in (0.7, 0.3)]
    faults += [(topology.with_capacities(topology.capacities_gbps * np.where(np.arange(len(topology.links)) == link.id,
                                                                              0.4, 1.0)), f"{link.src}→{link.dst} × 0.4")
               for link in topology.links]
    compiled: dict[str, tuple[int, int, str]] = {}
    for faulted, what in faults:
        for name in config.kinds:
            chosen = options.get(Collective(name))
            nominal = optimize(topology, name, options=chosen)
            result = optimize(faulted, name, previous=nominal, options=chosen)
            prepare_update(nominal.schedule, result, topology)
            back = optimize(topology, name, previous=result, options=chosen)
            prepare_update(result.schedule, back, topology)
            for kernel, count in _signatures().items():
                if count != before.get(kernel, 0) and kernel not in compiled:
                    compiled[kernel] = (before.get(kernel, 0), count, f"{name}, {what}")
    assert not compiled, f"kernels compiled after the warm-up (signatures before, after, first fault): {compiled}"


def test_the_background_warm_up_reports_its_failure_and_a_large_fabric_warms_on_a_stand_in():
    said: list[str] = []
    warm_in_background(ScheduleManager(rail_optimized(1, 2, 2)), ("allgathr",), say=said.append).join(120)
    assert len(said) == 1 and "not warmed on rail_optimized(1,2,2)" in said[0] and "allgathr" in said[0], said
    large = rail_optimized(1, 9, 8)  # 72 GPUs: its own synthesis would cost the serving controller seconds
    warm_in_background(ScheduleManager(large), ("allgather",), say=said.append).join(120)
    assert len(said) == 2 and said[1].startswith("synthesizers warmed on rail_optimized(1,2,4) in "), said
