"""gloo's order of addition, stated (mccl.runtime.reduction_order) and measured; mccl's sums in it.

The multiprocess tests reduce data whose sums change with the order of addition (values
over six decades, both signs) and require, bit for bit (``torch.equal``):

* gloo's own ``all_reduce``, ``reduce_scatter_tensor`` and list-form ``reduce_scatter`` equal
  the fold :mod:`mccl.runtime.reduction_order` predicts (the statement is true of gloo);
* the same calls on an "mccl" group, with a direct ReduceScatter schedule that really ran,
  equal gloo's (the executor adds in that order);
* and, so that the data is known to expose the order, the same schedule adding in its own
  order (``reduction_order = None``) does differ from gloo.

Run as a script, ``python tests/test_backend_order.py 2 3 4 5 6 7 8 [--large]``, it measures all three at
those world sizes over more sizes (up to 1 MiB float64 blocks, where gloo cuts a chunk into
more than 2 segments) and the four float dtypes: what the order was confirmed on.
"""

from __future__ import annotations

import sys
import warnings

import pytest

from mccl.runtime.launch import run_ranks
from mccl.runtime.reduction_order import (
    ReductionOrder,
    gloo_chunk_elements,
    gloo_fold,
    gloo_fold_ranges,
    gloo_segments,
)

DTYPES = ("float32", "float64", "float16", "bfloat16")


def test_gloo_ring_cut_and_fold():
    # small buffers: 2n segments; 10 float32 on 4 ranks: segments of ceil(10/8) = 2 elements, 2 per chunk
    assert gloo_segments(10, 4, 4) == 8 and gloo_chunk_elements(10, 4, 4) == 4
    # 8 MiB + 96 B of float64 on 4 ranks: 9 segments of at most 1 MiB, rounded up to 12, 3 per chunk
    assert gloo_segments(1048588, 4, 8) == 12 and gloo_chunk_elements(1048588, 4, 8) == 3 * 87383
    # chunk c's partial sum starts at rank c - 1 and goes down the ring, ending at c
    assert gloo_fold(0, 4) == (3, 2, 1, 0) and gloo_fold(2, 4) == (1, 0, 3, 2)
    assert gloo_fold_ranges(10, 4, 4, 3, 9) == [(3, 4, (3, 2, 1, 0)), (4, 8, (0, 3, 2, 1)), (8, 9, (1, 0, 3, 2))]
    # padding past the buffer's end takes the last chunk's order
    assert gloo_fold_ranges(10, 4, 4, 9, 12) == [(9, 12, (1, 0, 3, 2))]


def test_list_form_order_is_per_block():
    """List-form reduce_scatter: gloo reduces each block as a buffer of its own (block-local chunks)."""
    order = ReductionOrder(12, per_buffer=6)
    # 6 elements on 2 ranks: 4 segments of 2, chunks of 4: block-local [0, 4) and [4, 6)
    assert order.ranges(6, 12, 2, 4) == [(6, 10, (1, 0)), (10, 12, (0, 1))]
    assert ReductionOrder(12).ranges(6, 12, 2, 4) == [(6, 12, (0, 1))]


def test_raw_contributions_only_where_no_partial_sum_is_forwarded():
    from mccl.runtime.plan import build_plan
    from mccl.synth.direct import direct_reducescatter
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    topology = single_switch(4, 100)
    assert all(build_plan(direct_reducescatter(topology, chunks=2), rank).raw_contributions for rank in range(4))
    assert not build_plan(naive_ring(topology, "reducescatter"), 0).raw_contributions
    assert not build_plan(naive_ring(topology, "allgather"), 0).raw_contributions


def _data(rank: int, elements: int, dtype):
    import torch

    generator = torch.Generator().manual_seed(1000 * rank + elements)
    magnitude = torch.pow(10.0, torch.rand(elements, generator=generator, dtype=torch.float64) * 6 - 3)
    return (torch.randn(elements, generator=generator, dtype=torch.float64) * magnitude).to(dtype)


def _predicted(contributions, elements: int, n: int, start: int, stop: int):
    """The fold reduction_order states, computed here with torch additions."""
    out = contributions[0][start:stop].clone()
    for lo, hi, ranks in gloo_fold_ranges(elements, n, out.element_size(), start, stop):
        acc = contributions[ranks[0]][lo:hi].clone()
        for rank in ranks[1:]:
            acc += contributions[rank][lo:hi]
        out[lo - start:hi - start] = acc
    return out


def _gloo_against_statement(rank: int, n: int, sizes: list[int], dtypes: tuple[str, ...]) -> list[tuple]:
    """(op, dtype, block elements) of every call where gloo's bits differ from the stated fold."""
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    wrong = []
    for name in dtypes:
        dtype = getattr(torch, name)
        for per in sizes:
            total = per * n
            xs = [_data(r, total, dtype) for r in range(n)]
            summed = xs[rank].clone()
            dist.all_reduce(summed)
            if not torch.equal(summed, _predicted(xs, total, n, 0, total)):
                wrong.append(("all_reduce", name, total))
            block = torch.empty(per, dtype=dtype)
            dist.reduce_scatter_tensor(block, xs[rank].clone())
            if not torch.equal(block, _predicted(xs, total, n, rank * per, (rank + 1) * per)):
                wrong.append(("reduce_scatter_tensor", name, per))
            dist.reduce_scatter(block, list(xs[rank].clone().chunk(n)))
            own = [x[rank * per:(rank + 1) * per] for x in xs]
            if not torch.equal(block, _predicted(own, per, n, 0, per)):
                wrong.append(("reduce_scatter", name, per))
    return wrong


