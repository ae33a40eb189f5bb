"""Phase 2 splits the least units the cut condition needs (:mod:`.slackcap`; issue 17, 2,048 GPUs under Fail3).

The reference for every verdict is the former check, one OR-Tools max-flow per rank
(:func:`~.packcheck.packing_ok_by_flows`), not the rooted cut the module itself uses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import small_topologies
from mccl.synth import optimize
from mccl.synth.cutbound import CutChecker, max_rate
from mccl.synth.treepack import slackcap, switch_removal
from mccl.synth.treepack.fabric import fabric_of
from mccl.synth.treepack.packcheck import packing_ok_by_flows
from mccl.synth.treepack.rounding import best_integral_rate
from mccl.synth.treepack.switch_removal import remove_switches
from mccl.topology import apply_fault, rail_optimized


def _rounded(topology):
    fabric = fabric_of(topology, topology.gpus)
    checker = CutChecker(fabric)
    return fabric, best_integral_rate(fabric, 10, max_rate(fabric, checker=checker).rate_gbps, checker)


def _physical_ok(fabric, units: np.ndarray, k) -> bool:
    live = units > 0
    return packing_ok_by_flows(fabric.n_nodes, fabric.n_ranks, fabric.tail[live], fabric.head[live], units[live], k)


def _logical_ok(logical, k) -> bool:
    keys = list(logical.units)
    tail = np.array([u for u, _ in keys], dtype=np.int64)
    head = np.array([v for _, v in keys], dtype=np.int64)
    caps = np.array([logical.units[key] for key in keys], dtype=np.int64)
    return packing_ok_by_flows(logical.n_ranks, logical.n_ranks, tail, head, caps, k)


def _link_load(fabric, logical) -> np.ndarray:
    arc_of_link = {int(link): arc for arc, link in enumerate(fabric.link)}
    load = np.zeros(fabric.n_arcs, dtype=np.int64)
    for pieces in logical.routes.values():
        for route, count in pieces:
            for link in route:
                load[arc_of_link[link]] += count
    return load


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=small_topologies())
def test_least_units_keep_the_cut_condition_on_random_fabrics(topology) -> None:
    """Never above the given units, one value per capacity class (protected cut links aside: at most two values),
    and the condition holds (max-flow per rank) whenever it held before; unchanged when it did not."""
    fabric, integral = _rounded(topology)
    least = slackcap.least_units(fabric, integral.units, integral.k)
    assert (least <= integral.units).all() and (least >= 0).all()
    for value in np.unique(integral.units):
        assert len(np.unique(least[integral.units == value])) <= 2
    if _physical_ok(fabric, integral.units, integral.k):
        assert _physical_ok(fabric, least, integral.k)
    else:
        assert np.array_equal(least, integral.units)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(topology=small_topologies())
def test_random_fabrics_split_the_least_units_at_the_same_k(topology, monkeypatch) -> None:
    """Random fabrics (one-way links included): the split keeps k and its logical graph packs (max-flow per rank)
    exactly when the split without the scaled trial does; its routes stay within the rounding's units."""
    fabric, integral = _rounded(topology)
    new = remove_switches(fabric, integral.units, integral.k, fabric.groups)
    with monkeypatch.context() as patch:
        patch.setattr(switch_removal, "least_units", lambda fabric, units, k: units)
        old = remove_switches(fabric, integral.units, integral.k, fabric.groups)
    assert new.careful == old.careful
    if not new.careful:
        assert _logical_ok(new, integral.k) and _logical_ok(old, integral.k)
    assert (_link_load(fabric, new) <= integral.units).all()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["fail1", "fail3"])
def test_slack_faults_split_far_fewer_arcs_with_the_same_throughput(fault, monkeypatch) -> None:
    """The 64-GPU rail fabric under Fail1 / Fail3 (links with ~3–20× the units the trees use): fewer logical arcs
    and route pieces than the split capped at Σ k, the logical graph packs k trees per rank (max-flow per rank),
    routes are simple and within the units, and the synthesis achieves the same throughput."""
    topology = apply_fault(rail_optimized(1, 8, 8), fault)
    fabric, integral = _rounded(topology)
    assert int(integral.units.max()) > fabric.n_ranks * integral.k  # the fault leaves slack
    new = remove_switches(fabric, integral.units, integral.k, fabric.groups)
    achieved = optimize(topology, "allgather").achieved_gbs
    monkeypatch.setattr(switch_removal, "least_units", lambda fabric, units, k: units)
    old = remove_switches(fabric, integral.units, integral.k, fabric.groups)
    assert not new.careful and not old.careful
    assert len(new.units) < 0.6 * len(old.units)
    assert sum(map(len, new.routes.values())) < sum(map(len, old.routes.values()))
    assert _logical_ok(new, integral.k)
    assert (_link_load(fabric, new) <= integral.units).all()
    link_tail = {int(link): int(t) for link, t in zip(fabric.link, fabric.tail, strict=True)}
    link_head = {int(link): int(h) for link, h in zip(fabric.link, fabric.head, strict=True)}
    for (u, v), pieces in new.routes.items():
        for route, _ in pieces:
            nodes = [link_tail[route[0]]] + [link_head[link] for link in route]
            assert nodes[0] == u and nodes[-1] == v and len(set(nodes)) == len(nodes)
    assert optimize(topology, "allgather").achieved_gbs == pytest.approx(achieved, rel=1e-12)


def test_healthy_fabric_split_is_unchanged(monkeypatch) -> None:
    """No link above Σ k on a healthy fabric: the scaled trial is not tried and the split is the former one."""
    fabric, integral = _rounded(rail_optimized(1, 8, 8))
    assert int(integral.units.max()) <= fabric.n_ranks * integral.k
    called = []
    monkeypatch.setattr(switch_removal, "least_units", lambda fabric, units, k: called.append(1) or units)
    remove_switches(fabric, integral.units, integral.k, fabric.groups)
    assert not called
