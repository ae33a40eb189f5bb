"""The rail hierarchy adapted to a fault (:mod:`mccl.synth.treepack.railadapt`): valid, shallow, near the bound."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import small_topologies
from mccl.errors import MCCLError
from mccl.schedule import validate
from mccl.synth import allgather_cut_bound
from mccl.synth.common import describe_on
from mccl.synth.treepack.depth import ADAPTED_FILL_WEIGHT, FILL_WEIGHT, HIERARCHY_FILL_WEIGHT, fill_weight
from mccl.synth.treepack.hierarchical import hierarchical_allgather
from mccl.synth.treepack.railadapt import rail_adapted_allgather
from mccl.topology import apply_fault, rail_optimized


def _edges(schedule):
    transfers = schedule.transfers
    return sorted(zip(transfers.chunk.tolist(), transfers.sender.tolist(), transfers.receiver.tolist(),
                      transfers.step.tolist(), strict=True))


@pytest.mark.parametrize("shape", [(1, 2, 8), (2, 2, 4)], ids=["2x8", "2seg"])
def test_healthy_fabric_gives_the_rail_trees(shape):
    topology = rail_optimized(*shape)
    adapted = rail_adapted_allgather(topology, topology.gpus)
    validate(adapted, topology)
    assert _edges(adapted) == _edges(hierarchical_allgather(topology, topology.gpus, "rail"))


@pytest.mark.parametrize(("shape", "fault", "floor"), [
    ((1, 2, 8), "fail1", 0.999), ((1, 2, 8), "fail2", 0.98), ((1, 2, 8), "fail3", 0.999),
    ((2, 2, 4), "fail1", 0.95), ((2, 2, 4), "fail2", 0.95), ((2, 2, 4), "fail3", 0.95)])
def test_faults_are_routed_around_at_bounded_depth(shape, fault, floor):
    """Under every fault the adapted trees reach (near) the cut bound where the rail trees do not."""
    topology = apply_fault(rail_optimized(*shape), fault)
    adapted = describe_on(rail_adapted_allgather(topology, topology.gpus), topology)
    validate(adapted, topology)
    assert adapted.transfers.n_steps <= 5
    assert len(adapted.chunks.fraction) == len(topology.gpus)  # one tree per source: whole buffers
    bound = allgather_cut_bound(topology).algbw_gbs
    rail = describe_on(hierarchical_allgather(topology, topology.gpus, "rail"), topology)
    assert adapted.meta.achieved_gbs >= floor * bound
    assert adapted.meta.achieved_gbs > rail.meta.achieved_gbs
    assert np.all(adapted.transfers.route_lengths <= 4)


def test_a_subset_of_ranks_and_the_fill_weight_of_a_hierarchy():
    topology = apply_fault(rail_optimized(1, 3, 4), "fail2")
    ranks = ["gpu0", "gpu1", "gpu2", "gpu5", "gpu6", "gpu8"]
    adapted = rail_adapted_allgather(topology, ranks)
    validate(adapted, topology)
    assert fill_weight(adapted) == ADAPTED_FILL_WEIGHT
    assert fill_weight(hierarchical_allgather(topology, ranks, "host-rail")) == HIERARCHY_FILL_WEIGHT
    with pytest.raises(MCCLError, match="at least 2 ranks"):
        rail_adapted_allgather(topology, ["gpu0"])
    assert FILL_WEIGHT < ADAPTED_FILL_WEIGHT < HIERARCHY_FILL_WEIGHT


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=small_topologies())
def test_random_fabrics_validate_or_refuse_clearly(topology):
    try:
        schedule = rail_adapted_allgather(topology, topology.gpus)
    except MCCLError:
        return
    validate(schedule, topology)
