"""The liveness mesh (mccl.runtime.liveness) on its own: three ranks as threads of one process, a
real TCP mesh over loopback, a torch HashStore for the addresses. A rank whose connections close
without a goodbye is lost at once and gossiped; one that falls silent is lost after the timeout;
one that says goodbye is a departure, not a loss."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from mccl.errors import MCCLError
from mccl.runtime.liveness import Liveness, peer_timeout_s

pytestmark = pytest.mark.timeout(60)


def _mesh(size: int, timeout_s: float, **hooks) -> list[Liveness]:
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=20))
    made: dict[int, Liveness] = {}
    threads = [threading.Thread(target=lambda r=rank: made.__setitem__(r, Liveness(store, r, size,
                                                                                   timeout_s=timeout_s, **hooks)))
               for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return [made[rank] for rank in range(size)]


def _until(predicate, seconds: float = 10.0) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > seconds:
            raise AssertionError("condition not reached")
        time.sleep(0.005)
    return time.monotonic() - start


def test_a_rank_whose_connections_close_is_lost_at_once_by_every_other():
    lost_calls: list[int] = []
    ranks = _mesh(3, 30.0, on_loss=lost_calls.append)
    try:
        ranks[2]._stop = True  # the thread closes its sockets without a goodbye: what the kernel does at a kill
        elapsed = _until(lambda: ranks[0].lost.is_set() and ranks[1].lost.is_set())
        assert elapsed < 10.0  # end-of-file (the victim notices _stop within its 1 s beat), not the 30 s timeout
        for survivor in ranks[:2]:
            assert survivor.first_lost().rank == 2
            assert "connection closed" in survivor.first_lost().how or "lost it" in survivor.first_lost().how
        assert lost_calls.count(2) == 2 and set(lost_calls) == {2}  # once per survivor, for the first loss
    finally:
        for rank in ranks:
            rank._stop = True


def test_a_silent_rank_is_lost_after_the_timeout_while_waited_on_and_named():
    waiting = {"on": None}
    ranks = _mesh(3, 0.4, waits_on=lambda rank: waiting["on"] == rank)
    try:
        ranks[1]._broadcast = lambda message: None  # alive, connected, but no heartbeat (a hung process)
        time.sleep(0.8)
        assert not ranks[0].lost.is_set()  # silence alone, while nothing waits on it, is not a loss
        waiting["on"] = 1
        elapsed = _until(lambda: ranks[0].lost.is_set() and ranks[2].lost.is_set())
        assert elapsed < 5.0
        assert ranks[0].first_lost().rank == 1 and ranks[2].first_lost().rank == 1
        assert any("no heartbeat" in rank.first_lost().how for rank in (ranks[0], ranks[2]))
    finally:
        for rank in ranks:
            rank._stop = True


def test_a_goodbye_is_a_departure_and_becomes_a_loss_only_while_waited_on():
    waiting = {"on": None}
    ranks = _mesh(2, 0.3, waits_on=lambda rank: waiting["on"] == rank)
    try:
        ranks[1].close()
        _until(lambda: 1 in ranks[0].departed)
        time.sleep(0.6)
        assert not ranks[0].lost.is_set()  # nobody waits on it: leaving after the last collective is fine
        assert ranks[0].explain(1, grace_s=0).how == "it left the group"
        waiting["on"] = 1
        _until(lambda: ranks[0].lost.is_set(), 5.0)
        assert ranks[0].first_lost().rank == 1 and "left the group" in ranks[0].first_lost().how
    finally:
        ranks[0]._stop = True


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon", "1e9"])
def test_a_bad_peer_timeout_is_refused(value, monkeypatch):
    monkeypatch.setenv("MCCL_PEER_TIMEOUT", value)
    with pytest.raises(MCCLError, match="MCCL_PEER_TIMEOUT"):
        peer_timeout_s()


def test_the_peer_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("MCCL_PEER_TIMEOUT", raising=False)
    assert peer_timeout_s() == 10.0
    monkeypatch.setenv("MCCL_PEER_TIMEOUT", "2.5")
    assert peer_timeout_s() == 2.5
