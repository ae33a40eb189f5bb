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
