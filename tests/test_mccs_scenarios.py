"""The ``mccl sim mccs-*`` scenarios at small sizes: the directions MCCS reports, and the loop beyond it."""

from __future__ import annotations

import pytest

from mccl.experiments.mccs_common import Comparison
from mccl.experiments.mccs_crossrack import cross_rack
from mccl.experiments.mccs_gray import gray_tenants
from mccl.experiments.mccs_single import ring_order
from mccl.experiments.mccs_training import training_mix


def test_comparison_scales():
    assert Comparison("x", 60, 56, "%").within and not Comparison("x", 100, 56, "%").within
    assert Comparison("x", 1.9, 2.0).relative == pytest.approx(0.95)


def test_ring_order_and_flow_assignment_gain_as_mccs_reports():
    report = ring_order(size_bytes=64e6, draws=8)
    by_label = {c.label: c for c in report.comparisons}
    assert all(c.ours > 0 for c in report.comparisons)  # NCCL(OR) beats NCCL; MCCS beats MCCS(-FA)
    detail = {(row[0], row[1]): float(row[2]) for row in report.detail}
    assert detail[("8 GPUs", "MCCS")] == pytest.approx(7.14, rel=0.01)  # every hop at 50 Gbit/s
    assert detail[("4 GPUs", "MCCS")] == pytest.approx(detail[("4 GPUs", "NCCL(OR)")])  # one connection each way
    assert len(by_label) == 3


def test_cross_rack_ratio_reaches_two_for_packed_jobs():
    report = cross_rack(racks=8, job_hosts=(4, 8), placements=60)
    assert report.comparisons[0].ours == pytest.approx(2.0)
    packed = [float(row[2]) for row in report.detail if row[0] == "packed"]
    assert 1.0 < packed[0] < packed[1] < 2.0  # grows with the job


def test_gray_failure_is_replanned_for_every_tenant_and_the_priority_job_recovers():
    report = gray_tenants(64e6, horizon_s=1.2, fault_s=0.4, settle_s=0.3)
    rows = {row[0]: [float(v) for v in row[1:]] for row in report.detail}
    healthy, pfa_static, pfa_loop, ffa_static, ffa_loop = rows["A"]
    assert pfa_static < 0.5 * healthy and pfa_loop == pytest.approx(healthy, rel=0.05)  # the priority recovers
    assert ffa_loop > 2 * ffa_static  # FFA: the slow link's tenants move too, sharing the healthy spine
    worst = {policy: min(rows[job][column] for job in "ABC") for policy, column in (("static", 3), ("loop", 4))}
    assert worst["loop"] > 2 * worst["static"]
    assert any("degraded: leaf0->spine0" in what for _, what in report.events)
    assert sum("PFA: plan v" in what for _, what in report.events) == 3  # A, B and C re-planned under PFA


@pytest.mark.slow
def test_training_mix_time_sharing_learns_windows_and_speeds_up_the_borrower():
    report = training_mix(horizon_s=5.0, warmup_s=2.0, draws=1)
    by_label = {c.label: c.ours for c in report.comparisons}
    assert by_label["PFA vs FFA: A faster"] > 5
    assert by_label["PFA+TS vs PFA: B faster"] > 5
    assert any("idle windows" in what for _, what in report.events)
