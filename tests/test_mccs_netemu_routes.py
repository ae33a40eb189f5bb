"""Route pinning on the kernel-emulated fabric (issue 16, deliverable 3): policy routing by source port.

A routed 2-leaf × 2-spine fabric in network namespaces; the routes FFA chose for two flows are
enforced by the leaves' ``ip rule sport`` tables, seen on the uplinks' ``tc -s`` byte counters,
and two flows pinned apart get ~2× the throughput of two flows ECMP collided onto one spine.
"""

from __future__ import annotations

import pytest

from mccl.control.tenancy.assign import ffa_assign
from mccl.control.tenancy.flows import Flow as PolicyFlow
from mccl.control.tenancy.flows import candidate_routes
from mccl.experiments.netemu.fabric import unsupported_reason
from mccl.experiments.netemu.routes import Flow, RoutedFabric, RoutedSpineLeaf, pinned_port, run_flows
from mccl.experiments.netemu.shaping import FabricError
from mccl.topology import spine_leaf

TOPOLOGY = spine_leaf(2, 2, 1, 2, 200, 100)  # 200 Mbit/s NICs, 100 Mbit/s uplinks at scale 1000: 2:1


def test_routed_plan_from_topology_and_port_of_a_route():
    plan = RoutedSpineLeaf.from_topology(TOPOLOGY, prefix="x-")
    assert (plan.leaves, plan.hosts_per_leaf, plan.spines, plan.host_mbit, plan.uplink_mbit) == (2, 2, 2, 200, 100)
    routes = candidate_routes(TOPOLOGY, "gpu0", "gpu2")
    assert sorted(pinned_port(TOPOLOGY, route) for route in routes) == [49152, 49152 + 64]
    with pytest.raises(FabricError, match="not one spine"):
        pinned_port(TOPOLOGY, candidate_routes(TOPOLOGY, "gpu0", "gpu1")[0])  # same leaf: no spine to pin
    with pytest.raises(FabricError, match="2 equal-cost paths"):
        RoutedSpineLeaf("x-", spines=1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pinned_routes_take_their_uplinks_and_apart_beats_collided():
    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    policy = [PolicyFlow(job, src, dst, 1.0, 200.0, candidate_routes(TOPOLOGY, src, dst))
              for job, src, dst in (("a", "gpu0", "gpu2"), ("b", "gpu1", "gpu3"))]
    chosen, _ = ffa_assign(policy, TOPOLOGY.capacities_gbps)
    routes = [chosen[("a", "gpu0", "gpu2")], chosen[("b", "gpu1", "gpu3")]]
    ports = [pinned_port(TOPOLOGY, route, flow) for flow, route in enumerate(routes)]
    spines = [(port - 49152) // 64 for port in ports]
    assert sorted(spines) == [0, 1]  # FFA put them on different spines
    with RoutedFabric(RoutedSpineLeaf.from_topology(TOPOLOGY)) as fabric:
        before = fabric.uplink_bytes()
        apart = run_flows(fabric, [Flow(0, 2, ports[0]), Flow(1, 3, ports[1])], seconds=1.0)
        after = fabric.uplink_bytes()
        for result, spine in zip(apart, spines, strict=True):
            assert result.port == result.flow.port
            carried = after[(0, spine)] - before[(0, spine)]  # leaf0 -> that spine: this flow only
            assert 0.9 * result.bytes <= carried <= 1.3 * result.bytes
        # the pair ECMP collides: both on the first flow's spine (other ports of its range)
        collided_ports = [pinned_port(TOPOLOGY, routes[0], 10), pinned_port(TOPOLOGY, routes[0], 11)]
        before = fabric.uplink_bytes()
        collided = run_flows(fabric, [Flow(0, 2, collided_ports[0]), Flow(1, 3, collided_ports[1])], seconds=1.0)
        after = fabric.uplink_bytes()
        assert after[(0, 1 - spines[0])] - before[(0, 1 - spines[0])] < 0.02 * sum(r.bytes for r in collided)
    together = sum(result.mbit for result in apart) / sum(result.mbit for result in collided)
    assert together > 1.6, f"pinned apart {[r.mbit for r in apart]} vs collided {[r.mbit for r in collided]} Mbit/s"
