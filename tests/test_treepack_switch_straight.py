"""The straightening's compiled route search (issue 17, 2,048 GPUs under Fail3) finds the Python search's routes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import small_topologies
from mccl.synth.cutbound import CutChecker, max_rate
from mccl.synth.treepack import straighten
from mccl.synth.treepack.fabric import Fabric, fabric_of
from mccl.synth.treepack.rounding import best_integral_rate
from mccl.synth.treepack.switch_removal import remove_switches
from mccl.topology import apply_fault, rail_optimized


def _split(topology):
    fabric = fabric_of(topology, topology.gpus)
    checker = CutChecker(fabric)
    integral = best_integral_rate(fabric, 10, max_rate(fabric, checker=checker).rate_gbps, checker)
    return fabric, remove_switches(fabric, integral.units, integral.k, fabric.groups, straighten=False)


def _straightened_both_ways(fabric: Fabric, logical, monkeypatch) -> tuple[dict, dict]:
    compiled = straighten.straighten_routes(fabric, logical.split_units, logical.routes)
    with monkeypatch.context() as patch:
        patch.setattr(straighten._Residual, "shortest", straighten._Residual.shortest_reference)
        reference = straighten.straighten_routes(fabric, logical.split_units, logical.routes)
    return compiled, reference


@pytest.mark.parametrize("fault", [None, "fail1", "fail2", "fail3"])
def test_hpn_straightened_routes_equal_the_python_search(fault, monkeypatch) -> None:
    """On the 32-GPU rail fabric, healthy and faulted, the straightened routes (pieces and units, in order)
    are the same with the compiled search and with the Python one."""
    topology = rail_optimized(1, 4, 8)
    fabric, logical = _split(apply_fault(topology, fault) if fault else topology)
    compiled, reference = _straightened_both_ways(fabric, logical, monkeypatch)
    assert compiled == reference


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(topology=small_topologies())
def test_random_fabrics_straightened_routes_equal_the_python_search(topology, monkeypatch) -> None:
    fabric, logical = _split(topology)
    compiled, reference = _straightened_both_ways(fabric, logical, monkeypatch)
    assert compiled == reference


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_search_equals_the_python_search_on_random_residuals(data) -> None:
    """Random spare units on the 16-GPU rail fabric's arcs, random pairs and limits: the same route or None,
    searched many times on one residual (the stamps of earlier searches must not leak into later ones)."""
    topology = rail_optimized(1, 2, 8)
    fabric = fabric_of(topology, topology.gpus)
    spare = np.array(data.draw(st.lists(st.integers(-1, 2), min_size=fabric.n_arcs, max_size=fabric.n_arcs)),
                     dtype=np.int64)
    residual = straighten._Residual(fabric, np.zeros(fabric.n_arcs, dtype=np.int64), {})
    residual.spare = spare
    n = fabric.n_ranks
    for _ in range(8):
        source = data.draw(st.integers(0, n - 1))
        target = data.draw(st.integers(0, n - 1).filter(lambda t, s=source: t != s))
        limit = data.draw(st.integers(1, 8))
        assert residual.shortest(source, target, limit) == residual.shortest_reference(source, target, limit)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_vectorized_spread_equals_the_pair_loop(data) -> None:
    """The split's proportional spread as numpy rows: the same plan (pairs in the same order), the same
    units left per rank, on random switches (in/out ranks overlapping, hosts, a switch inside a host)."""
    from mccl.synth.treepack.switch_removal import _spread, _spread_reference

    n = data.draw(st.integers(2, 12))
    groups = np.array(data.draw(st.lists(st.integers(-1, 3), min_size=n + 1, max_size=n + 1)), dtype=np.int64)
    w = n  # the switch
    ins = {u: data.draw(st.integers(0, 40)) for u in data.draw(st.lists(st.integers(0, n - 1), unique=True, min_size=1))}
    outs = {t: data.draw(st.integers(0, 40)) for t in data.draw(st.lists(st.integers(0, n - 1), unique=True, min_size=1))}
    plan, left_in, left_out = _spread(ins, outs, groups, w)
    reference = _spread_reference(ins, outs, groups, w)
    assert list(plan.items()) == list(reference[0].items())
    assert list(left_in.items()) == list(reference[1].items())
    assert list(left_out.items()) == list(reference[2].items())


@pytest.mark.parametrize("fault", [None, "fail3"])
def test_split_with_the_vectorized_spread_keeps_its_routes(fault, monkeypatch) -> None:
    """The whole split on the 32-GPU fabric: the same logical graph and routes as with the pair loop."""
    from mccl.synth.treepack import switch_removal

    topology = rail_optimized(1, 4, 8)
    fabric, logical = _split(apply_fault(topology, fault) if fault else topology)
    monkeypatch.setattr(switch_removal, "_spread", switch_removal._spread_reference)
    _, reference = _split(apply_fault(topology, fault) if fault else topology)
    assert logical.units == reference.units and logical.routes == reference.routes
