"""Shared fixtures and strategies: the builders' fabrics, random small topologies, a running provider service."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from mccl.topology import Node, NodeKind, Topology, rail_optimized, single_switch, spine_leaf, switch_ring

# The suite (CI, the README's command) draws a fixed sequence of examples, so that a red run
# means a regression, not an unlucky draw. HYPOTHESIS_PROFILE=explore draws fresh, more
# numerous examples when hunting bugs; what it finds becomes a fixed @example.
settings.register_profile("default", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, max_examples=300, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A ``slow`` test counts as ``multiprocess`` too: ``pytest -m "not multiprocess"`` is the one fast loop
    (README.md), ``-m slow`` or ``-m "multiprocess and not slow"`` pick the two kinds apart."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("multiprocess"):
            item.add_marker(pytest.mark.multiprocess)


@pytest.fixture(scope="session")
def hpn() -> Topology:
    return rail_optimized(1, 2, 8)


BUILDER_CASES = [
    rail_optimized(1, 2, 8),
    rail_optimized(2, 2, 4),
    rail_optimized(1, 3, 2, aggregation_switches=1),
    spine_leaf(2, 2, 2, 2, 100, 50),
    spine_leaf(3, 1, 1, 1, 100, 100),
    switch_ring(4, 1, 2, 100),
    switch_ring(2, 2, 1, 40),
    single_switch(4, 100),
]


@st.composite
def small_topologies(draw: st.DrawFn) -> Topology:
    """2–6 GPUs and 0–3 switches, random extra links, a cable ring through all nodes
    so that every GPU reaches every other; capacities 1–1000 Gbit/s."""
    n_gpus = draw(st.integers(2, 6))
    n_switches = draw(st.integers(0, 3))
    nodes = [Node(f"g{i}", NodeKind.GPU, host=f"h{draw(st.integers(0, 2))}", rail=i % 2,
                  rack=f"r{draw(st.integers(0, 1))}") for i in range(n_gpus)]
    nodes += [Node(f"s{i}", NodeKind.SWITCH) for i in range(n_switches)]
    names = [node.id for node in nodes]
    order = draw(st.permutations(names))
    capacity = st.floats(1.0, 1000.0, allow_nan=False)
    latency = st.floats(0.0, 2.0, allow_nan=False)
    edges = []
    for a, b in zip(order, order[1:] + order[:1], strict=False):
        if a != b:
            cap, lat = draw(capacity), draw(latency)
            edges += [(a, b, cap, lat), (b, a, cap, lat)]
    extra = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names), capacity, latency), max_size=8))
    edges += [(a, b, cap, lat) for a, b, cap, lat in extra if a != b]
    return Topology.from_edges("random", nodes, edges)


@contextmanager
def provider_service(**config: Any) -> Iterator[Any]:
    """A provider service (:mod:`mccl.provider`) on an in-process store for tenants alice and bob, with
    ``ServiceConfig(**config)``; their secret as ``service.test_secret``; stopped on exit."""
    import torch.distributed as dist

    from mccl.control.auth import new_secret
    from mccl.provider.service import ProviderService, ServiceConfig

    secret = new_secret()
    service = ProviderService(store=dist.HashStore(), secret=secret, tenants=["alice", "bob"],
                              config=ServiceConfig(**config)).start()
    service.test_secret = secret
    try:
        yield service
    finally:
        service.stop()


WORLD_ONE_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8")
"""The dtypes the world-1 copy tests run (torch names; conftest does not import torch)."""


def dtype_values(dtype: Any, count: int, seed: int) -> Any:
    """``count`` reproducible values of ``dtype`` (a torch dtype), inf and -0.0 first for floating dtypes: inputs
    whose results must come out bit-equal whichever way a collective ran."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        values = torch.randn(count, generator=generator, dtype=torch.float64) * 100
        values[0], values[1] = float("inf"), -0.0
        return values.to(dtype)
    low = 0 if dtype is torch.uint8 else -100
    return torch.randint(low, 100, (count,), generator=generator, dtype=torch.int64).to(dtype)
