"""A rank that disappears mid-run: the others get a PeerLost that names it, and then refuse to go on.

Real gloo processes: rank 1 leaves after the first collective (its process group is
destroyed and its process exits, as a crashed worker's would be); rank 0 keeps
issuing collectives on the same communicator.
"""

from __future__ import annotations

import pytest

from mccl.runtime.launch import run_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]  # gloo ranks in processes of their own


def _rank(rank: int, world_size: int, kind: str) -> dict:
    import torch

    import mccl
    from mccl.errors import PeerLost
    from mccl.synth.direct import direct_alltoall
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    topology = single_switch(world_size, 100)
    communicator = mccl.init(topology=topology, schedules=[naive_ring(topology, "allgather"),
                                                           direct_alltoall(topology)], hot_swap=False)
    block = 1 << 16
    source, gathered = torch.full((block,), float(rank)), torch.empty(block * world_size)
    mccl.all_gather_into_tensor(gathered, source, group=communicator)
    expected = torch.arange(world_size, dtype=torch.float32).repeat_interleave(block)
    report = {"first_ok": bool(torch.equal(gathered, expected))}
    if rank == 1:
        return report  # leaves: its group is destroyed, its process exits

    def call() -> None:
        if kind == "allgather":
            mccl.all_gather_into_tensor(gathered, source, group=communicator)
        else:
            mccl.all_to_all_single(torch.empty(block * world_size), torch.ones(block * world_size), group=communicator)

    for attempt in ("first", "second"):
        try:
            call()
            report[attempt] = "no error"
        except PeerLost as error:
            report[attempt] = str(error)
    return report


@pytest.mark.parametrize("kind", ["allgather", "alltoall"])
def test_a_rank_that_disappears_is_named_and_the_communicator_refuses_to_go_on(kind):
    reports = run_ranks(_rank, 2, kind, timeout_s=60)
    assert reports[0]["first_ok"] and reports[1]["first_ok"]
    first, second = reports[0]["first"], reports[0]["second"]
    assert f"{kind} #2 failed on rank 0" in first
    # the eager driver waits on one peer and names it; the exchange driver's alltoallv cannot tell which
    assert ("rank 1 stopped answering" in first) if kind == "allgather" else ("stopped answering" in first)
    assert "cannot run collectives any more" in second and f"{kind} #2 failed" in second
