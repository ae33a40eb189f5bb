"""The α-β model on hand-computed cases."""

import pytest

from mccl.schedule import Collective
from mccl.sim import busbw_factor, evaluate
from mccl.synth.ring import naive_ring
from mccl.topology import degrade, single_switch, switch_ring


def test_four_gpu_ring_on_a_single_switch():
    fabric = single_switch(4, 100)  # 12.5 GB/s per direction, 0.5 µs per link
    ring = naive_ring(fabric, Collective.ALLGATHER)
    size = 400e6  # S: each rank ends with 400 MB, 100 MB per source
    result = evaluate(ring, fabric, size)
    # every link carries 3 blocks of 100 MB at 12.5 GB/s: 24 ms; 3 steps of 2 × 0.5 µs
    assert result.bandwidth_time_s == pytest.approx(3 * 100e6 / 12.5e9)
    assert result.latency_time_s == pytest.approx(3 * 1e-6)
    assert result.algbw_gbs == pytest.approx(size / (0.024 + 3e-6) / 1e9)
    assert result.busbw_gbs == pytest.approx(result.algbw_gbs * 3 / 4)
    assert result.steady_state_algbw_gbs == pytest.approx(4 * 12.5 / 3)


def test_tiny_message_is_latency_only():
    fabric = single_switch(4, 100)
    result = evaluate(naive_ring(fabric, Collective.ALLREDUCE), fabric, 4)
    assert result.latency_time_s == pytest.approx(6 * 1e-6)  # 2(n-1) steps of 1 µs
    assert result.bandwidth_time_s < 1e-9
    with_overhead = evaluate(naive_ring(fabric, Collective.ALLREDUCE), fabric, 4, step_overhead_us=5)
    assert with_overhead.latency_time_s == pytest.approx(6 * 6e-6)


def test_mccs_section5_bus_bandwidth_arithmetic():
    """mccs-summary §5: 8-GPU ring AllReduce with 25 Gbit/s left on one hop ⇒ ≈ 1.8 GB/s."""
    fabric = switch_ring(4, 1, 2, 100)
    loaded = degrade(fabric, ("sw0", "sw1"), gbps=25)  # a 75 Gbit/s background flow on a clockwise link
    ring = naive_ring(loaded, Collective.ALLREDUCE)  # gpu0 … gpu7: clockwise
    result = evaluate(ring, loaded, 512 * 2**20)
    assert result.steady_state_algbw_gbs == pytest.approx(25 / 8 / (2 * 7 / 8))  # 1.786 GB/s
    assert result.algbw_gbs == pytest.approx(1.786, abs=0.01)
    assert [(loaded.links[a].src, loaded.links[a].dst) for a in result.bottleneck_links] == [("sw0", "sw1")]
    healthy = evaluate(naive_ring(fabric, Collective.ALLREDUCE), fabric, 512 * 2**20)
    assert healthy.busbw_gbs == pytest.approx(12.5, rel=1e-3)  # the per-hop rate of a 100 Gbit/s link


def test_busbw_factors():
    assert busbw_factor(Collective.ALLGATHER, 16) == 15 / 16
    assert busbw_factor(Collective.ALLTOALL, 16) == 15 / 16
    assert busbw_factor(Collective.REDUCESCATTER, 8) == 7 / 8
    assert busbw_factor(Collective.ALLREDUCE, 8) == 2 * 7 / 8
