"""Swap back when the fabric recovers (issue 15, :mod:`mccl.control.opportunity`).

The emulated fabric's situation on the per-path rate model: ``rail_optimized(1, 2, 4)`` (the demo's 8 ranks on
2 hosts), rank 0's NIC halved both ways, then restored. The AllGather made for the fault loads that NIC
lightly and its cut lies elsewhere, so the drift test never flags it after the repair: before the check it ran
on at 0.896 of the healthy rate (seed 0). With it, the lightly loaded paths through the repaired NIC show the
repair, and the healthy schedule is issued back.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from mccl.control import ControlConfig
from mccl.control.observed import CollectiveClock
from mccl.control.opportunity import (
    Opportunities,
    healthy_observed_faster,
    nics_alike,
    port_links,
    port_recovered,
    recovered_links,
)
from mccl.errors import ControllerError
from mccl.experiments.closedloop_fluid import run_fluid_loop
from mccl.experiments.closedloop_sim import TelemetryModel
from mccl.experiments.demo import synth_options
from mccl.experiments.loop_scenarios import fault_changes
from mccl.schedule import Collective
from mccl.sim.analytic import evaluate
from mccl.synth import optimize
from mccl.topology import degrade, rail_optimized

GPU0_NIC = (16, 17)  # gpu0 -> tor0.0 and back on rail_optimized(1, 2, 4)


def _nic_fault_loop(kind: str, seed: int = 0, gamma: float = 0.3):
    fabric = rail_optimized(1, 2, 4)
    faulted = fabric
    for link in GPU0_NIC:
        assert fabric.links[link].gbps == 400.0 and "gpu0" in (fabric.links[link].src, fabric.links[link].dst)
        faulted = degrade(faulted, link, factor=0.5)
    options = synth_options(4)
    schedule = optimize(fabric, kind, options=options.get(Collective(kind))).schedule
    size = (256 << 10) * 8
    healthy_s, degraded_s = evaluate(schedule, fabric, size).time_s, evaluate(schedule, faulted, size).time_s
    gap = 3 * healthy_s
    start = 8 * (healthy_s + gap)
    end = start + 16 * (degraded_s + gap)
    until = end + 16 * (healthy_s + gap)
    config = ControlConfig(alpha=0.15, gamma=gamma, warmup=3, settle_collectives=3, synth_options=options)
    loop = run_fluid_loop(fabric, schedule, size, changes=fault_changes(fabric, faulted, start, end), until_s=until,
                          gap_s=gap, config=config, model=TelemetryModel(seed=seed), synthesis_delay_s=0,
                          job=f"nic-{kind}")
    loop.check()

    def late_median(first: float, last: float) -> float:  # the second half of a window: after any swap settled
        values = [run.algbw_gbs for run in loop.runs if run.start_s >= first and run.end_s <= last]
        return statistics.median(values[len(values) // 2:])

    return loop, late_median(0.0, start), late_median(end, until), end


def test_the_allgather_made_for_a_nic_fault_is_swapped_back_to_the_healthy_rate_after_the_repair():
    loop, healthy, restored, end = _nic_fault_loop("allgather")
    assert len(loop.swaps) == 2  # one per fabric change
    assert loop.swaps[1].time_s > end  # the second after the repair
    assert restored == pytest.approx(healthy, rel=0.05)  # was 0.896 of healthy without the opportunity check
    flags = [item.event for item in loop.events_of("flagged")]
    assert "opportunity" in flags[-1].text and "back to nominal" in flags[-1].text
    issued = [item.event for item in loop.events_of("issued")]
    assert "the healthy schedule, observed faster" in issued[-1].text
    # detection: at most 10 collectives after the repair
    assert sum(1 for run in loop.runs if end <= run.end_s <= loop.events_of("flagged")[-1].time_s) <= 10


def test_recovered_links_needs_a_degraded_base_and_a_clear_recovery():
    nominal = np.array([400.0, 400.0, 2880.0])
    measured = np.array([400.0, 380.0, 2880.0])
    assert len(recovered_links(None, measured, nominal, 0.2)) == 0  # a healthy version: nothing to recover
    assert recovered_links(np.array([200.0, 200.0, 2880.0]), measured, nominal, 0.2).tolist() == [0, 1]
    # a base within Γ of nominal is not "believed degraded"; a gain within Γ is not "clearly faster"
    assert len(recovered_links(np.array([350.0, 400.0, 2880.0]), measured, nominal, 0.2)) == 0
    assert len(recovered_links(np.array([200.0, 200.0, 2880.0]), np.array([230.0, 235.0, 2880.0]), nominal,
                               0.2)) == 0
    with pytest.raises(ControllerError, match="do not match"):
        recovered_links(np.ones(2), measured, nominal, 0.2)


def test_a_judged_recovery_is_not_reopened_but_a_new_link_is():
    fabric = rail_optimized(1, 2, 4)
    result = optimize(fabric, "allgather")
    opportunities = Opportunities(0.2)
    opportunities.remember("job", result.schedule, result)
    opportunities.remember("job", result.schedule.with_meta(version=5), None)  # the first one stays the healthy one
    healthy = opportunities.healthy_result("job", Collective.ALLGATHER)
    assert healthy.schedule is result.schedule and healthy.origin is None
    nominal = fabric.capacities_gbps
    base = nominal.copy()
    base[list(GPU0_NIC)] = 200.0
    measured = base.copy()
    measured[16] = 400.0
    found = opportunities.find("job", Collective.ALLGATHER, 1, base, measured, nominal)
    assert found.links == (16,) and found.ratio == pytest.approx(2.0) and not found.back_to_nominal
    opportunities.judged("job", Collective.ALLGATHER, 1, found)
    assert opportunities.find("job", Collective.ALLGATHER, 1, base, measured, nominal) is None
    measured[17] = 400.0
    again = opportunities.find("job", Collective.ALLGATHER, 1, base, measured, nominal)
    assert again.links == (16, 17) and again.back_to_nominal
    assert opportunities.find("job", Collective.ALLGATHER, 2, base, measured, nominal) is not None  # a new version
    with pytest.raises(ControllerError, match="positive gamma"):
        Opportunities(0.0)


def test_back_to_nominal_the_healthy_schedules_observed_time_decides():
    clock = CollectiveClock(alpha=1.0, keep=3)
    for seq in (1, 2, 3):
        for _ in range(2):
            clock.add("allgather", 1, seq, 1.0, n_ranks=2)  # the healthy version 1: 1 s per collective
    assert healthy_observed_faster(clock, Collective.ALLGATHER, 1, (1.3, 1.2), 0.01) is True  # active 1.2 s now
    assert healthy_observed_faster(clock, Collective.ALLGATHER, 1, (1.3, 1.005), 0.01) is False  # within tolerance
    assert healthy_observed_faster(clock, Collective.ALLGATHER, 7, (1.3, 1.2), 0.01) is None  # never observed
    assert healthy_observed_faster(clock, Collective.ALLGATHER, 1, None, 0.01) is None  # no times for the active


def test_the_swap_back_comes_within_three_collectives_of_the_repair_on_the_nics_evidence():
    """The receiving NICs' pooled rate (``portlevel``) reads the repair at once; the path EWMA took 4–5
    collectives here (AllGather seeds 0–2, before the NIC evidence) and 4–8 samples of a path on the emulated
    fabric, where the swap back did not come within the 12 restored collectives in four of six runs."""
    loop, healthy, restored, end = _nic_fault_loop("alltoall", seed=0)
    assert len(loop.swaps) == 2 and loop.swaps[1].time_s > end
    flag = loop.events_of("flagged")[-1]
    assert "the NICs of rank 0" in flag.event.text and "rank 4" in flag.event.text
    assert "back to nominal" in flag.event.text
    assert sum(1 for run in loop.runs if end <= run.end_s <= flag.time_s) <= 3
    assert restored == pytest.approx(healthy, rel=0.05)


def _port_windows(ewma, rng, seq: int, port_rate: float, seconds: float = 0.2, split: bool = False) -> None:
    """One collective's window into rank 0's NIC from ranks 4–7: shares as uneven as TCP's without fair queueing
    (a path's sample is its share of the window), the window's sum the port's rate."""
    shares = rng.dirichlet(np.full(4, 2.0))  # CV ~0.4 per path, as measured on the emulated fabric
    overlay = np.array([sender * 8 + 0 for sender in (4, 5, 6, 7)])
    gbps = port_rate * shares
    parts = [slice(0, 2), slice(2, 4)] if split else [slice(0, 4)]
    for part in parts:  # a window whose samples arrive in two batches
        ewma.update_arrays(overlay[part], gbps[part], np.full(len(gbps[part]), seq), np.full(len(gbps[part]), seconds))


def test_a_nics_pooled_rate_is_steady_where_its_paths_shares_are_noisy_and_doubles_with_a_repair():
    from mccl.control.ewma import OverlayEWMA

    rng = np.random.default_rng(3)
    ewma = OverlayEWMA(8, 0.15, warmup=3)
    hosts = np.array([0] * 4 + [1] * 4)
    ewma.track_ports(hosts[:, None] != hosts[None, :])
    for seq in range(1, 4):  # the reference window, at the fault's 10 Mbit/s
        _port_windows(ewma, rng, seq, 10.0, split=seq == 2)
    path_max, port = [], []
    for seq in range(4, 16):  # the fault goes on
        _port_windows(ewma, rng, seq, 10.0, split=seq % 3 == 0)
        path_max.append(np.nanmax(ewma.factors()[0][4:, 0]))
        port.append(ewma.ports.factors()[0])
    assert np.isnan(port[0])  # one collective after the window: the recent part needs two
    assert np.max(port[1:]) == pytest.approx(1.0, abs=1e-9) == np.min(port[1:])  # the port's own rate: no noise
    assert max(path_max) > 1.05  # what one path's share does meanwhile
    _port_windows(ewma, rng, 16, 20.0, seconds=0.1)  # repaired: twice the rate, the same bytes in half the time
    assert ewma.ports.factors()[0] == pytest.approx(4 / 3)  # pooled with the last collective of the fault
    _port_windows(ewma, rng, 17, 20.0, seconds=0.1)
    assert ewma.ports.factors()[0] == pytest.approx(2.0)
    assert np.all(np.isnan(ewma.ports.factors()[1:]))  # no cross-host samples into ranks 1–7
    ewma.reset()
    assert np.all(np.isnan(ewma.ports.factors()))


def test_port_links_are_the_links_every_route_into_a_nic_crosses():
    """The demo's AllToAll made for gpu0's halved NIC: cross-host traffic into a rank comes from its rail peer
    only, so rank 0's NIC stands for its downlink and gpu4's uplink, rank 4's for the reverse."""
    fabric = rail_optimized(1, 2, 4)
    faulted = degrade(degrade(fabric, GPU0_NIC[0], factor=0.5), GPU0_NIC[1], factor=0.5)
    options = synth_options(4)
    schedule = optimize(faulted, "alltoall", options=options.get(Collective.ALLTOALL)).schedule
    links = port_links([schedule], fabric)
    assert links[0].tolist() == [17, 24] and links[4].tolist() == [16, 25]
    for rank in range(8):  # each is on every cross-host route into that rank
        for x in np.flatnonzero((schedule.transfers.receiver == rank) & ((schedule.transfers.sender < 4) != (rank < 4))):
            route = schedule.transfers.route_links[schedule.transfers.route_offsets[x]:schedule.transfers.route_offsets[x + 1]]
            assert set(links[rank].tolist()) <= set(route.tolist())


def test_the_nics_evidence_is_taken_only_where_it_completes_the_topology_back_to_nominal():
    fabric = rail_optimized(1, 2, 4)
    nominal = fabric.capacities_gbps
    base = nominal.copy()
    base[list(GPU0_NIC)] = 200.0
    measured = base.copy()  # the path EWMA sees nothing yet
    opportunities = Opportunities(0.3)
    covered = [np.zeros(0, dtype=np.int64)] * 8
    covered[0] = np.array([17, 24])
    factors = np.full(8, np.nan)
    factors[0] = 1.98
    ports = port_recovered(factors, covered, base, nominal, 0.3)
    assert ports[0].tolist() == [17] and ports[1] == ((0, 1.98),)
    # gpu0's uplink (16) is on no NIC's routes: a partial recovery is left to the path EWMA ...
    assert opportunities.find("job", Collective.ALLGATHER, 2, base, measured, nominal, ports) is None
    # ... unless every NIC now reads like the others: then the fabric counts as back to nominal
    alike = opportunities.find("job", Collective.ALLGATHER, 2, base, measured, nominal, ports, nics_alike=True)
    assert alike.links == (17,) and alike.back_to_nominal and alike.nics_alike
    assert "every NIC reads within gamma of the others" in alike.text()
    assert opportunities.find("job", Collective.ALLGATHER, 2, base, measured, nominal, None, nics_alike=True) is None
    measured[16] = 400.0  # ... which then reads the uplink back: with the NIC's evidence, back to nominal
    found = opportunities.find("job", Collective.ALLGATHER, 2, base, measured, nominal, ports)
    assert found.links == GPU0_NIC and found.back_to_nominal and found.ports == ((0, 1.98),)
    assert "the NIC of rank 0 read 1.98x" in found.text()
    factors[0] = 1.25  # within Γ: no evidence
    assert len(port_recovered(factors, covered, base, nominal, 0.3)[0]) == 0
    assert len(port_recovered(factors, covered, None, nominal, 0.3)[0]) == 0  # a healthy version


def test_nics_alike_needs_every_nic_that_routes_reach_within_gamma_of_their_median():
    covered = [np.array([17])] * 4 + [np.zeros(0, dtype=np.int64)] * 4  # ranks 4-7: no cross-host route reaches them
    rates = np.array([19.1, 18.8, 19.3, 19.0, np.nan, np.nan, np.nan, np.nan])
    assert nics_alike(rates, covered, 0.3)
    rates[2] = 9.5  # one NIC still at half its peers' rate: the fault is not over
    assert not nics_alike(rates, covered, 0.3)
    assert nics_alike(rates, covered, 0.3) is False
    rates[2] = np.nan  # a NIC that routes reach but that has no recent rate: not known
    assert nics_alike(rates, covered, 0.3) is None
    assert nics_alike(np.array([19.0]), [np.array([17])], 0.3) is None  # one NIC: nothing to compare with


def test_while_a_nic_reads_slow_a_path_alone_does_not_reopen_links_no_nic_speaks_for():
    """Measured on the emulated fabric (seventh session): during the fault, one noisy path through an NVLink the
    fault's base held at 0.7 of nominal opened the path-EWMA opportunity; the re-synthesis it issued landed after
    the repair and was never swapped back. While a NIC still reads slow, such links are held."""
    fabric = rail_optimized(1, 2, 4)
    nominal = fabric.capacities_gbps
    base = nominal.copy()
    base[[8, 16, 17]] = [2000.0, 200.0, 200.0]  # gpu4's NVLink egress blamed by noise at the fault's flag
    measured = base.copy()
    measured[8] = 2880.0  # a noisy path through it reads > 1 + gamma
    opportunities = Opportunities(0.3)
    none = np.zeros(0, dtype=np.int64)
    covered = [np.array([17, 24]), none, none, none, np.array([16, 25]), none, none, none]
    hold = np.setdiff1d(np.arange(len(nominal)), np.concatenate(covered))
    assert opportunities.find("job", Collective.ALLTOALL, 2, base, measured, nominal, hold=hold) is None
    assert opportunities.find("job", Collective.ALLTOALL, 2, base, measured, nominal).links == (8,)  # as before
    measured[16] = 400.0  # a NIC link, which the hold does not cover, still opens it
    assert opportunities.find("job", Collective.ALLTOALL, 2, base, measured, nominal, hold=hold).links == (16,)
