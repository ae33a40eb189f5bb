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


def test_window_is_the_dispersion_of_arrivals_while_saturated_and_names_the_path_sender_to_receiver():
    config = TelemetryConfig(threshold_inter=2, threshold_intra=2)
    meters, buffer, sink = _meters(config)
    meters.posted(1, 100)  # one in flight: below the threshold, no window
    meters.completed(1, 100, at=1.0)
    for _ in range(4):
        meters.posted(1, 100)  # the window opens at the second; the sender's start is not in it
    meters.completed(1, 100, at=10.0)  # the first known arrival: the window's start, its bytes not counted
    meters.completed(1, 100, at=10.5)
    meters.completed(1, 100, at=11.0)  # 1 left in flight: closes, 200 bytes in 1 s
    meters.completed(1, 100, at=11.5)  # tail transient: not measured
    buffer.close()
    assert len(sink.samples) == 1
    sample = sink.samples[0]
    # measured by rank 0, the receiver, about the path 1 -> 0
    assert (sample.kind, sample.rank, sample.peer, sample.bytes) == ("inter", 1, 0, 200)
    assert sample.seconds == 1.0


def test_arrivals_noticed_late_end_the_window_when_noticed_and_none_known_falls_back_to_the_posts():
    config = TelemetryConfig(threshold_inter=2, threshold_intra=2)
    meters, buffer, sink = _meters(config)
    for _ in range(3):
        meters.posted(1, 100)
    start = time.perf_counter()
    meters.completed(1, 100, at=start)
    time.sleep(0.01)
    meters.completed(1, 100)  # found done: it arrived at some time before now, which bounds the window
    meters.posted(2, 50)
    meters.posted(2, 50)
    time.sleep(0.01)
    meters.completed(2, 50)  # no known arrival (one alltoallv): from the second post to the completion
    meters.completed(2, 50)
    buffer.close()
    inter, intra = sink.samples
    assert (inter.rank, inter.peer, inter.bytes) == (1, 0, 100) and 0.009 <= inter.seconds < 1
    assert (intra.kind, intra.rank, intra.peer, intra.bytes) == ("intra", 2, 0, 50) and intra.seconds >= 0.009


def test_peers_behind_one_port_share_its_window_and_their_samples_add_up_to_the_port_rate():
    config = TelemetryConfig(threshold_inter=2, threshold_intra=2)
    meters, buffer, sink = _meters(config, same_host=(False, False, False, True, True))
    for peer in (1, 2, 1, 2):
        meters.posted(peer, 100)  # one inter window: the rank's NIC, whoever sends
    meters.posted(3, 10)
    meters.posted(4, 10)  # the intra window: the host fabric
    meters.posted(4, 10)
    meters.completed(1, 100, at=1.0)
    meters.completed(2, 100, at=1.5)
    meters.completed(1, 100, at=2.0)  # 1 inter receive left: closes; 1 s, 100 B from each
    meters.completed(2, 100, at=2.5)
    meters.completed(3, 10, at=1.0)
    meters.completed(4, 10, at=1.25)
    buffer.close()
    assert sorted((s.kind, s.rank, s.peer, s.bytes, s.seconds) for s in sink.samples) == [
        ("inter", 1, 0, 100, 1.0), ("inter", 2, 0, 100, 1.0), ("intra", 4, 0, 10, 0.25)]


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

