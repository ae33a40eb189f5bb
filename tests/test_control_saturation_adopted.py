"""Which reading a re-synthesis is made for (mccl.control.saturation.adopted; issue 11, eighth session).

The reading of a culprit at its traffic is a lower bound on its capacity, exact for a link busy the whole collective;
so on the read fabric the active schedule is predicted no faster than observed, and exactly as fast only when every
culprit read was busy the whole collective. Before, a reading was adopted only where the scale-free fabric already
explained the slowdown within Γ; at a flag where it read r 0.796 (flow loop, Fail1 AllGather, seed 11) the exact
reading (r 1.000) was dropped, the schedule made for the scale-free fabric ran slower on the true one, the guard kept
v0 and the fault was never swapped. The uniform halving's readings overstate (r 1.12–1.15) and stay refused.
A predictor as the guard's seam: 1 ms × the largest nominal / capacity ratio, so r is set by the capacities alone."""

from __future__ import annotations

import numpy as np

from mccl.control import ControlConfig
from mccl.control.guard import Guard
from mccl.control.saturation import SaturatedReading, adopted
from mccl.schedule import Collective, Schedule
from mccl.synth import optimize
from mccl.topology import Topology, rail_optimized

TOPOLOGY = rail_optimized(1, 2, 4)
NOMINAL = TOPOLOGY.capacities_gbps
CONFIG = ControlConfig(gamma=0.2, absolute_rates=True)
OBSERVED = (1e-3, 2e-3)  # the active collective: 1 ms at its reference, 2 ms now


def _predict(schedule: Schedule, topology: Topology, size_bytes: float) -> float:
    return 1e-3 * float(np.max(NOMINAL / topology.capacities_gbps))


def _adopted(scale_free_slowdown: float, read_slowdown: float) -> tuple[bool, str]:
    """Whether the reading is adopted when the scale-free fabric predicts ``scale_free_slowdown`` and the read one
    ``read_slowdown`` (the collective was observed 2x slower)."""
    guard = Guard(TOPOLOGY, optimize, predict=_predict, explain_tolerance=CONFIG.gamma)
    schedule = optimize(TOPOLOGY, Collective.ALLGATHER).schedule
    scale_free = NOMINAL / scale_free_slowdown
    read = NOMINAL / read_slowdown
    reading = SaturatedReading(read, np.array([0]), judged=(schedule, 0, 2.0**30, OBSERVED, None))
    capacities, why = adopted(guard, CONFIG, "job", Collective.ALLGATHER, scale_free, reading)
    return capacities is read, why


def test_an_exact_reading_is_adopted_where_the_scale_free_fabric_does_not_explain():
    taken, why = _adopted(1.59, 2.0)  # scale-free r 0.796, read r 1.000
    assert taken, why


def test_a_reading_that_overstates_is_refused_where_the_scale_free_fabric_does_not_explain():
    taken, why = _adopted(1.5, 2.26)  # scale-free r 0.75, read r 1.13 (the uniform halving's)
    assert not taken and "does not explain" in why


def test_where_the_scale_free_fabric_explains_a_better_reading_within_gamma_is_adopted_as_before():
    assert _adopted(1.8, 2.1)[0]  # r 0.90 scale-free, 1.05 read
    assert not _adopted(1.98, 2.04)[0]  # r 0.99 and 1.02: explains no better
