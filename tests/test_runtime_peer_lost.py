"""A rank that disappears mid-run: every survivor gets a PeerLost that names it, and then refuses to go on.

Real gloo processes. A rank that *leaves* (returns after the first collective: its group
is destroyed and its process exits) and a rank that is *killed* (SIGKILL in the middle of
a collective, rank 2 or rank 0, the latter taking the job's store with it) must both be
named by every survivor, within ``MCCL_PEER_TIMEOUT`` rather than the process-group
timeout (60 s here), and a second call on the broken communicator must be refused.
"""

from __future__ import annotations

import pytest

from mccl.runtime.launch import run_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]  # gloo ranks in processes of their own

PEER_TIMEOUT_S = 5.0
KILL_AFTER_S = 0.1  # before the victim's first paced send (0.2 s) has arrived: every survivor is mid-collective


def _communicator(world_size: int):
    import mccl
    from mccl.synth.direct import direct_alltoall
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    topology = single_switch(world_size, 100)
    return mccl.init(topology=topology, schedules=[naive_ring(topology, "allgather"), direct_alltoall(topology)],
                     hot_swap=False)


def _call(kind: str, communicator, world_size: int, rank: int, block: int) -> None:
    import torch

    import mccl

    if kind == "allgather":
        mccl.all_gather_into_tensor(torch.empty(block * world_size), torch.full((block,), float(rank)),
                                    group=communicator)
    else:
        mccl.all_to_all_single(torch.empty(block * world_size), torch.ones(block * world_size), group=communicator)


def _attempts(kind: str, communicator, world_size: int, rank: int, block: int) -> dict:
    """Two calls on the (soon) broken communicator: what each raised, and how long the first took."""
    import time

    from mccl.errors import PeerLost

    report = {}
    for attempt in ("first", "second"):
        start = time.perf_counter()
        try:
            _call(kind, communicator, world_size, rank, block)
            report[attempt] = "no error"
        except PeerLost as error:
            report[attempt] = str(error)
        report[f"{attempt}_s"] = time.perf_counter() - start
    return report


def _leaving_rank(rank: int, world_size: int, kind: str) -> dict:
    import torch

    import mccl

    communicator = _communicator(world_size)
    block = 1 << 16
    source, gathered = torch.full((block,), float(rank)), torch.empty(block * world_size)
    mccl.all_gather_into_tensor(gathered, source, group=communicator)
    expected = torch.arange(world_size, dtype=torch.float32).repeat_interleave(block)
    report = {"first_ok": bool(torch.equal(gathered, expected))}
    if rank == 1:
        return report  # leaves: its group is destroyed, its process exits
    return report | _attempts(kind, communicator, world_size, rank, block)


@pytest.mark.parametrize("kind", ["allgather", "alltoall"])
def test_a_rank_that_leaves_is_named_and_the_communicator_refuses_to_go_on(kind, monkeypatch):
    monkeypatch.setenv("MCCL_PEER_TIMEOUT", str(PEER_TIMEOUT_S))
    reports = run_ranks(_leaving_rank, 2, kind, timeout_s=60)
    assert reports[0]["first_ok"] and reports[1]["first_ok"]
    first, second = reports[0]["first"], reports[0]["second"]
    assert f"{kind} #2 failed on rank 0" in first and "rank 1 stopped answering" in first
    assert "cannot run collectives any more" in second and f"{kind} #2 failed" in second


def _killed_rank(rank: int, world_size: int, kind: str, victim: int) -> dict | None:
    import os
    import signal
    import threading

    import mccl

    communicator = _communicator(world_size)
    block = 1 << 16
    mccl.barrier(group=communicator)
    if rank == victim:
        threading.Timer(KILL_AFTER_S, os.kill, (os.getpid(), signal.SIGKILL)).start()
        if kind == "allgather":
            # 256 KiB at 0.01 Gbit/s: each point-to-point send takes 0.2 s, so the kill lands mid-collective for
            # both survivors (rank 1 has its part once rank 0 forwarded the victim's block, 0.2 s in)
            communicator.transport.throttle([peer for peer in range(world_size) if peer != rank], 0.01)
            _call(kind, communicator, world_size, rank, block)
        # (AllToAll runs as one gloo alltoallv, which a pacer cannot slow: the victim dies before its turn)
        threading.Event().wait(60)  # the timer kills this process long before
        return None
    return _attempts(kind, communicator, world_size, rank, block)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "victim"), [("allgather", 2), ("alltoall", 0)])
def test_a_killed_rank_is_named_by_every_survivor_within_the_peer_timeout(kind, victim, monkeypatch):
    monkeypatch.setenv("MCCL_PEER_TIMEOUT", str(PEER_TIMEOUT_S))
    world_size = 3
    reports = run_ranks(_killed_rank, world_size, kind, victim, timeout_s=90, may_die=[victim])
    assert reports[victim] is None
    for rank in sorted(set(range(world_size)) - {victim}):
        report = reports[rank]
        assert f"{kind} #2 failed on rank {rank}" in report["first"], report
        assert f"rank {victim} stopped answering" in report["first"], report
        assert report["first_s"] < KILL_AFTER_S + PEER_TIMEOUT_S, report  # not the 60 s group timeout
        assert "cannot run collectives any more" in report["second"], report
