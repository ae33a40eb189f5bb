"""Depth-bounded AllGather trees (host / rail hierarchies) and the choice by estimated time at the job's size."""

import pytest
from hypothesis import HealthCheck, given, settings

from conftest import small_topologies
from mccl.errors import InvalidOptions, MCCLError
from mccl.schedule import validate
from mccl.sim import evaluate
from mccl.synth import optimize
from mccl.synth.common import describe_on
from mccl.synth.treepack.depth import estimate
from mccl.synth.treepack.hierarchical import hierarchical_allgather
from mccl.topology import apply_fault, rail_optimized, single_switch

MiB = 1 << 20


@pytest.mark.parametrize("shape", [(1, 2, 8), (2, 2, 4)], ids=["2x8", "2seg"])
@pytest.mark.parametrize(("hierarchy", "depth"), [("rail", 2), ("host-rail", 3)])
def test_hierarchies_are_valid_shallow_and_near_the_bound_on_hpn(shape, hierarchy, depth):
    topology = rail_optimized(*shape)
    schedule = describe_on(hierarchical_allgather(topology, topology.gpus, hierarchy), topology)
    validate(schedule, topology)
    assert schedule.transfers.n_steps == depth + (shape[0] > 1)  # a hub rail peer per other segment: one level more
    assert schedule.transfers.route_lengths.max() <= 4  # rail ToR (2), or across segments (4); NVSwitch (2)
    packing = optimize(topology, "allgather")
    # a NIC carries (H - 1) buffers each way, the host cut's minimum: within 10 % of the packing's optimum
    assert schedule.meta.achieved_gbs >= 0.9 * packing.achieved_gbs


def test_hierarchy_on_uneven_hosts_and_unlabelled_gpus():
    topology = rail_optimized(1, 3, 4)
    ranks = ["gpu0", "gpu1", "gpu2", "gpu5", "gpu6", "gpu8"]  # host 0: rails 0-2; host 1: 1, 2; host 2: rail 0
    for hierarchy in ("rail", "host-rail"):
        validate(hierarchical_allgather(topology, ranks, hierarchy), topology)
    flat = single_switch(4, 100)  # no host labels: every GPU a host of its own, depth 1 or 2
    validate(hierarchical_allgather(flat, flat.gpus, "rail"), flat)
    with pytest.raises(MCCLError, match="unknown hierarchy"):
        hierarchical_allgather(flat, flat.gpus, "spine")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=small_topologies())
def test_hierarchies_on_random_fabrics_validate_or_refuse_clearly(topology):
    for hierarchy in ("rail", "host-rail"):
        try:
            schedule = hierarchical_allgather(topology, topology.gpus, hierarchy)
        except MCCLError:
            continue
        validate(schedule, topology)


def test_estimate_agrees_with_the_simulators_alpha_beta_terms():
    topology = rail_optimized(1, 2, 8)
    schedule = optimize(topology, "allgather").schedule
    ours = estimate(schedule, topology, 16 * MiB)
    theirs = evaluate(schedule, topology, 16 * MiB)
    assert ours.bandwidth_s == pytest.approx(theirs.bandwidth_time_s, rel=1e-12)
    assert ours.latency_s == pytest.approx(theirs.latency_time_s, rel=1e-12)
    assert ours.time_s > theirs.time_s  # plus the pipeline fill of a 10-deep tree in 3 slices
    assert ours.slices == 3 and ours.depth == schedule.transfers.n_steps


@pytest.mark.parametrize("fault", [None, "fail2"])
def test_choice_by_size(fault):
    topology = rail_optimized(1, 2, 8)
    if fault:
        topology = apply_fault(topology, fault)
    small = optimize(topology, "allgather", method="treepack.depth", size_bytes=float(MiB))
    large = optimize(topology, "allgather", method="treepack.depth", size_bytes=float(1 << 30))
    for result in (small, large):
        validate(result.schedule, topology)
        meta = result.schedule.meta
        estimates = {name: value for name, value in meta.stats if name.startswith("estimate_")}
        adapted = {"estimate_rail_adapted_gbs"} if fault else set()  # healthy: the rail trees themselves, dropped
        assert set(estimates) == {"estimate_packing_gbs", "estimate_latency_aware_gbs", "estimate_rail_gbs",
                                  "estimate_host_rail_gbs"} | adapted
        assert meta.stat("estimated_algbw_gbs") == pytest.approx(max(estimates.values()))
        packing = meta.stat("packing_achieved_gbs")
        assert meta.stat("throughput_traded") == pytest.approx(max(0.0, 1 - result.achieved_gbs / packing))
    shapes = dict(small.schedule.meta.inputs)["shape"], dict(large.schedule.meta.inputs)["shape"]
    if fault is None:  # 1 MiB: latency dominates, the depth-2 trees win; 1 GiB: the optimum's throughput
        assert shapes[0] == "rail" and small.schedule.meta.stat("depth") == 2
        assert shapes[1] in ("packing", "latency_aware")
    else:  # a slow NIC: at 1 MiB the rail trees routed around it (depth 3; flow level 176.0 vs the
        # latency-aware packing's 174.0 GB/s), at 1 GiB the packing's throughput
        assert shapes == ("rail-adapted", "latency_aware")


def test_depth_options_are_checked():
    topology = rail_optimized(1, 1, 4)
    with pytest.raises(InvalidOptions, match="candidates"):
        optimize(topology, "allgather", method="treepack.depth", candidates=("packing", "star"))
    with pytest.raises(InvalidOptions, match="size_bytes"):
        optimize(topology, "allgather", method="treepack.depth", size_bytes=0)
    only = optimize(topology, "allgather", method="treepack.depth", candidates=("rail",))
    assert dict(only.schedule.meta.inputs)["shape"] == "rail"


@pytest.mark.slow  # ~5 s: two packings simulated flow-level
def test_fewer_trees_per_source_when_the_pipeline_fill_costs_more_than_the_rounding():
    """On 1×4×8 Fail2 at 128 MiB the packing's 10 trees a source leave 4 slices a chunk; a candidate with
    fewer trees (more slices to fill each tree's pipeline) is estimated faster, and the flow-level
    simulation (the executor's model) agrees that it is."""
    from mccl.sim import SimOptions, simulate_schedule

    topology = apply_fault(rail_optimized(1, 4, 8), "fail2")
    size = float(128 * MiB)
    chosen = optimize(topology, "allgather", method="treepack.depth", size_bytes=size).schedule
    validate(chosen, topology)
    shape = dict(chosen.meta.inputs)["shape"]
    full = optimize(topology, "allgather").schedule
    assert "-k" in shape and chosen.meta.stat("trees_per_source") < full.meta.stat("trees_per_source")
    estimates = {name: value for name, value in chosen.meta.stats if name.startswith("estimate_")}
    assert f"estimate_{shape.replace('-', '_')}_gbs" in estimates
    assert chosen.meta.stat("estimated_algbw_gbs") == pytest.approx(max(estimates.values()))
    options = SimOptions.executor(keep_chain=False)
    fewer = simulate_schedule(chosen, topology, size, options=options).algbw_gbs
    packing = simulate_schedule(full, topology, size, options=options).algbw_gbs
    assert fewer > packing
