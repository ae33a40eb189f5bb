"""Every c10d operation on an "mccl" group against the same call on a plain gloo group, 2 and 4 ranks.

One spawn per world size runs every case and returns its failures and the mccl group's
call counts; the tests assert no failure and that the calls with an mccl schedule
(AllGather, ReduceScatter, AllReduce, AllToAll, tensor / list / coalesced / functional
forms) really ran it — the counts come from the communicator's call log, so a silent
fall-back to gloo fails here. Values are small integers: float sums are exact, so every
comparison is bit-for-bit (``torch.equal``).
"""

from __future__ import annotations

import warnings

import pytest

from mccl.runtime.launch import run_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def schedules_for(rank, n):
    """The backend's ``setup``: a single switch, ring AllGather / ReduceScatter, direct AllToAll."""
    from mccl.synth.direct import direct_alltoall
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    topology = single_switch(n, 100)
    return topology, [naive_ring(topology, "allgather", chunks=2), naive_ring(topology, "reducescatter"),
                      direct_alltoall(topology)]


def _values(count, dtype, rank, salt=0):
    import torch

    return ((torch.arange(count, dtype=torch.int64) * 7 + rank * 5 + salt) % 13).to(dtype)


def _ops(rank, n):  # noqa: PLR0915 - one spawn runs every case, in order, on every rank
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import mccl.runtime.backend as mb
    from mccl.runtime.agreement import CollectiveMismatch

    warnings.filterwarnings("ignore")
    mb.register(schedules_for)
    group = dist.new_group(list(range(n)), backend="mccl")
    comm = mb.communicator(group)
    gloo = dist.group.WORLD
    failures = []

    def same(label, got, want):
        if not (got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)):
            failures.append(f"rank {rank}: {label}")

    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.int64)
    # AllGather: tensor, list, non-contiguous input, zero-size, async with get_future
    for dtype in dtypes:
        for size in (0, 1, 7, 1001):
            x = _values(size, dtype, rank)
            out, ref = torch.empty(n * size, dtype=dtype), torch.empty(n * size, dtype=dtype)
            dist.all_gather_into_tensor(out, x, group=group)
            dist.all_gather_into_tensor(ref, x, group=gloo)
            same(f"all_gather_into_tensor {dtype} {size}", out, ref)
        x = _values(6, dtype, rank).reshape(2, 3)
        outs, refs = [torch.empty(2, 3, dtype=dtype) for _ in range(n)], [torch.empty(2, 3, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, x, group=group)
        dist.all_gather(refs, x, group=gloo)
        same(f"all_gather list {dtype}", torch.stack(outs), torch.stack(refs))
    wide = _values(20, torch.float32, rank).reshape(4, 5)
    out, ref = torch.empty(n * 4), torch.empty(n * 4)
    dist.all_gather_into_tensor(out, wide[:, 1], group=group)  # a non-contiguous column
    dist.all_gather_into_tensor(ref, wide[:, 1].contiguous(), group=gloo)
    same("all_gather_into_tensor non-contiguous", out, ref)
    work = dist.all_gather_into_tensor(out, wide[:, 2].contiguous(), group=group, async_op=True)
    gathered = work.get_future().wait()[0]
    dist.all_gather_into_tensor(ref, wide[:, 2].contiguous(), group=gloo)
    same("all_gather async get_future", gathered, ref)

    # ReduceScatter: SUM / MAX / MIN / PRODUCT (ReduceOp objects in the options), list, zero-size
    for dtype in dtypes:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
            for size in (0, 3, 257):
                x = _values(n * size, dtype, rank, 1)
                out, ref = torch.empty(size, dtype=dtype), torch.empty(size, dtype=dtype)
                dist.reduce_scatter_tensor(out, x, op=op, group=group)
                dist.reduce_scatter_tensor(ref, x.clone(), op=op, group=gloo)
                same(f"reduce_scatter_tensor {op} {dtype} {size}", out, ref)
    for dtype in (torch.float32, torch.bfloat16):  # FSDP2's gradient reduction (ReduceOp.AVG)
        x = _values(n * 33, dtype, rank, 3)
        out, ref = torch.empty(33, dtype=dtype), torch.empty(33, dtype=dtype)
        dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG, group=group)
        dist.reduce_scatter_tensor(ref, x.clone(), op=dist.ReduceOp.AVG, group=gloo)
        same(f"reduce_scatter_tensor AVG {dtype}", out, ref)
    x = (_values(n * 4, torch.int64, rank, 2) % 3 + 1)
    out, ref = torch.empty(4, dtype=torch.int64), torch.empty(4, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.PRODUCT, group=group)
    dist.reduce_scatter_tensor(ref, x.clone(), op=dist.ReduceOp.PRODUCT, group=gloo)
    same("reduce_scatter_tensor PRODUCT", out, ref)
    table = _values(n * 8 * 3, torch.float32, rank, 2).reshape(n * 8, 3)
    out, ref = torch.empty(8, 2)[:, 0], torch.empty(8)  # a non-contiguous input column and output column
    dist.reduce_scatter_tensor(out, table[:, 1], group=group)
    dist.reduce_scatter_tensor(ref, table[:, 1].contiguous(), group=gloo)
    same("reduce_scatter_tensor non-contiguous", out.contiguous(), ref)
    inputs = [_values(5, torch.float32, rank, i) for i in range(n)]
    out, ref = torch.empty(5), torch.empty(5)
    dist.reduce_scatter(out, inputs, group=group)
    dist.reduce_scatter(ref, [t.clone() for t in inputs], group=gloo)
    same("reduce_scatter list", out, ref)

    # AllReduce: SUM / MAX, odd sizes, non-contiguous, bitwise (delegated to gloo's allreduce), coalesced
    for dtype in dtypes:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            x = _values(4 * n + 3, dtype, rank, 3)
            y = x.clone()
            dist.all_reduce(x, op=op, group=group)
            dist.all_reduce(y, op=op, group=gloo)
            same(f"all_reduce {op} {dtype}", x, y)
    grid = _values(24, torch.float32, rank).reshape(4, 6)
    column, want = grid[:, 1], grid[:, 1].clone()
    dist.all_reduce(column, group=group)
    dist.all_reduce(want, group=gloo)
    same("all_reduce non-contiguous (in place)", grid[:, 1], want)
    bits, want = _values(9, torch.int64, rank, 4), _values(9, torch.int64, rank, 4)
    dist.all_reduce(bits, op=dist.ReduceOp.BOR, group=group)
    dist.all_reduce(want, op=dist.ReduceOp.BOR, group=gloo)
    same("all_reduce BOR", bits, want)

    # AllToAll: even, uneven splits with a zero, list form, zero-size
    for dtype in dtypes:
        x = _values(n * 5, dtype, rank, 5)
        out, ref = torch.empty_like(x), torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        dist.all_to_all_single(ref, x, group=gloo)
        same(f"all_to_all_single {dtype}", out, ref)
    in_splits = [(rank + d) % 3 for d in range(n)]
    out_splits = [(s + rank) % 3 for s in range(n)]
    x = _values(sum(in_splits) * 2, torch.float32, rank, 6).reshape(-1, 2)
    out, ref = torch.empty(sum(out_splits), 2), torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    dist.all_to_all_single(ref, x, out_splits, in_splits, group=gloo)
    same("all_to_all_single uneven", out, ref)
    table = _values(n * 4 * 2, torch.int64, rank, 6).reshape(n * 4, 2)
    out, ref = torch.empty(n * 4, dtype=torch.int64), torch.empty(n * 4, dtype=torch.int64)
    dist.all_to_all_single(out, table[:, 0], group=group)  # a non-contiguous input
    dist.all_to_all_single(ref, table[:, 0].contiguous(), group=gloo)
    same("all_to_all_single non-contiguous", out, ref)
    empty = torch.empty(0)
    dist.all_to_all_single(torch.empty(0), empty, group=group)
    sends = [_values(3, torch.int64, rank, d) for d in range(n)]  # gloo's list form: equal sizes
    outs = [torch.empty(3, dtype=torch.int64) for _ in range(n)]
    refs = [torch.empty(3, dtype=torch.int64) for _ in range(n)]
    dist.all_to_all(outs, sends, group=group)
    dist.all_to_all(refs, sends, group=gloo)
    same("all_to_all list", torch.cat(outs), torch.cat(refs))

    # delegated: broadcast, reduce, gather, scatter, send/recv, objects, barrier
    x, y = _values(7, torch.float32, rank, 7), _values(7, torch.float32, rank, 7)
    dist.broadcast(x, src=n - 1, group=group)
    dist.broadcast(y, src=n - 1, group=gloo)
    same("broadcast", x, y)
    x, y = _values(7, torch.float32, rank, 8), _values(7, torch.float32, rank, 8)
    dist.reduce(x, dst=0, group=group)
    dist.reduce(y, dst=0, group=gloo)
    if rank == 0:
        same("reduce", x, y)
    x = _values(3, torch.float32, rank, 9)
    got = [torch.empty(3) for _ in range(n)] if rank == 0 else None
    want = [torch.empty(3) for _ in range(n)] if rank == 0 else None
    dist.gather(x, got, dst=0, group=group)
    dist.gather(x, want, dst=0, group=gloo)
    if rank == 0:
        same("gather", torch.stack(got), torch.stack(want))
    pieces = [_values(3, torch.float32, 0, i) for i in range(n)] if rank == 0 else None
    got, want = torch.empty(3), torch.empty(3)
    dist.scatter(got, pieces, src=0, group=group)
    dist.scatter(want, pieces, src=0, group=gloo)
    same("scatter", got, want)
    if rank in (0, 1):
        message = _values(4, torch.float32, 0, 10)
        if rank == 0:
            dist.send(message, dst=1, group=group)
        else:
            got = torch.empty(4)
            dist.recv(got, src=0, group=group)
            same("send/recv", got, message)
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": rank, "tag": "x" * rank}, group=group)
    if objects != [{"rank": r, "tag": "x" * r} for r in range(n)]:
        failures.append(f"rank {rank}: all_gather_object {objects}")
    payload = [{"from": "root"}, 3] if rank == 0 else [None, None]
    dist.broadcast_object_list(payload, src=0, group=group)
    if payload != [{"from": "root"}, 3]:
        failures.append(f"rank {rank}: broadcast_object_list {payload}")
    dist.barrier(group=group)

    # coalescing: one Work for several calls, each through the schedule
    a, b = _values(n * 3, torch.float32, rank, 11), _values(n * 5, torch.float32, rank, 12)
    outs = [torch.empty(n * n * 3), torch.empty(n * n * 5)]
    with dist._coalescing_manager(group=group, async_ops=True) as manager:
        dist.all_gather_into_tensor(outs[0], a, group=group)
        dist.all_gather_into_tensor(outs[1], b, group=group)
    manager.wait()
    for got, source in zip(outs, (a, b), strict=True):
        want = torch.empty_like(got)
        dist.all_gather_into_tensor(want, source, group=gloo)
        same("coalesced all_gather", got, want)
    outs = [torch.empty(3), torch.empty(5)]
    with dist._coalescing_manager(group=group, async_ops=True) as manager:
        dist.reduce_scatter_tensor(outs[0], a, group=group)
        dist.reduce_scatter_tensor(outs[1], b, group=group)
    manager.wait()
    for got, source in zip(outs, (a, b), strict=True):
        want = torch.empty_like(got)
        dist.reduce_scatter_tensor(want, source.clone(), group=gloo)
        same("coalesced reduce_scatter", got, want)
    pair = [a.clone(), b.clone()]
    with dist._coalescing_manager(group=group, async_ops=True) as manager:
        for t in pair:
            dist.all_reduce(t, group=group)
    manager.wait()
    for got, source in zip(pair, (a, b), strict=True):
        want = source.clone()
        dist.all_reduce(want, group=gloo)
        same("coalesced all_reduce", got, want)

    pair = [a.clone(), b.clone()]
    with dist._coalescing_manager(group=group, device=torch.device("cpu"), async_ops=True) as manager:
        for t in pair:  # with a device: the group's own start/end coalescing brackets the calls
            dist.all_reduce(t, group=group)
    manager.wait()
    for got, source in zip(pair, (a, b), strict=True):
        want = source.clone()
        dist.all_reduce(want, group=gloo)
        same("coalesced all_reduce (device)", got, want)
    right, left = (rank + 1) % n, (rank - 1) % n
    message, got = _values(5, torch.float32, rank, 16), torch.empty(5)
    for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, message, right, group),
                                           dist.P2POp(dist.irecv, got, left, group)]):
        request.wait()
    same("batch_isend_irecv", got, _values(5, torch.float32, left, 16))

    # functional collectives, DeviceMesh and DTensor (they find the group by its name)
    x = _values(6, torch.float32, rank, 13)
    want = torch.empty(n * 6)
    dist.all_gather_into_tensor(want, x, group=gloo)
    same("funcol all_gather_tensor", funcol.all_gather_tensor(x, 0, group).clone(), want)
    want = torch.empty(6 // 2 if n == 2 else 6 // n if 6 % n == 0 else 0)
    y = _values(n * 4, torch.float32, rank, 14)
    want = torch.empty(4)
    dist.reduce_scatter_tensor(want, y.clone(), group=gloo)
    same("funcol reduce_scatter_tensor", funcol.reduce_scatter_tensor(y, "sum", 0, group).clone(), want)
    want = y.clone()
    dist.all_reduce(want, group=gloo)
    same("funcol all_reduce", funcol.all_reduce(y, "sum", group).clone(), want)
    want = torch.empty_like(y)
    dist.all_to_all_single(want, y, group=gloo)
    same("funcol all_to_all_single", funcol.all_to_all_single(y, None, None, group).clone(), want)
    mesh = DeviceMesh.from_group(group, "cpu")
    full = _values(n * 3 * 2, torch.float32, 0, 15).reshape(n * 3, 2)
    dtensor = distribute_tensor(full, mesh, [Shard(0)])
    same("DTensor full_tensor", dtensor.full_tensor(), full)

    # a size mismatch: a clear error on every rank, nothing moved, the group still usable after
    x = _values(5 if rank == 0 else 6, torch.float32, rank)
    out = torch.full((n * x.numel(),), -1.0)
    try:
        dist.all_gather_into_tensor(out, x, group=group)
        failures.append(f"rank {rank}: mismatched all_gather accepted")
    except CollectiveMismatch as error:
        if "input elements differ" not in str(error) or not bool((out == -1).all()):
            failures.append(f"rank {rank}: unclear mismatch {error}")
    x = _values(4, torch.float16 if rank == n - 1 else torch.float32, rank)
    try:
        dist.reduce_scatter_tensor(torch.empty(4 // n if 4 % n == 0 else 1, dtype=x.dtype), x, group=group)
        failures.append(f"rank {rank}: mismatched dtype accepted")
    except CollectiveMismatch as error:
        if "dtypes differ" not in str(error):
            failures.append(f"rank {rank}: unclear dtype mismatch {error}")
    x = _values(n * 2, torch.float32, rank)
    out, ref = torch.empty(n * n * 2), torch.empty(n * n * 2)
    dist.all_gather_into_tensor(out, x, group=group)
    dist.all_gather_into_tensor(ref, x, group=gloo)
    same("all_gather after a mismatch", out, ref)
    return failures, comm.calls.counts()


def _check(world):
    results = run_ranks(_ops, world, timeout_s=240)
    failures = [failure for rank_failures, _counts in results for failure in rank_failures]
    assert not failures, "\n".join(failures[:30])
    for _failures, counts in results:
        for op in ("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "reduce_scatter", "all_reduce",
                   "all_to_all_single", "all_to_all", "all_gather_into_tensor_coalesced",
                   "reduce_scatter_tensor_coalesced", "all_reduce_coalesced"):
            assert counts.get((op, "schedule"), 0) > 0, (op, counts)
        # the few delegated calls of a scheduled kind are exactly the bitwise reductions
        assert counts.get(("all_reduce", "delegated"), 0) == 1, counts
        assert counts.get(("reduce_scatter_tensor", "delegated"), 0) == 0, counts
        for op in ("broadcast", "reduce", "gather", "scatter"):
            assert counts.get((op, "delegated"), 0) > 0, (op, counts)


def test_every_c10d_operation_matches_gloo_2_ranks():
    _check(2)


def test_every_c10d_operation_matches_gloo_4_ranks():
    _check(4)
