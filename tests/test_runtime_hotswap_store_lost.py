"""The hot-swap thread when the job's store dies with its process (rank 0's, under env://): the named
PeerLost, once, and the thread ends; never a raw store error per round.

The store is a real TCPStore served by a spawned process that is SIGKILLed; the communicator side is
the smallest object the swap thread calls back into (the thread's protocol, four methods)."""

from __future__ import annotations

import multiprocessing as mp
import queue
from datetime import timedelta

import pytest
import torch.distributed as dist

from mccl.errors import PeerLost
from mccl.runtime.hotswap import StoreControl, SwapThread

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(90)]


def _serve(ports: mp.Queue, stop: mp.Event) -> None:
    store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    ports.put(store.port)
    stop.wait(60)


class _Rank:
    """What SwapThread calls back into: one schedule to swap to, and what the thread reported."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.failures: list[str] = []
        self.controller_lost = False

    def _take_request(self, timeout: float) -> object | None:
        try:
            return self.requests.get(timeout=timeout)
        except queue.Empty:
            return None

    def _stage(self, schedule: object) -> str | None:
        return None

    def _sync_round(self, exchange):  # pragma: no cover - the store is gone before any exchange
        raise AssertionError("no round can be agreed without the store")

    def _swap_failed(self, reason: str) -> None:
        self.failures.append(reason)

    def _record(self, record: object) -> None:  # pragma: no cover
        raise AssertionError("no round can complete without the store")


@pytest.fixture()
def store_server():
    """(a client of a TCPStore served by another process, a function that SIGKILLs that process)."""
    context = mp.get_context("spawn")
    ports, stop = context.Queue(), context.Event()
    server = context.Process(target=_serve, args=(ports, stop), daemon=True)
    server.start()

    def kill() -> None:
        server.kill()
        server.join(timeout=10)

    try:
        store = dist.TCPStore("127.0.0.1", ports.get(timeout=60), 2, False, timeout=timedelta(seconds=10))
        store.set("alive", b"1")
        yield store, kill
    finally:
        if server.is_alive():
            server.kill()


def test_a_dead_store_is_a_named_peer_lost_and_the_swap_thread_ends(store_server):
    store, kill = store_server
    control = StoreControl(store, "mccl/control/job/", rank=1, size=2, timeout_s=5.0)  # connected at init
    kill()
    with pytest.raises(PeerLost, match="the job's store stopped answering"):
        control.allgather(1, b"{}")
    rank = _Rank()
    swapper = SwapThread(rank, control, poll_s=0.01)
    rank.requests.put(object())
    rank.requests.put(object())  # a second schedule: the thread has ended, nobody takes it
    swapper.thread.join(timeout=30)
    assert not swapper.thread.is_alive()
    assert len(rank.failures) == 1 and "the hot-swap control channel (round 1, ready) failed" in rank.failures[0]
    assert not rank.requests.empty()
