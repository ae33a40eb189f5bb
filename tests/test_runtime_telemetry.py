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


def test_window_counts_only_while_saturated():
    config = TelemetryConfig(threshold_inter=2, threshold_intra=2)
    meters, buffer, sink = _meters(config)
    meters.posted(1, 100)  # one in flight: below the threshold, no window
    meters.completed(1, 100)
    meters.posted(1, 100)
    meters.posted(1, 100)  # two in flight: the window opens
    meters.posted(1, 100)
    time.sleep(0.01)
    meters.completed(1, 100)  # 2 left: still open
    meters.completed(1, 100)  # 1 left: closes, 200 bytes counted
    meters.completed(1, 100)  # tail transient: not measured
    buffer.close()
    samples = sink.samples
    assert len(samples) == 1
    assert samples[0].kind == "inter" and samples[0].peer == 1 and samples[0].bytes == 200
    assert samples[0].seconds >= 0.009


def test_intra_host_peers_share_one_injection_window():
    config = TelemetryConfig(threshold_inter=1, threshold_intra=2)
    meters, buffer, sink = _meters(config)
    meters.posted(2, 10)
    meters.posted(3, 10)  # two same-host sends: the rank's injection window opens
    meters.completed(2, 10)
    meters.completed(3, 10)
    buffer.close()
    assert [(s.kind, s.peer, s.bytes) for s in sink.samples] == [("intra", -1, 10)]


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
