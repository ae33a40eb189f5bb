"""A failed collective on an "mccl" group fails every caller that waits on its Work, not only
``get_future()``: Python's ``work.wait()`` after ``async_op=True`` and torch's C++ callers (a functional
collective's result waits on the Work in C++). Before, the Work came from torch's private
``_create_work_from_future``, whose ``wait()`` returned True when the future held an error: a size
mismatch or a lost peer on the worker thread looked like success and left the output unwritten
(found by hand: a SIGSTOPped rank during DDP's constructor surfaced on the others as
"value cannot be converted to type int without overflow", read from the unwritten buffer), and the coalesced forms (what functional collectives call) ignored
a failed call when they joined their futures.
"""

from __future__ import annotations

import warnings

import pytest

from mccl.runtime.launch import run_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]


def _setup(rank, n):
    from mccl.synth.direct import direct_allgather, direct_alltoall, direct_reducescatter
    from mccl.topology import single_switch

    topology = single_switch(n, 100)
    return topology, [direct_allgather(topology), direct_reducescatter(topology), direct_alltoall(topology)]


def _failed_waits(rank, n):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import mccl.runtime.backend as mb

    warnings.filterwarnings("ignore")
    mb.register(_setup)
    group = dist.new_group(list(range(n)), backend="mccl")
    seen = []
    x = torch.ones(5 if rank == 0 else 6)
    out = torch.full((n * x.numel(),), -1.0)
    work = dist.all_gather_into_tensor(out, x, group=group, async_op=True)
    try:
        work.wait()
        seen.append("async wait returned")
    except Exception as error:  # noqa: BLE001 - the type is what is checked
        seen.append(f"async wait: {type(error).__name__}: {error}")
    seen.append(f"output untouched: {bool((out == -1).all())}")
    # a C++ caller: a functional collective's result waits on the Work in C++ (wait_tensor)
    try:
        float(funcol.all_gather_tensor(x, 0, group).sum())
        seen.append("C++ wait returned")
    except Exception as error:  # noqa: BLE001
        seen.append(f"C++ wait: {type(error).__name__}: {error}")
    same = torch.arange(4.0) + rank
    gathered = torch.empty(4 * n)
    dist.all_gather_into_tensor(gathered, same, group=group, async_op=True).wait()  # still usable after
    seen.append(f"after: {torch.equal(gathered, torch.cat([torch.arange(4.0) + r for r in range(n)]))}")
    return seen


def test_a_failed_collective_fails_work_wait_on_every_rank():
    for rank, seen in enumerate(run_ranks(_failed_waits, 2, timeout_s=180)):
        assert seen[0].startswith("async wait: CollectiveMismatch") and "input elements differ" in seen[0], (rank, seen)
        assert seen[1] == "output untouched: True", (rank, seen)
        assert seen[2].startswith("C++ wait: ") and "disagree" in seen[2], (rank, seen)
        assert seen[3] == "after: True", (rank, seen)
