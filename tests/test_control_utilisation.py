"""The attribution with each link's utilisation at the reference (issue 11, :mod:`mccl.control.drift`,
"Utilisation at the reference"): a link that had headroom and now binds its paths is read at the traffic it
carries, ``base · u · f``, not ``base · f``."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.drift import OverlayMap, binding_links, measured_capacities, profile, reference_utilisation
from mccl.errors import ControllerError
from mccl.synth.ring import nccl_ring
from mccl.telemetry import Sample
from mccl.topology import rail_optimized

NOMINAL = np.array([100.0, 100.0, 100.0])


def _two_paths(first: list[int], second: list[int]) -> OverlayMap:
    """Two ranks: path 0 -> 1 (overlay 1) covers ``first``, path 1 -> 0 (overlay 2) covers ``second``."""
    covered = [[], sorted(first), sorted(second), [], [], []]
    offsets = np.cumsum([0] + [len(links) for links in covered])
    return OverlayMap(2, offsets, np.array([link for links in covered for link in links], dtype=np.int64))


def _measure(mapping: OverlayMap, slow: float, utilisation: np.ndarray | None) -> np.ndarray:
    inter = np.array([[np.nan, slow], [1.0, np.nan]])  # 0 -> 1 slowed, 1 -> 0 at its reference
    return measured_capacities(mapping, inter, np.full(2, np.nan), NOMINAL, recovered_factor=1.2,
                               utilisation=utilisation)


def test_a_link_with_headroom_that_alone_explains_a_slowed_path_reads_the_traffic_it_carries():
    mapping = _two_paths([0, 1], [1, 2])  # link 1 is exonerated by 1 -> 0; link 0 alone explains 0 -> 1
    utilisation = np.array([0.4, 1.0, 1.0])
    assert _measure(mapping, 0.5, None).tolist() == [50.0, 100.0, 100.0]  # base x factor: 2.5x too fast
    assert _measure(mapping, 0.5, utilisation) == pytest.approx([20.0, 100.0, 100.0])  # 0.4 x 0.5 x 100
    # a slowdown within noise (above 1 / recovered_factor) is not read as a new bottleneck
    assert _measure(mapping, 0.9, utilisation) == pytest.approx([90.0, 100.0, 100.0])
    # a link the schedule does not load (u = 0) is never "the" binding one: base x factor as before
    assert _measure(mapping, 0.5, np.array([0.0, 1.0, 1.0])).tolist() == [50.0, 100.0, 100.0]


def test_of_two_unexonerated_links_the_one_loaded_closest_to_its_capacity_binds():
    mapping = _two_paths([0, 1], [2])  # nothing exonerates links 0 and 1
    measured = _measure(mapping, 0.5, np.array([0.4, 0.8, 1.0]))
    assert measured == pytest.approx([50.0, 40.0, 100.0])  # link 1 saturates first: 0.8 x 0.5; link 0 as before
    mask = binding_links(mapping, np.array([0.5, 0.5, 1.0]), np.ones(3, dtype=bool), np.array([0.5, 0.5, 1.0]),
                         np.array([0.4, 0.8, 1.0]), 1 / 1.2)
    assert mask.tolist() == [False, True, False]


def test_reference_utilisation_is_one_on_the_bottleneck_and_the_headroom_elsewhere():
    fabric = rail_optimized(1, 2, 4)
    ring = nccl_ring(fabric, "allgather")
    cut = profile(ring, len(fabric.links))
    utilisation = reference_utilisation([cut], fabric.capacities_gbps)
    loaded = cut.links[cut.n > 0]
    assert utilisation[loaded].max() == pytest.approx(1.0)
    unloaded = np.setdiff1d(np.arange(len(fabric.links)), loaded)
    assert np.all(utilisation[unloaded] == 0)
    nvlink = fabric.link_between("gpu0", "nvs0").id
    nic = fabric.link_between("gpu0", "tor0.0").id
    if utilisation[nvlink] > 0 and utilisation[nic] > 0:  # a ring through both: NVLink has 7.2x the NIC's rate
        assert utilisation[nvlink] / utilisation[nic] == pytest.approx(
            (cut.n[np.searchsorted(cut.links, nvlink)] / 2880) / (cut.n[np.searchsorted(cut.links, nic)] / 400))
    with pytest.raises(ControllerError, match="positive"):
        reference_utilisation([cut], np.zeros(len(fabric.links)))


def test_the_manager_reads_a_degraded_link_with_headroom_at_the_rate_it_carries():
    """Through the manager, on the demo's fabric: the ring AllGather needs ~1/7 of gpu0's NVLink egress; every
    path out of gpu0 on its host slows to 0.4 (the egress degraded until it binds), nothing else moves. The
    measured egress is base x u x 0.4, not 0.4 x 2880."""
    fabric = rail_optimized(1, 2, 4)
    ring = nccl_ring(fabric, "allgather")
    manager = ScheduleManager(fabric, ControlConfig(alpha=1.0, gamma=0.2, warmup=2, settle_collectives=1),
                              speculate=None)
    manager.register("job", ring)
    egress = fabric.link_between("gpu0", "nvs0").id
    utilisation = reference_utilisation([profile(ring, len(fabric.links))], fabric.capacities_gbps)
    assert 0 < utilisation[egress] < 0.5
    routes = manager._comms["job"].coverage

    def round_of(seq: int, slow: float) -> list[Sample]:
        out = []
        for overlay in range(8 * 8):
            i, j = divmod(overlay, 8)
            if i == j or len(routes.links_of(overlay)) == 0:
                continue
            same_host = i // 4 == j // 4
            rate = 10.0 * (slow if (i == 0 and same_host and egress in routes.links_of(overlay)) else 1.0)
            out.append(Sample("intra" if same_host else "inter", "job", i, j, int(rate * 1e9 / 8 * 0.01), 0.01,
                              0.0, seq))
        return out

    for seq in range(1, 4):
        manager.ingest(round_of(seq, 1.0))
    for seq in range(4, 7):
        manager.ingest(round_of(seq, 0.4))
    comm = manager._comms["job"]
    measured = manager._measured(comm, comm.ewma)
    assert measured[egress] == pytest.approx(2880 * utilisation[egress] * 0.4, rel=1e-6)  # was 0.4 x 2880 = 1152
    others = np.setdiff1d(np.arange(len(fabric.links)), [egress])
    assert np.allclose(measured[others], fabric.capacities_gbps[others])
