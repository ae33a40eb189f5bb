"""The executor's send gate (MCCS §3.3 TS): a time-shared job posts a collective's sends only in a window.

The controller computes a time-shared job's windows from the prioritized job's
telemetry (:mod:`mccl.control.tenancy.timeshare`) as a
:class:`~mccl.telemetry.SendWindows` on the wall clock. Before posting the sends of a
collective, the executor asks the gate (:meth:`SendGate.wait`), which sleeps until a
window is open. A change applies from a given sequence number on — the first
collective after the runtime's (min version, max seq) agreement (MCCS §3.2), so every
rank switches at the same collective, never in flight.

Granularity: the executor gates a whole collective (its sends are posted when the
gate opens, and run to their end); the simulator gates each flow
(:mod:`mccl.sim.sendgate`). The windows' guard band absorbs the difference for
collectives shorter than a window; a longer one overruns its window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from mccl.telemetry import SendWindows

__all__ = ["SendGate"]


class SendGate:
    """Holds sends outside windows. ``clock`` (s) and ``sleep`` are injectable for tests."""

    def __init__(self, windows: SendWindows | None = None, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._lock = threading.Lock()
        self._changes: list[tuple[int, SendWindows | None]] = [(0, windows)]
        self.clock = clock
        self.sleep = sleep
        self.waited_s = 0.0  # total time held, for telemetry and tests
        self.held = 0  # collectives that had to wait

    def update(self, windows: SendWindows | None, from_seq: int) -> None:
        """Gate with ``windows`` (None: never hold) from collective ``from_seq`` on."""
        with self._lock:
            self._changes = [change for change in self._changes if change[0] < from_seq]
            self._changes.append((from_seq, windows))

    def windows_for(self, seq: int) -> SendWindows | None:
        with self._lock:
            chosen = self._changes[0][1]
            for start, windows in self._changes:
                if start <= seq:
                    chosen = windows
            return chosen

    def wait(self, seq: int) -> float:
        """Block until collective ``seq`` may post its sends; returns the seconds held."""
        windows = self.windows_for(seq)
        if windows is None:
            return 0.0
        began = now = self.clock()
        while not windows.is_open(now):
            self.sleep(max(windows.next_open(now) - now, 0.0))
            now = self.clock()
        held = now - began
        if held > 0:
            self.held += 1
            self.waited_s += held
        return held
