"""The transport's send pacer (an emulated slow link, a real delay) on gloo, and its telemetry — AllGather and
AllToAll (which a metered communicator runs on the eager driver: an alltoallv has no arrival times)."""

from __future__ import annotations

import time

import pytest

from mccl.runtime.launch import run_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]  # gloo ranks in processes of their own


def _paced(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from mccl.errors import MCCLError
    from mccl.runtime import MemorySink, TelemetryConfig, executor, init
    from mccl.runtime.plan import build_plan
    from mccl.synth.direct import direct_alltoall
    from mccl.synth.ring import naive_ring
    from mccl.topology import rail_optimized

    topology = rail_optimized(1, 2, 1)  # two hosts, one GPU each: the pair is inter-host
    schedule = naive_ring(topology, "allgather", chunks=8)
    alltoall = direct_alltoall(topology, chunks=4)
    sink = MemorySink()
    comm = init(topology=topology, schedules=[schedule, alltoall], sink=sink,
                telemetry=TelemetryConfig(flush_interval_s=0.01), hot_swap=False)
    plan = build_plan(alltoall, rank)
    drivers = (executor.default_driver(comm.transport, plan), executor.default_driver(comm.transport, plan, metered=True))
    elements = 1 << 18  # 1 MiB of int32 per rank
    source = torch.arange(elements, dtype=torch.int32) + rank * elements
    output = torch.empty(elements * world, dtype=torch.int32)
    comm.all_gather_into_tensor(output, source)  # warm-up
    times = {}
    for gbps, repeats in ((None, 3), (0.2, 1)):  # loopback's time: the quickest of 3 (a loaded machine's noise)
        comm.transport.throttle([1 - rank], gbps)
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            comm.all_gather_into_tensor(output, source)
            times[gbps] = min(times.get(gbps, float("inf")), time.perf_counter() - start)
            assert torch.equal(output, torch.arange(elements * world, dtype=torch.int32))
    comm.flush_telemetry()
    last = [sample.gbps for sample in sink.samples if sample.kind == "inter"][-1]
    # AllToAll on the paced link: 2 MiB per rank, 1 MiB to the peer (slices in flight, as in the loop)
    a2a_source = torch.arange(2 * elements, dtype=torch.int32) + rank * 2 * elements
    a2a_output, a2a_expected = torch.empty_like(a2a_source), torch.empty_like(a2a_source)
    dist.all_to_all_single(a2a_expected, a2a_source)
    before = len(sink.samples)
    dist.barrier()
    comm.all_to_all_single(a2a_output, a2a_source)
    comm.transport.throttle([1 - rank], None)
    comm.flush_telemetry()
    a2a = [sample.gbps for sample in sink.samples[before:] if sample.kind == "inter"]
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
    comm.close()
    return {"times": times, "last_gbps": last, "errors": errors, "drivers": drivers, "a2a_gbps": a2a,
            "a2a_exact": torch.equal(a2a_output, a2a_expected)}


def test_paced_sends_take_their_serialization_time_and_telemetry_sees_the_rate():
    results = run_ranks(_paced, 2, timeout_s=90)
    for result in results:
        # 1 MiB at 0.2 Gbit/s is 41.9 ms of link time; loopback alone is far faster
        assert result["times"][0.2] >= 0.9 * (1 << 20) * 8 / 0.2e9
        assert result["times"][0.2] > 2 * result["times"][None]
        # the window of the paced pair measures the emulated rate (completion times from the pacer): not far
        # below it on a loaded machine (sleeps overshoot), and above it only by the pacer's catch-up burst after
        # a stall (throttle.py: the posts behind schedule go at once). Measured with 3 CPU burners, 6 runs each:
        # 0.223-0.290 in 1-2 of 6 on main and on this tree (the old bound 1.1x failed a fresh-clone CI)
        assert 0.1 <= result["last_gbps"] <= 0.2 * 1.5
        assert len(result["errors"]) == 3 and "positive" in result["errors"][2]
        # AllToAll: unmetered one alltoallv, metered eager, whose receive windows see the paced link (their
        # rate is not bounded here: after a stall on a loaded machine the pacer catches up in a burst)
        assert result["drivers"] == ("exchange", "eager")
        assert result["a2a_exact"]
        assert result["a2a_gbps"], "no inter-host sample of the paced AllToAll"
