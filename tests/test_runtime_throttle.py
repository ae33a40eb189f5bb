"""The transport's send pacer (an emulated slow link, a real delay) on gloo, and its telemetry."""

from __future__ import annotations

import time

import pytest

from mccl.runtime.launch import run_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]  # gloo ranks in processes of their own


def _paced(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from mccl.errors import MCCLError
    from mccl.runtime import MemorySink, TelemetryConfig, init
    from mccl.synth.ring import naive_ring
    from mccl.topology import rail_optimized

    topology = rail_optimized(1, 2, 1)  # two hosts, one GPU each: the pair is inter-host
    schedule = naive_ring(topology, "allgather", chunks=8)
    sink = MemorySink()
    comm = init(topology=topology, schedules=[schedule], sink=sink, telemetry=TelemetryConfig(flush_interval_s=0.01),
                hot_swap=False)
    elements = 1 << 18  # 1 MiB of int32 per rank
    source = torch.arange(elements, dtype=torch.int32) + rank * elements
    output = torch.empty(elements * world, dtype=torch.int32)
    comm.all_gather_into_tensor(output, source)  # warm-up
    times = {}
    for gbps in (None, 0.2):
        comm.transport.throttle([1 - rank], gbps)
        dist.barrier()
        start = time.perf_counter()
        comm.all_gather_into_tensor(output, source)
        times[gbps] = time.perf_counter() - start
        assert torch.equal(output, torch.arange(elements * world, dtype=torch.int32))
    comm.transport.throttle([1 - rank], None)
    comm.flush_telemetry()
    errors = []
    for bad in ([rank], [5]):
        try:
            comm.transport.throttle(bad, 1.0)
        except MCCLError as error:
            errors.append(str(error))
    try:
        comm.transport.throttle([1 - rank], 0.0)
    except MCCLError as error:
        errors.append(str(error))
    last = [sample.gbps for sample in sink.samples if sample.kind == "inter"][-1]
    comm.close()
    return {"times": times, "last_gbps": last, "errors": errors}


def test_paced_sends_take_their_serialization_time_and_telemetry_sees_the_rate():
    results = run_ranks(_paced, 2, timeout_s=90)
    for result in results:
        # 1 MiB at 0.2 Gbit/s is 41.9 ms of link time; loopback alone is far faster
        assert result["times"][0.2] >= 0.9 * (1 << 20) * 8 / 0.2e9
        assert result["times"][0.2] > 2 * result["times"][None]
        # the window of the paced pair measures the emulated rate (completion times from the pacer):
        # never above it, and on a loaded machine (sleeps overshoot) not far below
        assert 0.1 <= result["last_gbps"] <= 0.2 * 1.1
        assert len(result["errors"]) == 3 and "positive" in result["errors"][2]
