"""The port-rate rule of one receive window, on synthetic arrival times (no ranks, no clock):
:func:`mccl.runtime.windows.port_rate`."""

import pytest

from mccl.runtime.windows import Arrival, port_rate

PACE = 0.027  # one 64 KiB message per 27 ms: 64 KiB at ~19.4 Mbit/s
SIZE = 65536


def _train(peer, times, size=SIZE, counted=None):
    return [Arrival(peer, size, t, None if counted is None else counted[i]) for i, t in enumerate(times)]


def test_a_sender_that_waits_for_its_own_input_leaves_idle_time_that_is_not_counted_as_busy():
    # the PXN AllToAll's rail peer: one message, a 30 ms wait for the data it forwards, then four back to back
    arrivals = _train(4, [0.0, 0.030 + PACE, 0.030 + 2 * PACE, 0.030 + 3 * PACE, 0.030 + 4 * PACE])
    rate = port_rate(arrivals)
    assert rate.idle_s == pytest.approx(0.030)
    assert sum(rate.per_peer.values()) / rate.seconds == pytest.approx(SIZE / PACE)
    # the dispersion alone (no gap rule) reads the wait as a slow link: 4 messages over 138 ms
    plain = port_rate(arrivals, gap_factor=0.0)
    assert sum(plain.per_peer.values()) / plain.seconds == pytest.approx(4 * SIZE / (0.030 + 4 * PACE))


def test_a_gap_of_one_sender_is_not_idle_while_another_sender_is_transferring():
    gapped = _train(4, [0.0, 0.030 + PACE, 0.030 + 2 * PACE, 0.030 + 3 * PACE, 0.030 + 4 * PACE])
    other = _train(5, [0.0, 0.031, 0.061])  # messages from 5 arrive across the whole of 4's wait
    rate = port_rate(gapped + other)
    assert rate.idle_s == pytest.approx(0.0)


def test_too_few_intervals_per_sender_leave_the_dispersion_as_it_is():
    arrivals = _train(4, [0.0, 0.050, 0.077])  # 2 intervals (< 3): no median to judge a gap by
    rate = port_rate(arrivals)
    assert rate.idle_s == 0.0 and rate.seconds == pytest.approx(0.077)
    assert port_rate(_train(4, [0.0])) is None  # one known arrival: no rate
    assert port_rate([Arrival(4, SIZE, None), Arrival(4, SIZE, 1.0)]) is None


def test_the_counter_s_readings_take_idle_time_out_where_the_port_received_nothing():
    # 10 kB per 10 ms while busy (1 MB/s); the port idle from 10 to 30 ms (its sender waited): the sampler's
    # readings in between show it; without them the one 30 ms step carried 10 kB, indistinguishable from a slow port
    arrivals = [Arrival(1, 10_000, 0.010, 10_000), Arrival(1, 10_000, 0.040, 20_000)]
    rate = port_rate(arrivals, base=0, readings=[(0.020, 10_000), (0.030, 10_000)])
    assert rate.idle_s == pytest.approx(0.020)
    assert sum(rate.per_peer.values()) / rate.seconds == pytest.approx(1e6)
    blind = port_rate(arrivals, base=0)
    assert sum(blind.per_peer.values()) / blind.seconds == pytest.approx(10_000 / 0.030)


def test_steps_slower_than_the_port_s_busy_rate_count_as_partly_idle():
    # three arrivals, no readings: a 30 ms step that moved 10 kB next to a 10 ms one that moved 10 kB
    arrivals = [Arrival(1, 10_000, 0.010, 10_000), Arrival(1, 10_000, 0.040, 20_000),
                Arrival(1, 10_000, 0.050, 30_000)]
    rate = port_rate(arrivals, base=0)
    assert rate.idle_s == pytest.approx(0.020)
    assert sum(rate.per_peer.values()) / rate.seconds == pytest.approx(1e6)


def test_the_counter_s_headers_are_scaled_back_to_payload():
    # the counter moves 1514 bytes per 1448 of payload (Ethernet, IP, TCP headers): the rate is in payload bytes
    per_message = 10_000 * 1514 / 1448
    arrivals = [Arrival(1, 10_000, 0.010 * (k + 1), round(per_message * (k + 1))) for k in range(4)]
    rate = port_rate(arrivals, base=0)
    assert sum(rate.per_peer.values()) / rate.seconds == pytest.approx(10_000 / 0.010, rel=1e-3)


def test_a_counter_that_also_counts_other_traffic_is_not_trusted():
    # the NIC grew by 10x this window's receives (a NIC shared with other ranks): back to arrival times
    arrivals = [Arrival(1, 10_000, 0.010 * (k + 1), 100_000 * (k + 1)) for k in range(3)]
    rate = port_rate(arrivals, base=0)
    assert sum(rate.per_peer.values()) / rate.seconds == pytest.approx(20_000 / 0.020)


def test_a_sender_with_arrivals_of_unknown_time_is_not_judged_by_its_known_intervals():
    # every other arrival found done (the executor waited elsewhere): known intervals carry two messages each
    arrivals = [Arrival(4, SIZE, k * 2 * PACE if k % 2 == 0 else None, noticed=k * PACE + 0.001)
                for k in range(8)]
    arrivals += [Arrival(4, SIZE, 0.5 * PACE + 8 * PACE)]
    rate = port_rate(arrivals)
    assert rate.idle_s == 0.0


def test_an_underfed_port_reads_its_rate_where_it_ran_at_it_not_the_window_s_average():
    # 1 MB/s port; its senders' uplinks each carry a second flow, so for 60 ms it gets 0.5 MB/s, and only for
    # 20 ms its full rate (the healthy AllGather on the emulated fabric): the port's rate is 1 MB/s, not 0.6
    points = [0.0, 0.010, 0.020, 0.030, 0.040, 0.050, 0.060, 0.070, 0.080]
    moved = [5_000, 5_000, 10_000, 10_000, 5_000, 5_000, 5_000, 5_000]
    counter = [0]
    for step in moved:
        counter.append(counter[-1] + step)
    arrivals = [Arrival(1, 5_000, points[0], counter[0]), Arrival(2, counter[-1], points[-1], counter[-1])]
    readings = list(zip(points[1:-1], counter[1:-1], strict=True))
    rate = port_rate(arrivals, base=-5_000, readings=readings)  # the first 5 kB arrived before the first arrival
    assert sum(rate.per_peer.values()) / rate.seconds == pytest.approx(1e6)
    assert rate.idle_s == pytest.approx(0.080 - counter[-1] / 1e6)


def test_the_wire_share_charges_the_acks_of_own_sends_to_the_port_s_time_not_its_capacity():
    # the counter moves 1514 B per 1448 of payload, plus 66 B ACKs of this rank's own sends (here 5 % more):
    # the window's payload ÷ growth reads the port below its goodput; the wire share does not
    per_message = 10_000 * 1514 / 1448 * 1.05
    arrivals = [Arrival(1, 10_000, 0.010 * (k + 1), round(per_message * (k + 1))) for k in range(4)]
    own = port_rate(arrivals, base=0)
    shared = port_rate(arrivals, base=0, wire_share=1448 / 1514)
    assert sum(own.per_peer.values()) / own.seconds == pytest.approx(10_000 / 0.010, rel=1e-3)
    assert sum(shared.per_peer.values()) / shared.seconds == pytest.approx(1.05 * 10_000 / 0.010, rel=1e-3)
