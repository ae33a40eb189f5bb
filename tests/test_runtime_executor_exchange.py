"""One-step schedules (direct AllGather, direct ReduceScatter) on real gloo groups, through every driver.

The exchange driver runs each as one gloo alltoallv with each side in place where it can
be (the AllGather's receives straight into the output, the ReduceScatter's sends straight
from the input and its contributions straight into the fold's stack), and it is the
default on gloo for one-step plans. Values are small integers, so sums in any order are
exact and every result must equal torch's own bit for bit; the gloo-order bits on random
floats are test_backend_order.py's.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from mccl.runtime.launch import run_ranks
from mccl.schedule import Chunks
from mccl.synth.direct import direct_allgather, direct_reducescatter
from mccl.topology import single_switch

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]


def _skewed(schedule):
    """Uneven chunk fractions within every block (so a peer's chunks have different lengths)."""
    blocks = schedule.block_of_chunks()
    fraction = np.array(schedule.chunks.fraction)
    for block in np.unique(blocks):
        members = np.flatnonzero(blocks == block)
        fraction[members] = np.arange(1, len(members) + 1) / np.arange(1, len(members) + 1).sum()
    return replace(schedule, chunks=Chunks(schedule.chunks.source, schedule.chunks.destination, fraction))


def _values(count, dtype, rank, salt):
    import torch

    return ((torch.arange(count, dtype=torch.int64) * 7 + rank * 5 + salt) % 13).to(dtype)


def _cases(rank, n):
    import torch
    import torch.distributed as dist

    from mccl.runtime import Communicator, executor
    from mccl.runtime.plan import build_plan
    from mccl.runtime.transport import Transport

    warnings.filterwarnings("ignore", category=FutureWarning)
    topology = single_switch(n, 100)
    transport = Transport(dist.group.WORLD)
    failures = []
    ag = [direct_allgather(topology), _skewed(direct_allgather(topology, chunks=3))]
    rs = [direct_reducescatter(topology), _skewed(direct_reducescatter(topology, chunks=2))]
    for schedule in ag + rs:
        chosen = executor.default_driver(transport, build_plan(schedule, rank))
        if chosen != "exchange":
            failures.append(f"rank {rank}: {schedule.meta.synthesizer} defaults to {chosen}")
        # telemetry on, a paced peer or a send gate: sends one by one (an alltoallv would bypass them)
        metered = executor.default_driver(transport, build_plan(schedule, rank), metered=True)
        transport.throttle([(rank + 1) % n], 100.0)
        paced = executor.default_driver(transport, build_plan(schedule, rank))
        transport.throttle([(rank + 1) % n], None)
        transport.before_send = lambda: None
        gated = executor.default_driver(transport, build_plan(schedule, rank))
        transport.before_send = None
        if (metered, paced, gated) != ("eager", "eager", "eager"):
            failures.append(f"rank {rank}: metered/paced/gated default to {metered}/{paced}/{gated}")

    def check(label, got, want):
        if not torch.equal(got, want):
            failures.append(f"rank {rank}: {label}")

    for driver in ("exchange", "eager", "stepwise"):
        for index, schedule in enumerate(ag):
            comm = Communicator(transport, name=f"ag{index}", topology=topology, schedules=[schedule], driver=driver)
            for size in (1, 7, 1001):
                for dtype in (torch.float32, torch.int64, torch.bfloat16):
                    x = _values(size, dtype, rank, index)
                    out, ref = torch.empty(n * size, dtype=dtype), torch.empty(n * size, dtype=dtype)
                    comm.all_gather_into_tensor(out, x)
                    dist.all_gather_into_tensor(ref, x)
                    check(f"allgather #{index} {driver} {size} {dtype}", out, ref)
        for index, schedule in enumerate(rs):
            for order in ("gloo", None):  # the fold in gloo's order (landing in the stack), the schedule's own
                comm = Communicator(transport, name=f"rs{index}", topology=topology, schedules=[schedule],
                                    driver=driver)
                comm.reduction_order = order
                for size in (1, 7, 1001):
                    for dtype, op in ((torch.float32, dist.ReduceOp.SUM), (torch.int64, dist.ReduceOp.MAX),
                                      (torch.bfloat16, dist.ReduceOp.SUM), (torch.float32, dist.ReduceOp.AVG)):
                        x = _values(n * size, dtype, rank, index)
                        kept = x.clone()
                        out, ref = torch.empty(size, dtype=dtype), torch.empty(size, dtype=dtype)
                        comm.reduce_scatter_tensor(out, x, op)
                        dist.reduce_scatter_tensor(ref, x.clone(), op)
                        check(f"reducescatter #{index} {driver} {order} {size} {dtype} {op}", out, ref)
                        check(f"reducescatter #{index} {driver} {order} changed its input", x, kept)
                # the output inside the input (this rank's block): written while the input is read
                x = _values(n * 9, torch.float32, rank, 5)
                ref = torch.empty(9)
                dist.reduce_scatter_tensor(ref, x.clone())
                comm.reduce_scatter_tensor(x[rank * 9:(rank + 1) * 9], x)
                check(f"reducescatter #{index} {driver} {order} in place", x[rank * 9:(rank + 1) * 9], ref)
    return failures


@pytest.mark.slow
@pytest.mark.parametrize("n", [3])
def test_one_step_schedules_through_every_driver(n):
    failures = [line for per_rank in run_ranks(_cases, n, timeout_s=150) for line in per_rank]
    assert not failures, failures[:10]
