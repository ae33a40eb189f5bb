"""The measurement window of §5.1 and the never-blocking sample buffer (in-process, no ranks)."""

import threading
import time

from mccl.runtime import MemorySink, ScheduleSource, TelemetrySink
from mccl.runtime.sources import LocalScheduleSource
from mccl.runtime.telemetry import Meters, TelemetryBuffer, TelemetryConfig


def _meters(config, same_host=(False, False, True, True)):
    sink = MemorySink()
    buffer = TelemetryBuffer(sink, config)
    return Meters("t", 0, list(same_host), buffer, config), buffer, sink


def test_window_is_the_dispersion_of_arrivals_while_receives_are_in_flight_and_names_the_path_sender_to_receiver():
    config = TelemetryConfig(threshold_inter=2, threshold_intra=2, arrival_waiters=0)
    meters, buffer, sink = _meters(config)
    meters.posted(1, 100, now=0.0)  # one in flight: below the threshold, no window
    meters.completed(1, 100, at=1.0)
    for _ in range(4):
        meters.posted(1, 100, now=2.0)  # the window opens at the second; the sender's start is not in it
    meters.completed(1, 100, at=10.0)  # the first known arrival: the window's start, its bytes not counted
    meters.completed(1, 100, at=10.5)
    meters.completed(1, 100, at=11.0)
    meters.completed(1, 100, at=11.5)  # the last receive in flight: the window closes with it
    buffer.close()
    assert len(sink.samples) == 1
    sample = sink.samples[0]
    # measured by rank 0, the receiver, about the path 1 -> 0
    assert (sample.kind, sample.rank, sample.peer, sample.bytes) == ("inter", 1, 0, 300)
    assert sample.seconds == 1.5


def test_an_arrival_of_unknown_time_counts_up_to_its_notice_and_none_known_falls_back_to_the_posts():
    config = TelemetryConfig(threshold_inter=2, threshold_intra=2, arrival_waiters=0)
    meters, buffer, sink = _meters(config)
    for _ in range(4):
        meters.posted(1, 100, now=0.0)
    meters.completed(1, 100, at=1.0)
    meters.completed(1, 100, at=None, now=5.0)  # found done after the first known arrival: counted, ends by 5.0
    meters.completed(1, 100, at=2.0)
    meters.completed(1, 100, at=3.0)
    meters.posted(2, 50, now=10.0)
    meters.posted(2, 50, now=10.0)
    meters.completed(2, 50, now=10.25)  # no known arrival (one alltoallv): from the second post to the last notice
    meters.completed(2, 50, now=10.5)
    buffer.close()
    inter, intra = sink.samples
    assert (inter.rank, inter.peer, inter.bytes, inter.seconds) == (1, 0, 300, 4.0)
    assert (intra.kind, intra.rank, intra.peer, intra.bytes, intra.seconds) == ("intra", 2, 0, 100, 0.5)


def test_peers_behind_one_port_share_its_window_and_their_samples_add_up_to_the_port_rate():
    config = TelemetryConfig(threshold_inter=2, threshold_intra=2, arrival_waiters=0)
    meters, buffer, sink = _meters(config, same_host=(False, False, False, True, True))
    for peer in (1, 2, 1, 2):
        meters.posted(peer, 100, now=0.0)  # one inter window: the rank's NIC, whoever sends
    meters.posted(3, 10, now=0.0)
    meters.posted(4, 10, now=0.0)  # the intra window: the host fabric
    meters.posted(4, 10, now=0.0)
    meters.completed(1, 100, at=1.0)
    meters.completed(2, 100, at=1.5)
    meters.completed(1, 100, at=2.0)
    meters.completed(2, 100, at=2.5)  # none left: closes; 1.5 s, 100 B from 1 and 200 B from 2
    meters.completed(3, 10, at=1.0)
    meters.completed(4, 10, at=1.25)
    meters.completed(4, 10, at=1.5)
    buffer.close()
    assert sorted((s.kind, s.rank, s.peer, s.bytes, s.seconds) for s in sink.samples) == [
        ("inter", 1, 0, 100, 1.5), ("inter", 2, 0, 200, 1.5), ("intra", 4, 0, 20, 0.5)]


def test_the_nic_counter_read_at_each_arrival_counts_only_what_crossed_the_port_in_the_window():
    """Two transfers through the NIC at once (1 MB/s shared), then one alone: arrival times alone count the
    second concurrent transfer whole after the first arrival (2x the rate); the counter does not."""
    config = TelemetryConfig(threshold_inter=2, arrival_waiters=0)
    meters, buffer, sink = _meters(config, same_host=(False, False, False))
    for peer in (1, 2, 1):
        meters.posted(peer, 10_000, now=0.0)
    meters._windows[0].base = 0  # the counter when the window opened (no NIC is read in this test)
    meters.completed(1, 10_000, at=0.0195, counted=19_500)
    meters.completed(2, 10_000, at=0.0200, counted=20_000)
    meters.completed(1, 10_000, at=0.0300, counted=30_000)
    buffer.close()
    rate = sum(s.bytes for s in sink.samples) / sink.samples[0].seconds
    assert abs(rate - 1e6) < 1e3
    assert sorted((s.rank, s.bytes) for s in sink.samples) == [(1, 10_000), (2, 10_000)]


def test_an_arrival_time_is_known_only_when_the_wait_was_blocked():
    assert Meters.arrival(time.perf_counter()) is None  # returned at once: it had completed before
    began = time.perf_counter()
    time.sleep(0.005)
    assert Meters.arrival(began) >= began + 0.005


def test_full_buffer_drops_and_counts_and_a_failing_sink_is_survived():
    class Slow:
        def __init__(self):
            self.release = threading.Event()

        def submit(self, samples):
            self.release.wait(5)
            raise RuntimeError("sink down")

    config = TelemetryConfig(threshold_inter=1, capacity=3, flush_interval_s=0.001)
    sink = Slow()
    buffer = TelemetryBuffer(sink, config)
    meters = Meters("t", 0, [False, False], buffer, config)
    start = time.perf_counter()
    for _ in range(50):
        meters.posted(1, 8)
        meters.completed(1, 8)
    assert time.perf_counter() - start < 0.5  # never blocked by the stuck sink
    assert buffer.dropped > 0
    sink.release.set()
    buffer.close()
    assert buffer.failed_batches >= 1


def test_local_implementations_satisfy_the_seams():
    assert isinstance(LocalScheduleSource(), ScheduleSource)
    assert isinstance(MemorySink(), TelemetrySink)

