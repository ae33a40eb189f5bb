"""Phase 1's cut check with most ranks proven without a max-flow (cutproof.violated_cut as max_rate's
``find_violated``) finds the optimum and the saturated cut the plain check finds, with fewer max-flows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import small_topologies
from mccl.synth.cutbound import CutChecker, max_rate
from mccl.synth.treepack.cutproof import violated_cut
from mccl.synth.treepack.fabric import fabric_of
from mccl.topology import Topology, fail1, fail2, fail3, rail_optimized


def _both(topology: Topology, hint_sides=()) -> tuple:
    fabric = fabric_of(topology, tuple(node.id for node in topology.nodes if node.is_gpu))
    plain = max_rate(fabric, hint_sides=hint_sides, checker=CutChecker(fabric))
    proven = max_rate(fabric, hint_sides=hint_sides, checker=CutChecker(fabric), find_violated=violated_cut)
    return plain, proven


def _same(plain, proven) -> None:
    assert proven.rate_gbps == plain.rate_gbps and proven.rounds == plain.rounds
    assert np.array_equal(proven.cut_side, plain.cut_side) and np.array_equal(proven.cut_arcs, plain.cut_arcs)
    assert proven.max_flows <= plain.max_flows


@pytest.mark.parametrize("fault", [None, fail1, fail2, fail3], ids=["healthy", "fail1", "fail2", "fail3"])
def test_phase1_with_proofs_equals_the_plain_check_on_rail_fabrics(fault):
    healthy = rail_optimized(1, 4, 8)
    plain, proven = _both(healthy if fault is None else fault(healthy))
    _same(plain, proven)
    if fault in (fail1, fail3):  # the rule proves ranks here (32 -> 5 and 2 max-flows): not a vacuous comparison
        assert proven.max_flows < plain.max_flows // 4


def test_phase1_with_proofs_and_a_warm_hint():
    """A warm start's hint (the healthy bottleneck cut) under Fail2: two rounds, the same answer."""
    healthy = rail_optimized(1, 4, 8)
    fabric = fabric_of(healthy, tuple(node.id for node in healthy.nodes if node.is_gpu))
    hint = max_rate(fabric, checker=CutChecker(fabric)).cut_side
    _same(*_both(fail2(healthy), hint_sides=(hint,)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_topologies())
def test_phase1_with_proofs_equals_the_plain_check_on_random_fabrics(topology):
    _same(*_both(topology))
