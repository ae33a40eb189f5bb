"""Issue 13, hot swap: ranks agree on schedule content, not only on version numbers.

Two gloo ranks stage *different* valid schedules under the same version: neither is adopted, both
ranks report the same clear conflict, collectives stay exact on the old schedule, and a later
consistent version is adopted normally.
"""

from __future__ import annotations

import json
import time
import warnings

import pytest

from mccl.runtime.hotswap import agree, conflicts, encode
from mccl.runtime.launch import run_ranks
from mccl.schedule.serialize import schedule_digest
from mccl.synth.ring import naive_ring, nccl_ring
from mccl.topology import single_switch

N = 2


def test_agreement_pairs_versions_with_digests():
    same = encode(7, {"allgather": [[2, "aaa"]]})
    other = encode(9, {"allgather": [[2, "bbb"], [3, "ccc"]]})
    third = encode(8, {"allgather": [[3, "ccc"]]})
    assert agree([same, other]) == (9, {})  # version 2 under two contents: not adopted
    assert conflicts([same, other]) and "allgather version 2" in conflicts([same, other])[0]
    assert agree([other, third]) == (9, {"allgather": 3})
    assert conflicts([same, other, third], {"allgather": 3}) == []  # moot once a newer version is adopted
    assert json.loads(same)["staged"]["allgather"] == [[2, "aaa"]]


def test_digest_is_content_not_metadata():
    topology = single_switch(4, 100)
    one = naive_ring(topology, "allgather")
    assert schedule_digest(one) == schedule_digest(one.with_meta(version=5, synthesizer="x"))
    assert schedule_digest(one) != schedule_digest(naive_ring(topology, "allgather", chunks=2))


def _ranks(rank: int, n: int) -> dict:
    import torch
    import torch.distributed as dist

    import mccl

    warnings.filterwarnings("ignore", category=FutureWarning)
    topology = single_switch(n, 100)
    old = naive_ring(topology, "allgather")
    mine = (naive_ring(topology, "allgather", chunks=2) if rank == 0 else
            nccl_ring(topology, "allgather", chunks=3)).with_meta(version=2)
    comm = mccl.init(topology=topology, schedules=[old])

    def exact(salt: int) -> bool:
        x = (torch.arange(11, dtype=torch.float32) + 13 * rank + salt) % 97
        out, ref = torch.empty(n * 11), torch.empty(n * 11)
        comm.all_gather_into_tensor(out, x)
        dist.all_gather_into_tensor(ref, x)
        return torch.equal(out, ref)

    ok = exact(0)
    comm.stage(mine)
    deadline = time.monotonic() + 30
    while not comm.swaps and time.monotonic() < deadline:
        ok &= exact(1)
        time.sleep(0.01)
    for salt in range(2, 8):
        ok &= exact(salt)
    after_conflict = comm.versions()
    events = [event for event in comm.events if "different schedules" in event]
    comm.stage(nccl_ring(topology, "allgather", chunks=2).with_meta(version=3))
    while len(comm.swaps) < 2 and time.monotonic() < deadline:
        ok &= exact(9)
        time.sleep(0.01)
    for salt in range(10, 14):
        ok &= exact(salt)
    result = {"exact": ok, "after_conflict": after_conflict, "events": events, "final": comm.versions(),
              "conflict_events_total": sum("different schedules" in event for event in comm.events)}
    comm.close()
    return result


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_different_schedules_under_one_version_are_refused_on_every_rank():
    results = run_ranks(_ranks, N, timeout_s=100)
    for result in results:
        assert result["exact"]
        assert result["after_conflict"] == {"allgather": 0}  # the old schedule kept
        assert len(result["events"]) == 1 and "allgather version 2" in result["events"][0]
        assert result["final"] == {"allgather": 3}  # a consistent later version still goes through
        assert result["conflict_events_total"] == 1  # and does not report the moot conflict again
    assert results[0]["events"] == results[1]["events"]  # the same words on every rank


def _recovering_rank(rank: int, n: int, endpoint: str, secret: str, folder: str) -> dict:
    import pathlib

    import torch
    import torch.distributed as dist

    import mccl
    from mccl.control import ControllerClient

    warnings.filterwarnings("ignore", category=FutureWarning)
    topology = single_switch(n, 100)
    first = naive_ring(topology, "allgather").with_meta(version=1)
    client = ControllerClient(endpoint, "job", rank, installed=[first], timeout_s=0.5, interval_s=0.02, secret=secret)
    comm = mccl.init(topology=topology, schedules=[first], controller=client, name="job")
    lost_seen = False
    ok = True
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        x = torch.full((8,), float(rank))
        out, ref = torch.empty(8 * n), torch.empty(8 * n)
        comm.all_gather_into_tensor(out, x)
        dist.all_gather_into_tensor(ref, x)
        ok &= bool(torch.equal(out, ref))
        if comm.controller_lost and not lost_seen:
            lost_seen = True
            pathlib.Path(folder, f"lost{rank}").touch()
        flags = torch.tensor([int(comm.versions().get("allgather", 0) >= 2)])
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)  # stop together, once every rank runs version 2
        if lost_seen and flags.item():
            break
        time.sleep(0.02)
    result = {"exact": ok, "lost_seen": lost_seen, "lost_now": comm.controller_lost, "versions": comm.versions(),
              "recoveries": client.recoveries, "events": [e for e in comm.events if "controller" in e]}
    comm.close()
    client.close()
    return result


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_ranks_take_a_controller_back_when_it_answers_again(tmp_path):
    """The controller stops answering (ranks go fail-static), then a controller answers at the same
    endpoint again: the clients recover, the runtime polls again and adopts its newer version."""
    import threading

    from mccl.control import ControllerService, ScheduleManager
    from mccl.control.auth import new_secret
    from mccl.runtime.launch import free_port

    topology = single_switch(N, 100)
    endpoint, secret = f"tcp://127.0.0.1:{free_port()}", new_secret()
    first = ScheduleManager(topology)
    first.register("job", naive_ring(topology, "allgather").with_meta(version=1))
    service = ControllerService(first, endpoint, secret=secret).start()
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(run_ranks(
        _recovering_rank, N, endpoint, secret.hex, str(tmp_path), timeout_s=120)))
    runner.start()
    time.sleep(3.0)  # the ranks start and poll the first controller
    service.stop()
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"lost{rank}").exists() for rank in range(N)):
        assert time.monotonic() < deadline and runner.is_alive(), "the ranks never declared the controller lost"
        time.sleep(0.05)
    second = ScheduleManager(topology)
    second.register("job", nccl_ring(topology, "allgather", chunks=2).with_meta(version=2))
    service = ControllerService(second, endpoint, secret=secret).start()
    try:
        runner.join(timeout=120)
    finally:
        service.stop()
    assert len(results) == N
    for result in results:
        assert result["exact"] and result["lost_seen"] and not result["lost_now"]
        assert result["versions"] == {"allgather": 2} and result["recoveries"] >= 1
        assert any("answers again" in event for event in result["events"])
