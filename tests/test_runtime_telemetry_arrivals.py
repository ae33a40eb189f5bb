"""Waiter threads that time receives' arrivals (:mod:`mccl.runtime.arrivals`), on stand-in Works."""

import threading
import time

import pytest

from mccl.runtime.arrivals import ArrivalClock, TimedReceive, nic_payload_share, stamp


class _Work:
    """A Work whose wait blocks until ``finish``; a second wait would block for good, as gloo's would."""

    def __init__(self, error=None):
        self.done = threading.Event()
        self.error = error
        self.waits = 0

    def finish(self):
        self.done.set()

    def wait(self):
        self.waits += 1
        if self.waits > 1:
            raise AssertionError("a Work waited on twice")
        self.done.wait(5)
        if self.error is not None:
            raise self.error
        return True


def _until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_a_waiter_stamps_the_arrival_of_a_receive_nobody_is_waiting_for_and_it_polls_complete():
    clock = ArrivalClock(2)
    works = [_Work(), _Work()]
    timed = [clock.watch(w) for w in works]
    time.sleep(0.02)
    finished = time.perf_counter()
    works[1].finish()  # arrives while the executor would be waiting on works[0]
    _until(timed[1].is_completed)
    assert finished <= timed[1].arrived < finished + 1.0  # (late only by the thread's wake-up, under load)
    assert not timed[0].is_completed()
    works[0].finish()
    assert timed[0].wait() and timed[0].arrived is not None
    assert all(w.waits == 1 for w in works)
    clock.close()


def test_the_executor_waits_itself_on_a_receive_no_waiter_has_claimed_so_busy_waiters_cannot_stall_it():
    clock = ArrivalClock(1)
    blocked = clock.watch(_Work())  # the one waiter blocks on this (it completes only later)
    _until(lambda: blocked._claimed)
    mine = _Work()
    timed = clock.watch(mine)
    threading.Timer(0.02, mine.finish).start()
    assert timed.wait()  # claimed by the executor: no deadlock behind the busy waiter
    assert timed.arrived is not None and mine.waits == 1
    blocked.work.finish()
    clock.close()


def test_a_failed_wait_is_raised_to_the_executor_and_a_receive_done_before_its_wait_has_no_time():
    failing = _Work(RuntimeError("peer gone"))
    timed = TimedReceive(failing)
    failing.finish()
    with pytest.raises(RuntimeError, match="peer gone"):
        timed.wait()
    done = _Work()
    done.finish()
    early = TimedReceive(done)
    early.wait()
    assert early.arrived is None  # had completed before anyone waited: unknown
    assert stamp(0.0, now=0.0005) is None and stamp(0.0, now=0.002) == 0.002


def test_the_payload_share_is_none_without_a_counted_nic_and_a_full_segment_s_share_with_one():
    import socket

    assert nic_payload_share("lo") is None  # the loopback has no counter of this rank's own
    assert nic_payload_share("mccl-no-such") is None
    named = [name for _, name in socket.if_nameindex() if name != "lo"]
    if named:  # an MTU of at least 576 (IPv4's minimum) carries well over 0.6 of its bytes as payload
        share = nic_payload_share(named[0])
        assert share is None or 0.6 < share < 1.0
