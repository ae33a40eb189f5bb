"""The cut-bound loop (mccl.synth.cutbound) and its max-flow engines (mccl.synth.maxflow).

As networkx's flow tests do across its ``flow_func`` implementations: every engine must give
the same max-flow value and the same (minimal sink side) minimum cut, the cut's capacity must
equal the flow, and the Dinkelbach loop must reach the same AllGather optimum with either
engine, on the builders (healthy and under the paper's faults) and on random small fabrics,
where it is also checked against brute force over every node set.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import BUILDER_CASES, small_topologies
from mccl.synth import allgather_cut_bound
from mccl.synth.cutbound import max_rate
from mccl.synth.maxflow import ortools_max_flow, scipy_max_flow
from mccl.topology import Topology, fabric_view, fail1, fail2, fail3, rail_optimized

ENGINES = {"ortools": ortools_max_flow, "scipy": scipy_max_flow}

FAULTED = [fault(rail_optimized(1, 2, 8)) for fault in (fail1, fail2, fail3)] + \
          [fault(rail_optimized(1, 4, 8)) for fault in (fail1, fail2, fail3)]


def _brute_force_rate(topology: Topology, ranks: list[str]) -> float:
    """min over node sets S holding some but not all ranks of cap_in(S) / |ranks outside S|."""
    view = fabric_view(topology, ranks)
    n, best = view.n_ranks, float("inf")
    for mask in itertools.product([False, True], repeat=view.n_nodes):
        side = np.array(mask)
        inside = int(side[:n].sum())
        if 0 < inside < n:
            entering = side[view.head] & ~side[view.tail]
            best = min(best, float(view.gbps[entering].sum()) / (n - inside))
    return best


@pytest.mark.parametrize("topology", BUILDER_CASES + FAULTED, ids=lambda t: t.name)
def test_engines_agree_on_the_builders(topology: Topology) -> None:
    bounds = {name: allgather_cut_bound(topology, max_flow=engine) for name, engine in ENGINES.items()}
    assert bounds["scipy"].rate_gbps == pytest.approx(bounds["ortools"].rate_gbps, rel=1e-9)
    # The reported cut attains the rate: cap_in(S) / |ranks outside S| == rate.
    for bound in bounds.values():
        outside = sum(gpu not in bound.cut_nodes for gpu in topology.gpus)
        cut = sum(topology.links[link].gbps for link in bound.cut_links)
        assert cut / outside == pytest.approx(bound.rate_gbps, rel=1e-12)


@given(small_topologies(), st.data())
@settings(max_examples=60, deadline=None)
def test_engines_agree_with_brute_force_on_random_fabrics(topology: Topology, data: st.DataObject) -> None:
    gpus = list(topology.gpus)
    ranks = data.draw(st.permutations(gpus))[: data.draw(st.integers(2, len(gpus)))]
    view = fabric_view(topology, ranks)
    if view.disconnected_pair() is not None:
        return  # the bound is 0 there; the loop is not asked
    expected = _brute_force_rate(topology, ranks)
    for engine in ENGINES.values():
        assert max_rate(view, max_flow=engine).rate_gbps == pytest.approx(expected, rel=1e-9)


@given(small_topologies(), st.integers(0, 2**20))
@settings(max_examples=60, deadline=None)
def test_max_flow_engines_give_the_same_flow_and_minimum_cut(topology: Topology, seed: int) -> None:
    view = fabric_view(topology)
    rng = np.random.default_rng(seed)
    capacity = rng.integers(0, 1000, size=view.n_arcs)
    source, sink = (int(node) for node in rng.choice(view.n_ranks, size=2, replace=False))
    results = []
    for engine in ENGINES.values():
        net = engine(view.n_nodes)
        arcs = net.add_arcs(view.tail, view.head, np.zeros(view.n_arcs, dtype=np.int64))
        net.set_capacities(arcs, capacity)  # capacities changed in place, as the loop does
        value = net.max_flow(source, sink)
        side = net.sink_side()
        assert side[sink] and not side[source]
        entering = side[view.head] & ~side[view.tail]
        assert int(capacity[entering].sum()) == value  # max-flow = min-cut
        results.append((value, side.tolist()))
    assert results[0] == results[1]
