"""The executor's send gate (MCCS §3.3 TS): a time-shared job posts its sends only inside windows.

The controller computes a time-shared job's windows from the prioritized job's
telemetry (:mod:`mccl.control.tenancy.timeshare`) as a
:class:`~mccl.telemetry.SendWindows` on the wall clock, and serves them over its
channel (the ``windows`` message, :mod:`mccl.control.tenancy.live`). Two holds:

* before a collective posts anything, the executor asks :meth:`SendGate.wait`, which
  sleeps until a window is open;
* before each send, the transport asks :meth:`SendGate.hold_send` (installed by
  :func:`attach`), so a collective longer than what is left of its window stops
  posting at the window's end and goes on at the next one — as the simulator's gate
  holds each flow (:mod:`mccl.sim.sendgate`). A send already posted runs to its end
  (a NIC does not recall a posted send); the windows' guard band covers that.

Which windows a collective uses, so every rank gates the same collective the same way:

* by sequence number: :meth:`SendGate.update` (``windows``, ``from_seq``);
* by schedule version (what :func:`attach` sets up for a rank fed by the controller):
  the controller gives every plan a new version when its windows change, and serves
  (version, windows); a collective is gated by the windows of the version it runs
  (``version_of(seq)``), so the windows switch exactly where the schedule does — at the
  collective after the runtime's (min version, max seq) agreement (MCCS §3.2), never in
  flight. A collective whose version's windows have not arrived yet makes the gate ask
  the controller once (``fetch``); failing that it keeps the newest older windows
  (fail-static, as the executor keeps its schedule).

Collectives torch runs itself (the delegated path, the ReduceScatter half of an AllReduce)
do not pass the executor and are not gated.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from mccl.errors import MCCLError
from mccl.telemetry import SendWindows

__all__ = ["SendGate", "WindowsFeed", "attach"]

log = logging.getLogger("mccl.runtime")

ENFORCED_KEPT = 4096  # collectives whose enforced windows a gate remembers (as a communicator's history)

Fetch = Callable[[], tuple[int, SendWindows | None]]
"""The controller's answer for this communicator: (plan version, its windows or None)."""


