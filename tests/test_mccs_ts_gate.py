"""The send gate remembers the windows it enforced per collective (issue 16, the flaky TS ranks test).

A collective whose version's windows have not reached the gate runs under the newest older ones
(fail-static, when the controller does not answer the gate's ask); asked afterwards, ``windows_for``
gives the version's windows, which the collective never had. A check of the gate must compare sends
with :attr:`SendGate.enforced`.
"""

from __future__ import annotations

from mccl.errors import ControllerError
from mccl.runtime.sendgate import SendGate
from mccl.telemetry import SendWindows


def test_a_collective_that_ran_before_its_versions_windows_arrived_keeps_what_it_enforced():
    late = SendWindows(0.0, 1.0, ((0.5, 0.9),))
    answers: list = [ControllerError("no answer in time")]

    def fetch():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    gate = SendGate(version_of={1: 1, 2: 2, 3: 2}.get, fetch=fetch, clock=lambda: 0.7, sleep=lambda s: None)
    gate.offer(1, None)
    assert gate.wait(2) == 0.0  # version 2's windows unknown, the ask fails: version 1's (none) enforced
    assert gate.fetch_failures == 1 and gate.enforced[2] is None
    gate.offer(2, late)  # they arrive (the windows feed) after collective 2 ran
    assert gate.windows_for(2) == late and gate.enforced[2] is None  # asked now, not what was enforced
    gate.wait(3)
    assert gate.enforced[3] == late


def test_the_enforced_log_is_bounded():
    gate = SendGate()
    for seq in range(5000):
        gate.wait(seq)
    assert len(gate.enforced) == 4096 and min(gate.enforced) == 5000 - 4096
