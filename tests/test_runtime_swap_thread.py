"""The hot-swap thread outlives a schedule source that fails in a way of its own (not ControllerError): the
communicator reports the controller lost, naming the failure, keeps its schedules, and takes the source back when
it answers again. Before, such a failure ended the thread — and every later swap — with nothing on the
communicator."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from mccl.runtime.communicator import Communicator  # noqa: E402
from mccl.runtime.hotswap import StoreControl  # noqa: E402
from mccl.runtime.transport import Transport  # noqa: E402


class FailingThenQuietSource:
    """Raises a bug's exception on its first ``failures`` polls, then answers "nothing new"."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.polls = 0

    def poll(self):
        self.polls += 1
        if self.polls <= self.failures:
            raise RuntimeError("malformed answer")
        return None


def test_a_failing_schedule_source_is_fail_static_and_taken_back():
    store = dist.HashStore()
    group = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=20))
    source = FailingThenQuietSource(failures=3)
    comm = Communicator(Transport(group, backend="gloo"), name="one", source=source,
                        control=StoreControl(store, "control/", 0, 1), poll_s=0.01)
    try:
        deadline = time.monotonic() + 10
        while source.polls < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert source.polls >= 8, "the swap thread stopped polling after the source failed"
        assert comm._swapper.thread.is_alive()
        events = list(comm.events)
        assert "controller lost: the schedule source failed: RuntimeError('malformed answer')" in events
        assert "controller answers again" in events and not comm.controller_lost
        output = torch.empty(4)
        comm.all_gather_into_tensor(output, torch.arange(4.0))  # collectives went on throughout
        assert torch.equal(output, torch.arange(4.0))
    finally:
        comm.close()