class SendGate:
    """Holds sends outside windows (module docstring). ``clock`` (s) and ``sleep`` are injectable for
    tests; ``version_of(seq)``: the schedule version collective ``seq`` runs (None: unknown);
    ``fetch``: asks the controller for the current (version, windows)."""

    def __init__(self, windows: SendWindows | None = None, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, version_of: Callable[[int], int | None] | None = None,
                 fetch: Fetch | None = None) -> None:
        self._lock = threading.Lock()
        self._changes: list[tuple[int, SendWindows | None]] = [(0, windows)]
        self._by_version: dict[int, SendWindows | None] = {}
        self._current: SendWindows | None = None  # the windows of the collective now posting sends
        self.clock = clock
        self.sleep = sleep
        self.version_of = version_of
        self.fetch = fetch
        self.waited_s = 0.0  # total time held, for telemetry and tests
        self.held = 0  # collectives that had to wait before their first send
        self.held_sends = 0  # sends held inside a collective (its window closed meanwhile)
        self.fetch_failures = 0  # asks to the controller that failed (the newest older windows stayed in force)
        # the windows each collective was gated by, as enforced (by seq; the last ENFORCED_KEPT): what a check of
        # the gate must compare sends with — the windows of a collective's version can arrive after it ran
        # (a slow controller: fail-static), and then windows_for(seq) asked later differs from what was enforced
        self.enforced: collections.OrderedDict[int, SendWindows | None] = collections.OrderedDict()

    def update(self, windows: SendWindows | None, from_seq: int) -> None:
        """Gate with ``windows`` (None: never hold) from collective ``from_seq`` on."""
        with self._lock:
            self._changes = [change for change in self._changes if change[0] < from_seq]
            self._changes.append((from_seq, windows))

    def offer(self, version: int, windows: SendWindows | None) -> bool:
        """The windows of schedule ``version`` (from the controller); True when they are new here."""
        with self._lock:
            known = version in self._by_version and self._by_version[version] == windows
            self._by_version[version] = windows
            if len(self._by_version) > 64:  # old versions no collective runs any more
                for old in sorted(self._by_version)[:-64]:
                    del self._by_version[old]
            return not known

    def _by_seq(self, seq: int) -> SendWindows | None:
        chosen = self._changes[0][1]
        for start, windows in self._changes:
            if start <= seq:
                chosen = windows
        return chosen

    def windows_for(self, seq: int) -> SendWindows | None:
        """The windows collective ``seq`` is gated by (module docstring)."""
        version = self.version_of(seq) if self.version_of is not None else None
        if version is not None and self.fetch is not None:
            with self._lock:
                missing = not self._by_version or version > max(self._by_version)
            if missing:
                self._refresh()
        with self._lock:
            if version is None or not self._by_version:
                return self._by_seq(seq)
            older = [known for known in self._by_version if known <= version]
            return self._by_version[max(older)] if older else self._by_seq(seq)

    def _refresh(self) -> None:
        try:
            version, windows = self.fetch()
        except MCCLError as error:  # fail-static: the newest windows known stay in force
            self.fetch_failures += 1
            log.warning("mccl: no send windows from the controller (%s); keeping the last ones", error)
            return
        self.offer(version, windows)

    def _hold(self, windows: SendWindows) -> float:
        began = now = self.clock()
        while not windows.is_open(now):
            self.sleep(max(windows.next_open(now) - now, 0.0))
            now = self.clock()
        return now - began

    def wait(self, seq: int) -> float:
        """Block until collective ``seq`` may post its sends; returns the seconds held."""
        windows = self._current = self.windows_for(seq)
        self.enforced[seq] = windows
        if len(self.enforced) > ENFORCED_KEPT:
            self.enforced.popitem(last=False)
        if windows is None:
            return 0.0
        held = self._hold(windows)
        if held > 0:
            self.held += 1
            self.waited_s += held
        return held

    def hold_send(self) -> None:
        """Before one send of the current collective: block while its window is closed."""
        windows = self._current
        if windows is None:
            return
        held = self._hold(windows)
        if held > 0:
            self.held_sends += 1
            self.waited_s += held


class WindowsFeed:
    """A thread that asks the controller for this communicator's windows every ``interval_s`` and
    offers them to the gate, so they are known before the collectives of their version run."""

    def __init__(self, gate: SendGate, fetch: Fetch, interval_s: float = 0.1) -> None:
        self.gate = gate
        self.fetch = fetch
        self.interval_s = interval_s
        self.received = 0
        self.failures = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="mccl-sendwindows", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version, windows = self.fetch()
                if self.gate.offer(version, windows):
                    self.received += 1
            except MCCLError as error:
                self.failures += 1
                if self.failures == 1:
                    log.warning("mccl: the controller did not send windows (%s); keeping the last ones", error)
            self._stop.wait(self.interval_s)  # idle wait: no GIL-holding spin

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)


def attach(communicator: object, fetch: Fetch, *, interval_s: float = 0.1) -> tuple[SendGate, WindowsFeed]:
    """Gate ``communicator`` (a :class:`~mccl.runtime.communicator.Communicator`) by the windows the
    controller serves for it (``fetch``, e.g. :func:`mccl.control.tenancy.live.windows_fetcher`): the
    gate resolves a collective's windows by the schedule version it runs (from the communicator's
    launch history) and holds every send of the executor. Call on every rank; stop the feed at the end."""
    history = communicator.history  # (seq, collective, version) of every launch, in order

    def version_of(seq: int) -> int | None:
        for launched, _kind, version in reversed(list(history)):  # a copy: launches append meanwhile
            if launched == seq:
                return version
            if launched < seq:
                break
        return None

    gate = SendGate(version_of=version_of, fetch=fetch)
    communicator.send_gate = gate
    communicator.transport.before_send = gate.hold_send
    return gate, WindowsFeed(gate, fetch, interval_s)