def _schedules(rank: int, n: int):
    from mccl.synth.direct import direct_alltoall, direct_reducescatter
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    topology = single_switch(n, 100)
    return topology, [naive_ring(topology, "allgather", chunks=2), direct_reducescatter(topology, chunks=2),
                      direct_alltoall(topology)]


def _mccl_against_gloo(rank: int, n: int, sizes: list[int], dtypes: tuple[str, ...]) -> tuple[list[tuple], int, dict]:
    """Calls whose mccl result differs from gloo's; how many differ when mccl adds in the schedule's order."""
    import torch
    import torch.distributed as dist

    import mccl.runtime.backend as mb

    warnings.filterwarnings("ignore")
    mb.register(_schedules)
    group = dist.new_group(list(range(n)), backend="mccl")
    communicator = mb.communicator(group)
    wrong = []
    for name in dtypes:
        dtype = getattr(torch, name)
        for per in sizes:
            x = _data(rank, per * n, dtype)
            theirs, ours = torch.empty(per, dtype=dtype), torch.empty(per, dtype=dtype)
            dist.reduce_scatter_tensor(theirs, x.clone())
            dist.reduce_scatter_tensor(ours, x.clone(), group=group)
            if not torch.equal(theirs, ours):
                wrong.append(("reduce_scatter_tensor", name, per))
            dist.reduce_scatter(theirs, list(x.clone().chunk(n)))
            dist.reduce_scatter(ours, list(x.clone().chunk(n)), group=group)
            if not torch.equal(theirs, ours):
                wrong.append(("reduce_scatter", name, per))
            for elements in (per * n, per * n + 1):  # one that pads to n blocks
                theirs_all, ours_all = x[:elements].clone(), x[:elements].clone()
                dist.all_reduce(theirs_all)
                dist.all_reduce(ours_all, group=group)
                if not torch.equal(theirs_all, ours_all):
                    wrong.append(("all_reduce", name, elements))
    communicator.reduction_order = None  # the schedule's own order: the owner adds as the plan lists them
    own_order_differs = 0
    for per in sizes:
        x = _data(rank, per * n, torch.float32)
        theirs, ours = torch.empty(per), torch.empty(per)
        dist.reduce_scatter_tensor(theirs, x.clone())
        dist.reduce_scatter_tensor(ours, x.clone(), group=group)
        own_order_differs += int((theirs != ours).sum())
    return wrong, own_order_differs, communicator.calls.counts()


def _check(world: int, sizes: list[int], dtypes: tuple[str, ...]) -> None:
    results = run_ranks(_both, world, sizes, dtypes, timeout_s=250)
    for rank, (gloo_wrong, wrong, own_order_differs, counts) in enumerate(results):
        assert not gloo_wrong, f"rank {rank}: gloo does not add as reduction_order states in {gloo_wrong}"
        assert not wrong, f"rank {rank}: mccl's bits differ from gloo's in {wrong}"
        assert own_order_differs > 0, "the data does not expose the order of addition: the test proves nothing"
        calls = len(dtypes) * len(sizes)
        assert counts.get(("reduce_scatter_tensor", "schedule"), 0) == calls + len(sizes), counts
        assert counts.get(("reduce_scatter", "schedule"), 0) == calls, counts
        assert counts.get(("all_reduce", "schedule"), 0) == 2 * calls, counts


def _both(rank: int, n: int, sizes: list[int], dtypes: tuple[str, ...]) -> tuple:
    return (_gloo_against_statement(rank, n, sizes, dtypes), *_mccl_against_gloo(rank, n, sizes, dtypes))


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_gloo_order_stated_and_mccl_bit_identical_4_ranks():
    _check(4, [1, 5, 33, 1000], ("float32", "bfloat16"))


if __name__ == "__main__":  # the measurement at more world sizes, sizes and dtypes
    large = "--large" in sys.argv  # blocks up to 1 MiB of float64 (slow on a loaded machine)
    for world_size in [int(arg) for arg in sys.argv[1:] if arg.isdigit()] or [2, 3, 4, 5, 6, 7, 8]:
        probe = list(range(1, 18)) + [64, 1000, 4097] + ([65541, 262147] if large else [])
        found = run_ranks(_both, world_size, probe, DTYPES, timeout_s=1800)
        print(f"{world_size} ranks, {len(probe) * len(DTYPES)} (size, dtype) cases: gloo off the stated order "
              f"{sum(len(f[0]) for f in found)}, mccl off gloo {sum(len(f[1]) for f in found)}, "
              f"mccl in the schedule's order off gloo {sum(f[2] for f in found)} elements")
