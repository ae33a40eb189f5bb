"""The executor's pipelining: every chunk cut into slices (plan.slice_plan), run on real gloo ranks.

The unit tests check the sliced plan's structure (slice j waits for slice j of what its chunk waited
for, a step later per slice, tags equal on both ends); the multi-process test runs tree
packing, rings, AllToAll with relays, ReduceScatter and AllReduce sliced with the eager and the
stepwise drivers and compares bit for bit with torch's own collectives.
"""

from __future__ import annotations

import numpy as np
import pytest

from mccl.runtime.launch import run_ranks
from mccl.runtime.plan import build_plan, slice_plan, slice_spans
from mccl.schedule.slicing import MAX_SLICES, SLICE_BYTES, slice_count
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import naive_ring
from mccl.synth.treepack import synthesize
from mccl.topology import rail_optimized


def test_slice_count_rule():
    assert slice_count(0) == 1
    assert slice_count(SLICE_BYTES) == 1  # exactly one slice's worth
    assert slice_count(SLICE_BYTES + 1) == 2
    assert slice_count(1e12) == MAX_SLICES
    assert slice_count(1000, slice_bytes=10, max_slices=7) == 7


def test_sliced_plan_streams_tags_and_dependencies():
    topology = rail_optimized(1, 2, 4)
    schedule = synthesize(topology).schedule
    k = 3
    for rank in range(8):
        plan = build_plan(schedule, rank)
        sliced = slice_plan(plan, k)
        assert len(sliced.ops) == k * len(plan.ops) and sliced.n_steps == plan.n_steps + k - 1
        for op in sliced.ops:
            origin = plan.ops[sliced.origin[op.index]]
            assert (op.chunk, op.peer, op.is_send, op.step, op.tag) == (
                origin.chunk, origin.peer, origin.is_send, origin.step + op.part, origin.tag * k + op.part)
            waits = {(sliced.origin[d], sliced.ops[d].part) for d in op.deps}
            assert waits == {(d, op.part) for d in origin.deps}  # the same slice of what the chunk waited for
            assert all(d < op.index for d in op.deps)  # deps come earlier in plan order
        # per ordered pair, the tag sequence is the same on both ends
    for a in range(8):
        for b in range(8):
            if a == b:
                continue
            sends = [o.tag for o in slice_plan(build_plan(schedule, a), k).ops if o.is_send and o.peer == b]
            recvs = [o.tag for o in slice_plan(build_plan(schedule, b), k).ops if not o.is_send and o.peer == a]
            assert sends == recvs


def test_slice_spans_cut_every_chunk_alike_and_skip_empty_slices():
    plan = slice_plan(build_plan(naive_ring(rail_optimized(1, 1, 4), "allgather"), 0), 4)
    spans = [(0, 10 * i, 6) for i in range(len(plan.origin) // 4)]  # 6 elements per chunk, 4 slices
    cut = slice_spans(plan, spans)
    for op, span in zip(plan.ops, cut, strict=True):
        base = spans[plan.origin[op.index]][1]
        lo, hi = int(np.rint(6 * op.part / 4)), int(np.rint(6 * (op.part + 1) / 4))
        assert span == (0, base + lo, hi - lo)
    tiny = slice_spans(plan, [(0, 0, 2)] * len(spans))  # 2 elements in 4 slices: two are empty
    assert sum(span is None for span in tiny) == len(plan.ops) // 2


def _values(count, dtype, rank, salt):
    import torch

    return ((torch.arange(count, dtype=torch.int64) * 7 + rank * 5 + salt) % 13).to(dtype)


def _sliced_runs(rank, n):
    import torch
    import torch.distributed as dist

    from mccl.runtime import executor
    from mccl.runtime.transport import Transport

    topology = rail_optimized(1, 2, n // 2)
    transport = Transport(dist.group.WORLD)
    tree = synthesize(topology).schedule
    gathers = [tree, naive_ring(topology, "allgather", chunks=2)]
    failures, calls = [], 0
    seq = 0
    for driver in ("eager", "stepwise"):
        for slice_bytes in (16, 64):
            for size in (7, 1001):
                for index, schedule in enumerate(gathers):
                    plan = build_plan(schedule, rank)
                    x = _values(size, torch.float32, rank, index)
                    out, ref = torch.empty(n * size), torch.empty(n * size)
                    seq += 1
                    buffers = executor.all_gather_buffers(plan, out, x)
                    sliced = executor.call_slices(executor.bind(plan, buffers), buffers, slice_bytes)
                    if size == 1001 and sliced < 4:
                        failures.append(f"rank {rank}: only {sliced} slices of a {size}-element call")
                    executor.execute(transport, plan, buffers, seq=seq, driver=driver, slice_bytes=slice_bytes,
                                     layout_cache={})
                    dist.all_gather_into_tensor(ref, x)
                    calls += 1
                    if not torch.equal(out, ref):
                        failures.append(f"rank {rank}: allgather #{index} {driver} {slice_bytes} B {size}")
                plan = build_plan(direct_alltoall(topology, chunks=2), rank)  # relays (PXN) on the rail fabric
                x = _values(n * size, torch.int64, rank, 3)
                out, ref = torch.empty_like(x), torch.empty_like(x)
                seq += 1
                executor.execute(transport, plan, executor.all_to_all_buffers(plan, out, x, None, None), seq=seq,
                                 driver=driver, slice_bytes=slice_bytes)
                dist.all_to_all_single(ref, x)
                calls += 1
                if not torch.equal(out, ref):
                    failures.append(f"rank {rank}: alltoall {driver} {slice_bytes} B {size}")
                plan = build_plan(naive_ring(topology, "reducescatter", chunks=2), rank)
                x = _values(n * size, torch.float32, rank, 4)
                out, ref = torch.empty(size), torch.empty(size)
                seq += 1
                executor.execute(transport, plan, executor.reduce_scatter_buffers(plan, out, x, dist.ReduceOp.SUM),
                                 seq=seq, driver=driver, slice_bytes=slice_bytes)
                dist.reduce_scatter_tensor(ref, x.clone())
                calls += 1
                if not torch.equal(out, ref):
                    failures.append(f"rank {rank}: reducescatter {driver} {slice_bytes} B {size}")
    return failures, calls


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_sliced_collectives_bit_identical_to_torch():
    results = run_ranks(_sliced_runs, 4, timeout_s=200)
    failures = [failure for rank_failures, _calls in results for failure in rank_failures]
    assert not failures, "\n".join(failures[:20])
    assert all(calls == 2 * 2 * 2 * 4 for _failures, calls in results)


def test_executor_and_simulator_cut_a_call_alike():
    """The simulator's executor model (SimOptions.executor) uses the executor's slice count at every size."""
    torch = pytest.importorskip("torch")
    from mccl.runtime import executor
    from mccl.sim import SimOptions

    topology = rail_optimized(1, 2, 8)
    schedule = synthesize(topology).schedule
    plan = build_plan(schedule, 3)
    for per_rank in (1 << 10, 1 << 16, 1 << 20, 1 << 24):  # float32 elements per rank: 4 KiB ... 64 MiB
        out, x = torch.empty(16 * per_rank), torch.empty(per_rank)
        buffers = executor.all_gather_buffers(plan, out, x)
        ours = executor.call_slices(executor.bind(plan, buffers), buffers)
        assert ours == SimOptions.executor().slices_for(schedule, 16 * per_rank * 4)
    assert ours == MAX_SLICES
