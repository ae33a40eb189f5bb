"""The reaction path's threads above the collective's (:mod:`mccl.runtime.priority`, issue 15): per-thread niceness,
inherited by threads started in a raised block, and the hot-swap thread raising itself when its communicator asks."""

from __future__ import annotations

import os
import threading

import pytest

from mccl.runtime.hotswap import SwapThread
from mccl.runtime.priority import raise_thread_priority, raised, thread_nice

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _in_thread(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_a_negative_step_is_refused_by_name():
    with pytest.raises(ValueError, match="non-negative"):
        raise_thread_priority(-1)


@pytest.mark.skipif(not ROOT, reason="lowering niceness needs CAP_SYS_NICE (root)")
def test_raised_lowers_this_threads_niceness_for_the_block_and_threads_started_in_it_keep_it():
    def body():
        before = thread_nice()
        with raised(3) as ok:
            assert ok and thread_nice() == max(before - 3, -20)
            child = _in_thread(lambda: (thread_nice(), _in_thread(thread_nice)))
        return before, thread_nice(), child

    before, after, (child, grandchild) = _in_thread(body)
    assert after == before  # restored
    assert child == grandchild == max(before - 3, -20)  # the thread started inside keeps it, and its own threads too


def test_raised_none_changes_nothing():
    def body():
        before = thread_nice()
        with raised(None) as ok:
            return ok, before, thread_nice()

    ok, before, inside = _in_thread(body)
    assert not ok and inside == before


class _Communicator:
    """What the swap thread calls back (hotswap.SwapThread's contract), recording its thread's niceness."""

    def __init__(self, steps: int) -> None:
        self.swap_priority = steps
        self.events: list[str] = []
        self.seen = threading.Event()
        self.nice: int | None = None

    def _take_request(self, timeout: float):
        self.nice = thread_nice()
        self.seen.set()
        threading.Event().wait(timeout)
        return None


@pytest.mark.skipif(not ROOT, reason="lowering niceness needs CAP_SYS_NICE (root)")
def test_the_swap_thread_runs_swap_priority_steps_above_the_thread_that_made_it():
    made_at = thread_nice()
    comm = _Communicator(4)
    swapper = SwapThread(comm, control=None, poll_s=0.01)
    try:
        assert comm.seen.wait(5)
        assert comm.nice == max(made_at - 4, -20) and comm.events == []
    finally:
        swapper.stop()
