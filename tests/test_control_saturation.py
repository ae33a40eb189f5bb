"""The link that slowed a collective, read at its traffic now (mccl.control.saturation; issue 11, Fail1's tie).

Unit tests on a hand-made overlay map: two ranks on one switch, rank 0's egress lost more than the paths
through it show (they ran at half its capacity at the reference), the collective slowed 1.75x."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control.drift import OverlayMap, measured_capacities
from mccl.control.saturation import saturated_reading, traffic_gbps
from mccl.errors import ControllerError

NOMINAL = np.full(4, 2880.0)  # links: 0 r0 -> sw, 1 sw -> r1, 2 r1 -> sw, 3 sw -> r0
LOAD = np.array([1.0, 0.5, 1.0, 1.0])  # chunks' worth of S/n bytes per collective on each link
SIZE = 2e9  # S; S/n = 1e9 bytes = 8 Gbit per unit of load
REFERENCE_S = 8.0 / 1413.0  # link 0 carried 1413 Gbit/s on average at the reference (utilisation 0.49)
NOW_S = 8.0 / 807.0  # and 807 now: the collective slowed 1.75x


def _map() -> OverlayMap:
    """Overlay 1 (0 -> 1) covers links 0, 1; overlay 2 (1 -> 0) covers links 2, 3; intra overlays none."""
    return OverlayMap(2, np.array([0, 0, 2, 4, 4, 4, 4]), np.array([0, 1, 2, 3]))


def _reading(observed: tuple[float, float], base: np.ndarray = NOMINAL):
    inter = np.array([[np.nan, 0.566], [1.0, np.nan]])  # 0 -> 1 slowed; 1 -> 0 did not
    intra = np.full(2, np.nan)
    measured = measured_capacities(_map(), inter, intra, NOMINAL, base_gbps=base)
    return measured, saturated_reading(_map(), inter, intra, measured, base, LOAD, SIZE, observed, 0.2)


def test_the_most_utilised_suspect_of_a_slowed_path_is_read_at_its_traffic_now() -> None:
    measured, reading = _reading((REFERENCE_S, NOW_S))
    assert measured[0] == pytest.approx(1630.08)  # the scale-free reading: base x the path's factor
    assert reading.reason == "" and reading.culprits.tolist() == [0]
    # the larger of its traffic over the collective's time now (807) and by its paths (1413 x 0.566 = 800)
    assert reading.capacities_gbps[0] == pytest.approx(807.0)
    assert reading.capacities_gbps[1] == pytest.approx(measured[1])  # a less utilised suspect keeps its reading
    assert reading.capacities_gbps[2:].tolist() == NOMINAL[2:].tolist()  # exonerated: untouched


def test_nothing_is_read_unless_the_collective_itself_slowed_beyond_gamma() -> None:
    """After a repair the fault's version speeds up while some paths slow by contention: not a lost capacity."""
    measured, reading = _reading((REFERENCE_S, REFERENCE_S * 1.15))
    assert reading.culprits.size == 0 and "did not slow" in reading.reason
    assert reading.capacities_gbps.tolist() == measured.tolist()


def test_rates_not_in_the_topologys_units_are_refused() -> None:
    """A reference traffic above the base capacity cannot be: the samples are in other units (the emulated
    fabric's are 1/20000 of its topology's, so there it is off by config as well)."""
    measured, reading = _reading((REFERENCE_S / 10, NOW_S / 10))
    assert reading.culprits.size == 0 and "units" in reading.reason
    assert reading.capacities_gbps.tolist() == measured.tolist()


def test_reading_never_raises_a_link_above_its_scale_free_reading() -> None:
    """A link the scale-free reading puts below its traffic now keeps the scale-free value (never raised)."""
    base = NOMINAL.copy()
    base[0] = 1200.0  # a version made for a degraded link 0: its reference traffic 1413 ... is above base + Γ
    _, reading = _reading((REFERENCE_S * 1.5, NOW_S * 1.5), base)  # 942 at the reference, 538 now
    assert reading.culprits.tolist() == [0]
    assert reading.capacities_gbps[0] == pytest.approx(min(1200 * 0.566, max(538.0, 942 * 0.566)))


def test_traffic_needs_positive_inputs() -> None:
    assert traffic_gbps(np.array([1.0]), 2e9, 2, 8.0)[0] == pytest.approx(1.0)
    with pytest.raises(ControllerError, match="positive"):
        traffic_gbps(np.array([1.0]), 2e9, 2, 0.0)


def test_a_culprit_that_does_not_pace_the_collective_keeps_its_scale_free_reading() -> None:
    """Its paths slowed far more than the collective (Fail3's NIC ingress beside the NVLink that sets the time):
    its traffic over the collective's time is no estimate of its capacity."""
    inter = np.array([[np.nan, 0.1], [1.0, np.nan]])
    intra = np.full(2, np.nan)
    measured = measured_capacities(_map(), inter, intra, NOMINAL)
    reading = saturated_reading(_map(), inter, intra, measured, NOMINAL, LOAD, SIZE, (REFERENCE_S, NOW_S), 0.2)
    assert reading.culprits.size == 0 and "slowed as much" in reading.reason
    assert reading.capacities_gbps.tolist() == measured.tolist()
