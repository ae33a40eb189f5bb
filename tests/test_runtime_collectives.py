"""Every collective × schedule kind on real gloo process groups, bit-identical to torch's own.

One spawn per world size (a spawn costs 2–7 s); each runs all its cases and returns
the failures, which the tests below assert empty. Values are small integers, so
float and bfloat16 sums are exact and the comparison can be bit-for-bit.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from mccl.runtime.launch import run_ranks
from mccl.schedule import Chunks, validate
from mccl.synth.common import check_ranks
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import locality_ring, naive_ring, nccl_ring, ring_schedule
from mccl.topology import rail_optimized, single_switch

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]  # gloo ranks in processes of their own

SIZES = (1, 7, 1001)  # elements per rank (AllGather input, AllToAll block, ReduceScatter output)


def _topology(name, n):
    return single_switch(n, 100) if name == "switch" else rail_optimized(1, 2, n // 2)


def _skewed(schedule):
    """The same transfers with uneven chunk fractions (as tree packing / CG produce)."""
    chunks = schedule.chunks
    blocks = schedule.block_of_chunks()
    fraction = np.array(chunks.fraction)
    for block in np.unique(blocks):
        members = np.flatnonzero(blocks == block)
        weights = np.arange(1, len(members) + 1, dtype=float) ** 1.5
        fraction[members] = weights / weights.sum()
    return replace(schedule, chunks=Chunks(chunks.source, chunks.destination, fraction))


def _schedules(topology):
    ag = [naive_ring(topology, "allgather"), naive_ring(topology, "allgather", chunks=3),
          nccl_ring(topology, "allgather", chunks=2), locality_ring(topology, "allgather"),
          _skewed(naive_ring(topology, "allgather", chunks=3))]
    a2a = [direct_alltoall(topology), direct_alltoall(topology, chunks=3), direct_alltoall(topology, pxn=False),
           _skewed(direct_alltoall(topology, chunks=2))]
    rs = [naive_ring(topology, "reducescatter", chunks=2), nccl_ring(topology, "reducescatter"),
          _skewed(naive_ring(topology, "reducescatter", chunks=3))]
    # several random rings in flight at once (tree-like concurrency), uneven fractions
    rng = np.random.default_rng(len(topology.gpus))
    ranks = check_ranks(topology, None)
    for kind, bucket in (("allgather", ag), ("reducescatter", rs)):
        rings = [list(rng.permutation(len(ranks))) for _ in range(3)]
        bucket.append(_skewed(ring_schedule(topology, kind, ranks, rings, chunks=2)))
    for schedule in ag + a2a + rs:
        validate(schedule, topology)
    return ag, a2a, rs


def _values(count, dtype, rank, salt):
    import torch

    return ((torch.arange(count, dtype=torch.int64) * 7 + rank * 5 + salt) % 13).to(dtype)


def _correctness(rank, n, topology_name, with_backend, drivers):
    import torch
    import torch.distributed as dist

    from mccl.errors import MCCLError
    from mccl.runtime import Communicator
    from mccl.runtime.transport import Transport

    warnings.filterwarnings("ignore", category=FutureWarning)
    topology = _topology(topology_name, n)
    ag, a2a, rs = _schedules(topology)
    transport = Transport(dist.group.WORLD)
    failures = []
    dtypes = (torch.float32, torch.int64, torch.bfloat16)
    count = 0

    def check(label, got, want):
        nonlocal count
        count += 1
        if not torch.equal(got, want):
            failures.append(f"rank {rank}: {label}")

    for driver in drivers:
        for index, schedule in enumerate(ag):
            comm = Communicator(transport, name=f"ag{index}", topology=topology, schedules=[schedule], driver=driver)
            for size in SIZES:
                for dtype in dtypes:
                    x = _values(size, dtype, rank, index)
                    out, ref = torch.empty(n * size, dtype=dtype), torch.empty(n * size, dtype=dtype)
                    comm.all_gather_into_tensor(out, x)
                    dist.all_gather_into_tensor(ref, x)
                    check(f"allgather {schedule.meta.synthesizer}#{index} {driver} {size} {dtype}", out, ref)
            tensor = _values(5 * n + 3, torch.float32, rank, 1)
            want = tensor.clone()
            comm.all_reduce(tensor)
            dist.all_reduce(want)
            check(f"allreduce via {schedule.meta.synthesizer}#{index} {driver}", tensor, want)
        for index, schedule in enumerate(a2a):
            comm = Communicator(transport, name=f"a2a{index}", topology=topology, schedules=[schedule], driver=driver)
            for size in SIZES:
                for dtype in dtypes:
                    x = _values(n * size, dtype, rank, index)
                    out, ref = torch.empty_like(x), torch.empty_like(x)
                    comm.all_to_all_single(out, x)
                    dist.all_to_all_single(ref, x)
                    check(f"alltoall {schedule.meta.synthesizer}#{index} {driver} {size} {dtype}", out, ref)
            # uneven splits, rows of 2 elements; relays need the group's split sizes
            in_splits = [(rank + d) % 3 + (d == 0) for d in range(n)]
            out_splits = [(s + rank) % 3 + (rank == 0) for s in range(n)]
            x = _values(sum(in_splits) * 2, torch.float32, rank, 3).reshape(-1, 2)
            out, ref = torch.empty(sum(out_splits), 2), torch.empty(sum(out_splits), 2)
            comm.all_to_all_single(out, x, out_splits, in_splits)
            dist.all_to_all_single(ref, x, out_splits, in_splits)
            check(f"alltoall uneven {schedule.meta.synthesizer}#{index} {driver}", out, ref)
        for index, schedule in enumerate(rs):
            comm = Communicator(transport, name=f"rs{index}", topology=topology, schedules=[schedule], driver=driver)
            for size in SIZES:
                for dtype in dtypes:
                    x = _values(n * size, dtype, rank, index)
                    out, ref = torch.empty(size, dtype=dtype), torch.empty(size, dtype=dtype)
                    comm.reduce_scatter_tensor(out, x)
                    dist.reduce_scatter_tensor(ref, x.clone())
                    check(f"reducescatter {schedule.meta.synthesizer}#{index} {driver} {size} {dtype}", out, ref)
            x = _values(n * 9, torch.int64, rank, 4)
            out, ref = torch.empty(9, dtype=torch.int64), torch.empty(9, dtype=torch.int64)
            comm.reduce_scatter_tensor(out, x, dist.ReduceOp.MAX)
            dist.reduce_scatter_tensor(ref, x.clone(), dist.ReduceOp.MAX)
            check(f"reducescatter max {driver}", out, ref)

    # async handles: several in flight, completed in order, then a sync call behind them
    comm = Communicator(transport, name="async", topology=topology, schedules=[ag[1], a2a[1]])
    inputs = [_values(33, torch.float32, rank, salt) for salt in range(3)]
    outs = [torch.empty(n * 33) for _ in inputs]
    works = [comm.all_gather_into_tensor(o, x, async_op=True) for o, x in zip(outs, inputs, strict=True)]
    x2 = _values(n * 5, torch.float32, rank, 9)
    out2 = torch.empty_like(x2)
    works.append(comm.all_to_all_single(out2, x2, async_op=True))
    for work in works:
        work.wait()
    for o, x in zip(outs, inputs, strict=True):
        ref = torch.empty(n * 33)
        dist.all_gather_into_tensor(ref, x)
        check("async allgather", o, ref)
    ref2 = torch.empty_like(x2)
    dist.all_to_all_single(ref2, x2)
    check("async alltoall", out2, ref2)
    if [seq for seq, _kind, _version in comm.history] != list(range(1, 5)):
        failures.append(f"rank {rank}: sequence numbers {list(comm.history)}")
    comm.close()

    # sizes are checked before anything is issued (gloo would abort the receiver)
    try:
        comm.all_gather_into_tensor(torch.empty(n * 4 + 1), torch.empty(4))
        failures.append(f"rank {rank}: a wrong output size was accepted")
    except MCCLError as error:
        if "must have" not in str(error):
            failures.append(f"rank {rank}: unclear size error {error}")

    if with_backend:
        failures += _through_backend(rank, n, topology, ag[2], a2a[0], rs[0])
        count += 1
    return failures, count


def _through_backend(rank, n, topology, ag, a2a, rs):
    import torch
    import torch.distributed as dist

    import mccl.runtime.backend as mb

    mb.register()
    group = dist.new_group(list(range(n)), backend="mccl")
    from mccl.runtime import MemorySink, TelemetryConfig

    mb.communicator(group).configure(topology=topology, schedules=[ag, a2a, rs])
    sink = MemorySink()
    mb.communicator(group).attach_telemetry(sink, TelemetryConfig(threshold_inter=1, threshold_intra=1))
    failures = []
    x = _values(11, torch.float32, rank, 0)
    out, ref = torch.empty(n * 11), torch.empty(n * 11)
    dist.all_gather_into_tensor(out, x, group=group)
    dist.all_gather_into_tensor(ref, x)
    failures += [] if torch.equal(out, ref) else [f"rank {rank}: backend allgather"]
    work = dist.all_gather_into_tensor(out, x * 2, group=group, async_op=True)
    work.wait()
    dist.all_gather_into_tensor(ref, x * 2)
    failures += [] if torch.equal(out, ref) else [f"rank {rank}: backend async allgather"]
    y = _values(n * 6, torch.int64, rank, 1)
    out, ref = torch.empty_like(y), torch.empty_like(y)
    dist.all_to_all_single(out, y, group=group)
    dist.all_to_all_single(ref, y)
    failures += [] if torch.equal(out, ref) else [f"rank {rank}: backend alltoall"]
    out, ref = torch.empty(6, dtype=torch.int64), torch.empty(6, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, y, group=group)
    dist.reduce_scatter_tensor(ref, y.clone())
    failures += [] if torch.equal(out, ref) else [f"rank {rank}: backend reducescatter"]
    z = _values(4 * n + 1, torch.float32, rank, 2)
    want = z.clone()
    work = dist.all_reduce(z, group=group, async_op=True)
    work.wait()
    dist.all_reduce(want)
    failures += [] if torch.equal(z, want) else [f"rank {rank}: backend allreduce"]
    dist.barrier(group=group)
    history = mb.communicator(group).history
    if [kind for _seq, kind, _v in history] != ["allgather", "allgather", "alltoall", "reducescatter", "allgather",
                                                 None]:
        failures.append(f"rank {rank}: backend calls did not all reach mccl: {list(history)}")
    mb.communicator(group).flush_telemetry()
    if not sink.samples or {s.kind for s in sink.samples} - {"intra", "inter", "collective"}:
        failures.append(f"rank {rank}: no telemetry from the backend's collectives")
    return failures


ALL_DRIVERS = ("eager", "exchange", "stepwise")  # stepwise is NCCL's driver, run here on gloo


@pytest.mark.parametrize(("world", "topology_name", "with_backend", "drivers"),
                         [(2, "switch", False, ALL_DRIVERS), (3, "switch", False, ALL_DRIVERS),
                          (4, "rail", True, ALL_DRIVERS), (8, "rail", False, ("eager", "exchange"))])
def test_collectives_bit_identical_to_torch(world, topology_name, with_backend, drivers):
    results = run_ranks(_correctness, world, topology_name, with_backend, drivers, timeout_s=200)
    failures = [failure for rank_failures, _count in results for failure in rank_failures]
    assert not failures, "\n".join(failures[:20])
    assert all(count >= 140 * len(drivers) + 4 for _failures, count in results)
