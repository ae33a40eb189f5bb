"""Ring baselines on the paper's fabrics, against the AllGather cut bound."""

import random

import pytest

from mccl.schedule import Collective, validate
from mccl.sim import evaluate
from mccl.synth import allgather_cut_bound
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import (
    cross_rack_flows,
    cross_rack_ratio,
    locality_order,
    locality_ring,
    naive_ring,
    nccl_ring,
    nccl_ring_orders,
)
from mccl.topology import NodeKind, fail2, rail_optimized, spine_leaf


def test_cut_bound_matches_the_closed_form(hpn):
    bound = allgather_cut_bound(hpn)
    assert bound.algbw_gbs == pytest.approx(437.333333, rel=1e-6)  # 16 · (2880 + 400) / 15 / 8
    assert bound.algbw_gbs * 15 / 16 == pytest.approx(410.0)
    assert len(bound.cut_links) == 2  # a single GPU's two in-links


def test_nccl_rings_cross_hosts_only_rail_to_rail(hpn):
    for ring in nccl_ring_orders(hpn, hpn.gpus):
        for a, b in zip(ring, ring[1:] + ring[:1], strict=False):
            na, nb = hpn.node(hpn.gpus[a]), hpn.node(hpn.gpus[b])
            if na.host != nb.host:
                assert na.rail == nb.rail
    schedule = nccl_ring(hpn, Collective.ALLGATHER)
    aggregation_links = [link.id for link in hpn.links if hpn.node(link.dst).kind is NodeKind.AGGREGATION]
    assert not set(aggregation_links) & set(schedule.transfers.route_links.tolist())


def test_nccl_ring_is_within_a_few_percent_of_the_cut_bound(hpn):
    schedule = nccl_ring(hpn, Collective.ALLGATHER)
    validate(schedule, hpn)
    bound = allgather_cut_bound(hpn).algbw_gbs
    assert schedule.meta.achieved_gbs == pytest.approx(16 * 400 / 15)  # 8 channels share 8 NICs of 50 GB/s: 426.67
    assert 0.97 * bound <= schedule.meta.achieved_gbs <= bound


def test_fail2_collapses_the_static_ring_by_8x(hpn):
    ring = nccl_ring(hpn, Collective.ALLGATHER)
    size = 16 * 128 * 2**20
    healthy = evaluate(ring, hpn, size).algbw_gbs
    degraded = evaluate(ring, fail2(hpn), size).algbw_gbs
    assert healthy / degraded == pytest.approx(8.0, rel=0.01)


def test_multi_segment_rings_and_allreduce():
    fabric = rail_optimized(2, 2, 8)
    for collective in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE):
        schedule = nccl_ring(fabric, collective)
        validate(schedule, fabric)
    allreduce = nccl_ring(fabric, Collective.ALLREDUCE)
    allgather = nccl_ring(fabric, Collective.ALLGATHER)
    assert allreduce.meta.achieved_gbs == pytest.approx(allgather.meta.achieved_gbs / 2)


def test_direct_alltoall_reaches_the_nic_bound(hpn):
    # 50 · N / (N − 8) GB/s for N GPUs behind 400 Gbit/s NICs (issue 4's closed form)
    assert direct_alltoall(hpn).meta.achieved_gbs == pytest.approx(100.0)
    assert direct_alltoall(rail_optimized(2, 2, 8)).meta.achieved_gbs == pytest.approx(50 * 32 / 24)
    assert direct_alltoall(fail2(hpn)).meta.achieved_gbs == pytest.approx(12.5)


def test_cross_rack_ratio_against_a_hand_count():
    fabric = spine_leaf(4, 2, 1, 2, 100, 100)  # 4 racks, 2 single-GPU hosts each
    rack_of = {gpu: fabric.node(gpu).rack for gpu in fabric.gpus}
    rng = random.Random(7)
    ranks = list(fabric.gpus)
    rng.shuffle(ranks)  # random placement of ranks on hosts
    hand = sum(rack_of[ranks[i]] != rack_of[ranks[(i + 1) % len(ranks)]] for i in range(len(ranks)))
    assert cross_rack_flows(fabric, ranks, range(len(ranks))) == hand
    order = locality_order(fabric, ranks)
    assert cross_rack_flows(fabric, ranks, order) == 4  # each rack entered exactly once
    assert cross_rack_ratio(fabric, ranks) == pytest.approx(hand / 4)
    assert cross_rack_ratio(fabric, ranks, order) == 1.0


def test_locality_ring_enters_each_rack_once():
    fabric = spine_leaf(2, 2, 2, 2, 100, 50)
    ranks = ["gpu0", "gpu4", "gpu1", "gpu5", "gpu2", "gpu6", "gpu3", "gpu7"]  # racks alternate
    for collective in (Collective.ALLGATHER, Collective.ALLREDUCE):
        local = locality_ring(fabric, collective, ranks)
        naive = naive_ring(fabric, collective, ranks)
        validate(local, fabric)
        assert local.meta.achieved_gbs > naive.meta.achieved_gbs
    assert cross_rack_ratio(fabric, ranks) == 4.0
