"""The compiled warm start (numba) against its Python/numpy references, tree for tree and transfer for transfer.

:func:`mccl.synth.treepack.regrowkernel.repair_tree` must repair exactly the trees the Python
:class:`~mccl.synth.treepack.regrow.Regrower` does (same kept rows, same new edges and routes, same
depths), :func:`~mccl.synth.treepack.lowerkernel.lower_warm` must write exactly the transfers and copy
claims :func:`~mccl.synth.treepack.forest.lower_rows` does, plus the link load ``link_load`` computes;
the one-pass scans of :mod:`~mccl.synth.treepack.warmscan` must answer what the numpy expressions
they replace answer. Each synthesis below runs both engines at every warm step and compares.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import small_topologies
from mccl.schedule import Schedule, Transfers, link_load, validate
from mccl.synth.treepack import pipeline, synthesize, synthesize_reducescatter
from mccl.synth.treepack.forest import lower_rows
from mccl.synth.treepack.warm import _misfit, kept_fraction_of_rows
from mccl.topology import Topology, fabric_view, fail1, fail2, fail3, rail_optimized

FIELDS = ("k", "rows", "row_chunk", "new_tail", "new_head", "new_chunk", "new_route_offsets", "new_route_links",
          "depth", "kept_chunks", "repaired_chunks")
COLUMNS = ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links")


@contextmanager
def both_engines() -> Iterator[dict[str, int]]:
    """Patch the pipeline so every warm packing and lowering runs compiled and in Python, and compare."""
    seen = {"packings": 0, "repaired": 0, "lowerings": 0}
    warm_pack, lower_warm = pipeline.warm_pack, pipeline.lower_warm

    def packing(*args, **kwargs):
        reference = warm_pack(*args, compiled=False, **kwargs)
        compiled = warm_pack(*args, compiled=True, **kwargs)
        assert (reference is None) == (compiled is None)
        if compiled is not None:
            for name in FIELDS:
                assert np.array_equal(getattr(reference, name), getattr(compiled, name)), name
            seen["packings"] += 1
            seen["repaired"] += compiled.repaired_chunks
            forest = args[0]
            new_root = compiled.new_chunk // compiled.k
            assert kept_fraction_of_rows(forest, len(compiled.rows), new_root, compiled.new_tail,
                                         compiled.new_head) == _kept_fraction_numpy(forest, compiled)
        return compiled

    def lowering(*args):
        reference, reference_origin = lower_rows(*args[:-1])
        schedule, origin, load = lower_warm(*args)
        for name in COLUMNS:
            assert np.array_equal(getattr(reference.transfers, name), getattr(schedule.transfers, name)), name
        assert np.array_equal(reference.chunks.source, schedule.chunks.source)
        assert (reference_origin is None) == (origin is None)
        if origin is not None:
            assert origin.previous is reference_origin.previous
            assert np.array_equal(origin.source, reference_origin.source)
        assert np.array_equal(load, link_load(reference, args[-1]))  # bit for bit: the same sums in the same order
        # What the lowering told the transfers' link_sums (the load, the crossings) is what they would compute.
        remembered = schedule.transfers.__dict__["_link_sums"]
        assert [(weight is schedule.chunks.fraction, links) for weight, links, _ in remembered] == [
            (True, args[-1]), (False, args[-1])]
        assert np.array_equal(schedule.transfers.link_sums(schedule.chunks.fraction, args[-1]), load)
        assert np.array_equal(schedule.transfers.link_sums(None, args[-1]),
                              reference.transfers.link_sums(None, args[-1]))
        seen["lowerings"] += 1
        return schedule, origin, load

    with mock.patch.object(pipeline, "warm_pack", packing), mock.patch.object(pipeline, "lower_warm", lowering):
        yield seen


def _kept_fraction_numpy(forest, packing) -> float:
    """The statistic as the numpy version computed it (``isin`` over (root, tail, head) keys)."""
    n = forest.n
    new_root = packing.new_chunk // packing.k
    total = len(packing.rows) + len(new_root)
    if len(new_root) == 0:
        return 1.0 if total else 0.0
    row_root = forest.root[forest.row_chunk]
    mask = np.isin(row_root, np.unique(new_root))
    previous = (row_root[mask] * n + forest.tail[mask].astype(np.int64)) * n + forest.head[mask]
    fresh = (new_root * n + packing.new_tail) * n + packing.new_head
    return (len(packing.rows) + int(np.isin(fresh, previous).sum())) / total


@pytest.mark.parametrize("fault", [fail1, fail2, fail3], ids=["Fail1", "Fail2", "Fail3"])
def test_compiled_repair_equals_python_on_paper_faults(fault) -> None:
    healthy = rail_optimized(1, 4, 8)
    faulted = fault(healthy)
    with both_engines() as seen:
        for synth in (synthesize, synthesize_reducescatter):
            previous = synth(healthy).schedule
            warm = synth(faulted, previous=previous)
            validate(warm.schedule, faulted)
            again = synth(faulted, previous=warm.schedule, latency_aware=True)
            validate(again.schedule, faulted)
    assert seen["packings"] >= 2 and seen["repaired"] > 0 and seen["lowerings"] == seen["packings"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_topologies(), st.data())
def test_compiled_repair_equals_python_on_random_fabrics(topology: Topology, data: st.DataObject) -> None:
    """Random small fabrics, random per-direction slow-downs, both collectives, any tree count."""
    factors = data.draw(st.lists(st.sampled_from([1.0, 1.0, 0.9, 0.5, 0.25, 0.1, 2.0]),
                                 min_size=len(topology.links), max_size=len(topology.links)))
    degraded = topology.with_capacities(topology.capacities_gbps * np.array(factors))
    chunks = data.draw(st.integers(1, 10))
    latency_aware = data.draw(st.booleans())
    with both_engines():
        for synth in (synthesize, synthesize_reducescatter):
            previous = synth(topology, chunks=data.draw(st.integers(1, 10))).schedule
            warm = synth(degraded, previous=previous, chunks=chunks, latency_aware=latency_aware)
            validate(warm.schedule, degraded)


def _misfit_numpy(previous, topology: Topology) -> str | None:
    """The route fit check as numpy computed it before the compiled scan (the reference)."""
    transfers = previous.transfers
    links = transfers.route_links.astype(np.int64)
    if len(links) == 0 or links.min() < 0 or links.max() >= len(topology.links):
        return "its routes use links that this topology does not have"
    view = fabric_view(topology, previous.ranks)
    link_src, link_dst = view.link_src, view.link_dst
    first, last = transfers.route_offsets[:-1], transfers.route_offsets[1:] - 1
    if np.any(link_src[links[first]] != transfers.sender):
        return "a route does not start at its sender's GPU"
    if np.any(link_dst[links[last]] != transfers.receiver):
        return "a route does not end at its receiver's GPU"
    inner = np.ones(len(links), dtype=bool)
    inner[last] = False
    positions = np.flatnonzero(inner)
    if np.any(link_dst[links[positions]] != link_src[links[positions + 1]]):
        return "a route is not contiguous on this topology"
    if np.any(view.is_gpu_position(link_dst[links[positions]])):
        return "a route passes through a GPU of this topology"
    return None


def test_route_fit_check_names_what_the_numpy_check_named() -> None:
    """Routes broken at random places (one or two links replaced by any id, also a foreign one): the
    compiled check gives the numpy check's reason every time, and passes the intact schedule."""
    topology = rail_optimized(1, 2, 4)
    schedule = synthesize(topology).schedule
    transfers = schedule.transfers
    assert _misfit(schedule, topology) is None is _misfit_numpy(schedule, topology)
    rng = np.random.default_rng(7)
    reasons = set()
    for _ in range(60):
        links = transfers.route_links.copy()
        for position in rng.integers(0, len(links), size=rng.integers(1, 3)):
            links[position] = rng.integers(0, len(topology.links) + 1)
        broken = Schedule(schedule.collective, schedule.ranks, schedule.chunks, Transfers(
            transfers.chunk, transfers.sender, transfers.receiver, transfers.step, transfers.op,
            transfers.route_offsets, links))
        expected = _misfit_numpy(broken, topology)
        assert _misfit(broken, topology) == expected
        reasons.add(expected)
    assert len(reasons - {None}) >= 3  # the draws broke routes in several ways
