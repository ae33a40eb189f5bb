"""TS over the controller channel (issue 16): the prioritized job's telemetry in, windows out by version.

In-process over real ZeroMQ (the authenticated service and client); the multiprocess test with
gloo ranks is in ``test_mccs_ts_ranks.py``.
"""

from __future__ import annotations

import time

import pytest

from mccl.control import ControllerClient, ControllerService
from mccl.control.tenancy import TenancyController, TenantJob
from mccl.control.tenancy.live import BusyTracker, TenancyManager, windows_fetcher, windows_field, windows_of
from mccl.errors import ControllerError
from mccl.runtime.sendgate import SendGate
from mccl.schedule import Collective
from mccl.telemetry import Sample, SendWindows
from mccl.topology import spine_leaf

pytestmark = pytest.mark.timeout(60)


def _tenancy() -> TenancyController:
    controller = TenancyController(spine_leaf(2, 2, 2, 2, 100, 50), "pfa+ts", time_shared=("b",), guard_s=0.01)
    controller.register(TenantJob("a", ("gpu0", "gpu4"), priority=1))
    controller.register(TenantJob("b", ("gpu1", "gpu5")))
    return controller


def _iteration(job: str, seq: int, start: float, busy: float) -> list[Sample]:
    """Both ranks' samples of one collective: rank 0 busy the whole span, rank 1 the middle of it."""
    return [Sample("inter", job, 0, 1, 10**7, busy, start + busy, seq),
            Sample("inter", job, 1, 0, 10**7, busy / 2, start + 0.75 * busy, seq)]


def test_windows_field_round_trip_and_refusals():
    windows = SendWindows(12.5, 0.4, ((0.11, 0.2), (0.25, 0.39)))
    assert windows_of(windows_field(windows)) == windows and windows_of(windows_field(None)) is None
    for bad in ([1.0, 0.4], [1.0, 0.4, [[0.1, "x"]]], [1.0, 0.4, [[0.3, 0.1]]], [1.0, -1, [[0.1, 0.2]]],
                [1.0, 0.4, [[0.1, 0.2, 0.3]]], "0.1"):
        with pytest.raises(ControllerError, match="windows"):
            windows_of(bad)


def test_busy_tracker_merges_ranks_and_batches_per_collective():
    tracker = BusyTracker(settle_s=0.0)
    rank0, rank1 = _iteration("a", 7, 100.0, 0.1)
    tracker.add("a", [rank0])
    assert tracker.take() == {}  # seq 7 may still get samples: nothing later reported yet
    tracker.add("a", [rank1, *_iteration("a", 8, 100.5, 0.1)])
    taken = tracker.take()
    assert taken == {"a": [pytest.approx((100.0, 100.1))]}  # one interval, from both ranks' samples
    tracker.add("a", [rank1])  # a late sample of a collective already handed out is not counted again
    assert tracker.take() == {}


def _submit(sender: ControllerClient, samples: list) -> None:
    """Submit until the client kept them: its telemetry socket drops (``dropped``) what it cannot take now — all
    of it before its connection is up, which on a loaded machine can outlast the first submits (a run of this
    test got no windows in 20 s that way)."""
    deadline = time.monotonic() + 20
    while True:
        dropped = sender.dropped
        sender.submit(samples)
        if sender.dropped == dropped:
            return
        assert time.monotonic() < deadline, "the controller client never took the telemetry"
        time.sleep(0.02)


def test_prioritized_telemetry_becomes_windows_served_by_version():
    tenancy = _tenancy()
    manager = TenancyManager(tenancy, settle_s=0.0)
    service = ControllerService(manager, "tcp://127.0.0.1:*", check_interval_s=0.01).start()
    client = ControllerClient(service.address, "b", 0, secret=service.secret)
    sender = ControllerClient(service.address, "a", 0, secret=service.secret)
    try:
        fetch = windows_fetcher(client)
        first, windows = fetch()
        assert windows is None and first == manager.latest("b", Collective.ALLREDUCE)[0]
        base = time.time() - 10
        for seq in range(7):  # 100 ms busy every 500 ms
            _submit(sender, _iteration("a", seq, base + 0.5 * seq, 0.1))
        deadline = time.monotonic() + 20
        while (version := fetch())[1] is None:
            assert time.monotonic() < deadline, "no windows after the prioritized job's telemetry"
            time.sleep(0.02)
        gated, windows = version
        # windows ride a plan version; they are served first (TenancyManager.publish), its registration follows
        while manager.latest("b", Collective.ALLREDUCE)[0] < gated and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gated > first and manager.latest("b", Collective.ALLREDUCE)[0] == gated
        assert windows.period_s == pytest.approx(0.5) and windows.windows[0][0] >= 0.11 - 1e-6
        # a pattern that holds does not churn versions; a new one (period 0.8 s) makes a new version
        for seq in range(7, 9):
            _submit(sender, _iteration("a", seq, base + 0.5 * seq, 0.1))
        time.sleep(0.5)
        assert fetch()[0] == gated
        for seq in range(9, 30):
            _submit(sender, _iteration("a", seq, base + 4.5 + 0.8 * (seq - 9), 0.1))
        # (while the two rhythms mix, the spread of the starts leaves no idle time: no windows, b runs as PFA)
        while (update := fetch())[1] is None or update[1].period_s == pytest.approx(0.5):
            assert time.monotonic() < deadline + 20, "the windows did not follow the new pattern"
            time.sleep(0.02)
        assert update[0] > gated and update[1].period_s == pytest.approx(0.8)
        with pytest.raises(ControllerError, match="no tenant job"):
            ControllerClient(service.address, "nobody", 0, secret=service.secret).request("windows", communicator="z")
    finally:
        client.close()
        sender.close()
        service.stop()


def test_gate_applies_the_windows_of_the_version_a_collective_runs():
    now = [100.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    running = {1: 1, 2: 1, 3: 2, 4: 2}  # seq -> schedule version (the agreement switched after seq 2)
    served = [(2, SendWindows(0.0, 1.0, ((0.5, 0.6),)))]
    gate = SendGate(clock=lambda: now[0], sleep=sleep, version_of=running.get, fetch=lambda: served[-1])
    gate.offer(1, None)
    assert gate.wait(2) == 0.0  # version 1: not gated
    assert gate.wait(3) == pytest.approx(0.5)  # version 2's windows, fetched on first use
    now[0] = 100.65
    gate.hold_send()  # the window closed during the collective: the next send waits for the next one
    assert now[0] == pytest.approx(101.5) and gate.held_sends == 1
