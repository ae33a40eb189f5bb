"""A controller's own nominal results adopted for the ranks' registration of the same schedule (issue 15, the
AllToAll flag's synthesis; :mod:`mccl.control.ahead`, "The registered schedule's solver state"): the first
flag then restarts from the solver state, not from the schedule's routes. Real synthesis on the reaction
benchmark's 8-rank fabric."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.ahead import warm_synthesis
from mccl.errors import ControllerError
from mccl.experiments.demo import synth_options
from mccl.schedule import Collective, validate
from mccl.synth import optimize
from mccl.topology import rail_optimized

TOPOLOGY = rail_optimized(1, 2, 4)
OPTIONS = synth_options(2)


def _halved_nic(topology=TOPOLOGY):
    """GPU 0's NIC at half its rate both ways, as the manager measures it (never above nominal)."""
    capacities = topology.capacities_gbps.copy()
    for index, link in enumerate(topology.links):
        if (link.src, link.dst) in (("gpu0", "tor0.0"), ("tor0.0", "gpu0")):
            capacities[index] *= 0.5
    return topology.with_capacities(capacities, name=f"{topology.name}+measured")


def test_a_registered_schedule_the_controller_made_brings_its_solver_state_to_the_flag():
    manager = ScheduleManager(TOPOLOGY, ControlConfig(synth_options=OPTIONS))
    warm_synthesis(TOPOLOGY, ["alltoall"], OPTIONS, adopt=manager.adopt)
    # what a rank registers: its own synthesis of the same schedule, with a version, without the result
    registered = optimize(TOPOLOGY, Collective.ALLTOALL, options=OPTIONS[Collective.ALLTOALL]).schedule.with_meta(
        version=1)
    manager.register("job", registered)
    adopted = manager.active_result("job", Collective.ALLTOALL)
    assert adopted is not None and adopted.schedule is registered and adopted.warm_state is not None

    measured = _halved_nic()
    from_state = optimize(measured, Collective.ALLTOALL, previous=adopted, options=OPTIONS[Collective.ALLTOALL])
    from_routes = optimize(measured, Collective.ALLTOALL, previous=registered, options=OPTIONS[Collective.ALLTOALL])
    for result in (from_state, from_routes):
        validate(result.schedule, measured)
    stats = from_state.schedule.meta
    assert stats.stat("restarted") == 1.0 or stats.stat("repaired") == 1.0
    assert stats.stat("warm_fallback") == 0.0
    assert from_routes.schedule.meta.stat("restarted") == 0.0  # the routes' path, as before
    # the same LP optimum either way (both proven optimal), and a rounded schedule as good as the LP allows
    assert from_state.optimal and from_routes.optimal
    assert np.isclose(stats.stat("lp_gbs"), from_routes.schedule.meta.stat("lp_gbs"), rtol=1e-9)
    assert from_state.achieved_gbs >= from_routes.achieved_gbs * (1 - 0.02)


def test_a_schedule_the_controller_did_not_make_registers_without_a_result():
    manager = ScheduleManager(TOPOLOGY, ControlConfig(synth_options=OPTIONS))
    warm_synthesis(TOPOLOGY, ["alltoall"], OPTIONS, adopt=manager.adopt)
    other = optimize(TOPOLOGY, Collective.ALLTOALL, chunks=1).schedule.with_meta(version=1)  # other routes
    manager.register("job", other)
    assert manager.active_result("job", Collective.ALLTOALL) is None


def test_adopt_refuses_a_result_made_for_another_topology():
    manager = ScheduleManager(TOPOLOGY, ControlConfig(synth_options=OPTIONS))
    elsewhere = optimize(rail_optimized(1, 2, 2), Collective.ALLTOALL)
    with pytest.raises(ControllerError, match=r"rail_optimized\(1,2,2\)"):
        manager.adopt(elsewhere)
