"""The tenancy controller (issue 16): locality rings, ECMP / FFA / PFA paths, pinning, the gray-failure loop."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control.tenancy import JobProfile, PathRate, Policy, TenancyController, TenantJob, pin_routes
from mccl.control.tenancy.assign import ffa_assign
from mccl.control.tenancy.flows import job_flows, route_plane
from mccl.control.tenancy.pinning import route_port, schedule_routes
from mccl.errors import ControllerError, InvalidSchedule, TopologyError
from mccl.schedule import validate
from mccl.sim import CollectiveOp, Job, simulate
from mccl.sim.ecmp import PinnedPaths
from mccl.synth.ring import locality_ring
from mccl.topology import spine_leaf

MB = 10**6
INTERLEAVED = ["gpu0", "gpu1", "gpu4", "gpu5", "gpu2", "gpu3", "gpu6", "gpu7"]  # hosts 0, 2, 1, 3


@pytest.fixture(scope="module")
def fabric():
    return spine_leaf(2, 2, 2, 2, 100, 50)  # the MCCS testbed, 2:1


def _spines(fabric, plan):
    """Spine of every cross-rack connection, per direction."""
    found = {}
    for (src, dst), route in plan.routes.items():
        planes = route_plane(fabric, route)
        if planes:
            direction = (fabric.node(src).rack, fabric.node(dst).rack)
            found.setdefault(direction, []).append(planes[0])
    return found


def _algbw(fabric, schedule, size=64 * MB, **job):
    return simulate(fabric, [Job("t", (CollectiveOp(schedule, size),), **job)]).only().algbw_gbs


def test_ffa_spreads_a_jobs_connections_over_the_spines_and_the_simulator_honours_the_pinned_routes(fabric):
    controller = TenancyController(fabric, Policy.FFA)
    plan = controller.register(TenantJob("a", INTERLEAVED, JobProfile(size_bytes=64 * MB)))["a"]
    validate(plan.schedule, fabric)
    assert plan.version == 1 and plan.schedule.meta.version == 1
    assert plan.schedule.meta.synthesizer == "ring.locality"
    for spines in _spines(fabric, plan).values():  # two connections each way, one per spine
        assert sorted(spines) == ["spine0", "spine1"]
    # the policy's path is the transfer's route, and the simulator takes it as scheduled or as pinned
    assert schedule_routes(plan.schedule) == plan.routes
    pinned = _algbw(fabric, plan.schedule)
    via_policy = _algbw(fabric, controller.rings["a"], paths=PinnedPaths.of(plan.routes))
    assert pinned == pytest.approx(via_policy, rel=1e-9)
    assert pinned == pytest.approx(12.5 * 8 * 2 / 8 / (2 * 7 / 8) * 50 / 100, rel=0.01)  # 50 Gbit/s per hop: 7.14


def test_ffa_takes_jobs_in_turn_and_best_fit_on_excess_demand(fabric):
    controller = TenancyController(fabric, Policy.FFA)
    for name, gpus in (("a", ("gpu0", "gpu2", "gpu4", "gpu6")), ("b", ("gpu1", "gpu5")), ("c", ("gpu3", "gpu7"))):
        controller.register(TenantJob(name, gpus))
    load = {}
    for plan in controller.plans.values():
        for direction, spines in _spines(fabric, plan).items():
            for spine in spines:
                load[(direction, spine)] = load.get((direction, spine), 0) + 1
    # three connections each way on two spines: 2 + 1, never 3 + 0
    assert sorted(load.values()) == [1, 1, 2, 2]
    flows = [flow for name, ring in controller.rings.items() for flow in job_flows(name, ring, fabric)]
    chosen, placed = ffa_assign(flows, fabric.capacities_gbps)
    assert len(chosen) == len(flows)
    core = sorted(controller.core_links)
    assert placed[core].max() <= 2 * 50 + 1e-9


def test_pfa_reserves_a_spine_for_the_priority_job(fabric):
    controller = TenancyController(fabric, Policy.PFA)
    controller.register(TenantJob("a", ("gpu0", "gpu2", "gpu4", "gpu6"), priority=1))
    controller.register(TenantJob("b", ("gpu1", "gpu5")))
    controller.register(TenantJob("c", ("gpu3", "gpu7")))
    reserved = controller.plans["b"].reserved
    assert all(plan.reserved == reserved for plan in controller.plans.values())
    assert len(reserved) == 1
    a_spines = {s for spines in _spines(fabric, controller.plans["a"]).values() for s in spines}
    others = {s for name in "bc" for spines in _spines(fabric, controller.plans[name]).values() for s in spines}
    assert a_spines == set(reserved) and not others & a_spines


def test_ecmp_policy_hashes_and_depends_on_the_salt(fabric):
    found = set()
    for salt in range(8):
        controller = TenancyController(fabric, Policy.ECMP, ecmp_salt=str(salt))
        plan = controller.register(TenantJob("a", INTERLEAVED))["a"]
        found.add(tuple(sorted((d, tuple(s)) for d, s in _spines(fabric, plan).items())))
    assert len(found) > 1  # source ports drawn per connection: the salt re-rolls the collisions


def test_registration_errors_are_clear(fabric):
    controller = TenancyController(fabric)
    controller.register(TenantJob("a", ("gpu0", "gpu4")))
    with pytest.raises(ControllerError, match="already placed"):
        controller.register(TenantJob("b", ("gpu0", "gpu5")))
    with pytest.raises(ControllerError, match="already registered"):
        controller.register(TenantJob("a", ("gpu1", "gpu5")))
    with pytest.raises(TopologyError):
        controller.register(TenantJob("c", ("gpu1", "gpu99")))
    with pytest.raises(ControllerError, match="at least 2"):
        TenantJob("d", ("gpu1",))
    with pytest.raises(ControllerError, match="no job"):
        controller.unregister("zz")
    assert set(controller.unregister("a")) == set() and not controller.plans


def test_pinning_rejects_a_broken_route_and_names_ports(fabric):
    ring = locality_ring(fabric, "allreduce", ["gpu0", "gpu4"])
    with pytest.raises(InvalidSchedule, match="does not|leaves|ends"):
        pin_routes(ring, fabric, {("gpu0", "gpu4"): (0,)})
    with pytest.raises(InvalidSchedule, match="outside"):
        pin_routes(ring, fabric, {("gpu0", "gpu9"): (0,)})
    assert route_port(3) == 49152 + 3 * 64 and route_port(3, 5) == 49152 + 3 * 64 + 5
    with pytest.raises(InvalidSchedule):
        route_port(-1)
    with pytest.raises(InvalidSchedule, match="a route has"):
        route_port(0, 64)


def test_a_degraded_spine_link_is_found_and_every_tenant_crossing_it_replanned(fabric):
    controller = TenancyController(fabric, Policy.PFA)
    controller.register(TenantJob("a", ("gpu0", "gpu2", "gpu4", "gpu6"), priority=1))
    controller.register(TenantJob("b", ("gpu1", "gpu5")))
    controller.register(TenantJob("c", ("gpu3", "gpu7")))
    (reserved,) = controller.plans["a"].reserved
    slow = fabric.link_between("leaf0", reserved).id

    def rates(factor):
        out = []
        for name, plan in controller.plans.items():
            for (src, dst), route in plan.routes.items():
                out.append(PathRate(name, src, dst, route, 50.0 * (factor if slow in route else 1.0)))
        return out

    assert controller.observe_paths(rates(1.0)) == set()  # references learned
    found = controller.observe_paths(rates(0.2))
    assert slow in found and controller.capacities[slow] == pytest.approx(10.0)
    changed = controller.replan()
    assert set(changed) == {"a", "b", "c"} and changed["a"].version == controller.plans["a"].version
    assert reserved not in changed["a"].reserved  # the priority job now has the healthy spine
    assert all(slow not in route for route in changed["a"].routes.values())
    assert not controller.replan()  # nothing new: no new versions
    assert np.all(controller.capacities <= fabric.capacities_gbps)


def test_plans_reach_executors_through_the_schedule_manager(fabric):
    from mccl.control import ScheduleManager
    from mccl.schedule import loads_schedule

    manager = ScheduleManager(fabric)
    controller = TenancyController(fabric, Policy.FFA)
    controller.register(TenantJob("a", INTERLEAVED))
    assert controller.publish(manager) == {"a": 1}
    version, text = manager.latest("a", "allreduce")
    assert version == 1 and schedule_routes(loads_schedule(text)) == controller.plans["a"].routes
    controller.ecmp_salt = next(str(s) for s in range(16)  # a salt under which ECMP collides: other routes
                                if TenancyController(fabric, Policy.ECMP, ecmp_salt=str(s)).register(
                                    TenantJob("a", INTERLEAVED))["a"].routes != controller.plans["a"].routes)
    changed = controller.set_policy(Policy.ECMP)  # a strategy change: a newer version, fetched like any re-synthesis
    assert controller.publish(manager, changed) == {"a": 2}
    assert manager.latest("a", "allreduce")[0] == 2
    assert controller.publish(manager, {}) == {}
