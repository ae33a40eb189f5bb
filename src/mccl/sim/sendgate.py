"""The simulator's send gate (MCCS §3.3 TS): a time-shared job starts flows only inside its windows.

A job with a gate (``Job.gate``, or one the closed-loop hook sets with
:meth:`~mccl.sim.closedloop.ControlView.gate`) holds every transfer that becomes ready
outside a window of its :class:`~mccl.telemetry.SendWindows`, and starts it when the next
window opens. A flow already started runs to its end: a NIC does not recall a posted send,
which is why the controller's windows carry a guard band (:mod:`mccl.control.tenancy.timeshare`).
Like a hot swap, a gate set by the hook applies from the job's next collective on, so one
collective never changes strategy in flight (MCCS §3.2); each running collective keeps the
gate it was launched with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from mccl.telemetry import SendWindows

__all__ = ["GateBook"]


class GateBook:
    """Gates by job (applied at launch) and by running collective (fixed at its launch)."""

    def __init__(self, gates: dict[str, SendWindows | None]) -> None:
        self.by_job: dict[str, SendWindows | None] = dict(gates)
        self.by_run: dict[int, SendWindows] = {}
        self.held = 0  # batches in which some collective's ready transfers were held

    def set(self, job: str, windows: SendWindows | None) -> None:
        """From the job's next launch on, gate it with ``windows`` (None: never gated)."""
        self.by_job[job] = windows

    def launched(self, slot: int, job: str) -> None:
        gate = self.by_job.get(job)
        if gate is not None:
            self.by_run[slot] = gate

    def finished(self, slot: int) -> None:
        self.by_run.pop(slot, None)

    def closed(self, slot: int, now: float, tolerance: float) -> bool:
        """True when the collective in ``slot`` may not start flows at ``now``."""
        gate = self.by_run.get(slot)
        if gate is None or gate.is_open(now + tolerance):
            return False
        self.held += 1
        return True

    def next_open(self, slots: Iterable[int], now: float, tolerance: float) -> float:
        """When the first of the held collectives ``slots`` may start sending again (inf: none held).

        Asked at ``now + tolerance``, as :meth:`closed` is, and never before it: a window edge
        computed in floating point may land a rounding error before itself, and the engine
        must move on."""
        upcoming = math.inf
        probe = now + tolerance
        for slot in slots:
            gate = self.by_run.get(slot)
            if gate is not None and not gate.is_open(probe):
                upcoming = min(upcoming, max(gate.next_open(probe), probe))
        return upcoming
