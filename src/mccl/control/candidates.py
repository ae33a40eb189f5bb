"""Candidates: a synthesis made ahead of the flag, pushed to the ranks before the flag (issue 15, the reaction path).

When the manager synthesizes ahead for a drifting schedule (:mod:`.ahead`), the result is the
schedule it will issue at the flag if the capacities stay near (and the guard picks it). The
service sends it at once, as a ``candidate`` message, to every polling socket that asked for
candidates (``"candidates": true`` in its poll; :class:`~mccl.control.client.ControllerClient`
``candidates=True``): version = the active one + 1, the schedule file's text. A rank does not
adopt a candidate — it only *prepares* it (parse, validate, pre-build its plan,
:meth:`mccl.runtime.communicator.Communicator._prestage`), so that when the issued version arrives
with the same content (the schedule digest, which leaves out metadata such as the version) its
staging is a lookup: the work of decoding, validating and planning leaves the path from the flag to
the swap, and it was done while the ranks were otherwise waiting on their links.

Activation by digest (seventh session). A candidate frame carries its schedule digest, and the service
remembers which digest each socket was sent last. When the version issued has the digest a socket was
sent as a candidate, that socket is pushed a short ``activate`` frame — collective, version, digest —
instead of the schedule (:meth:`mccl.control.messages.Requests.pushes`); the client hands over the
candidate it kept under that digest, with the issued version, so no schedule is encoded, sent or
parsed on the path (on a busy rank each of those waits for a core and the GIL). A client that no longer
has it asks at once, and the poll's answer is the whole schedule, as before; a socket that was never
sent the candidate, or a guard that chose another schedule, gets the whole schedule pushed. What ranks
stage and agree on is unchanged: (version, digest) pairs, the digest computed by each rank.

Bounds: one candidate per (communicator, collective), dropped once the active version moved past
the one it was made for; sockets remembered as in :class:`~mccl.control.messages.Requests`
(``max_subscribers``). Threads: :meth:`refresh` runs where the snapshot is refreshed (the check
thread), :meth:`subscribe` and :meth:`pushes` on the socket thread; the hand-over is one queue.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from mccl.control.protocol import encode
from mccl.schedule import Collective, dumps_schedule
from mccl.schedule.serialize import schedule_digest

__all__ = ["CandidatePushes"]


class CandidatePushes:
    """The candidates of the held speculations and who has been sent which (module docstring)."""

    def __init__(self, max_subscribers: int) -> None:
        self.max_subscribers = max_subscribers
        # (communicator, collective) -> (serial, base version, frame, digest); replaced whole by the refreshing thread
        self._frames: dict[tuple[str, Collective], tuple[int, int, bytes, str]] = {}
        # (communicator, collective) -> {socket: digest of the last candidate it was sent} (socket thread only)
        self._holding: dict[tuple[str, Collective], dict[bytes, str]] = {}
        self._fresh: queue.SimpleQueue[bool] = queue.SimpleQueue()  # something to push (socket thread reads it)
        self._wanted: dict[str, set[bytes]] = {}  # communicator -> sockets that asked for candidates
        self._count = 0
        self._sent: dict[tuple[str, Collective], tuple[int, set[bytes]]] = {}  # serial pushed -> to whom
        self.encoded = 0
        self.pushed = 0
        # wall clock of each candidate's first push: (communicator, collective, version it would be) -> time
        self.pushed_at: dict[tuple[str, str, int], float] = {}

    def refresh(self, held: dict, active: Callable[[str, Collective], int | None]) -> bool:
        """Encode a candidate for every held speculation still made for its schedule's active version
        (``active(communicator, collective)``); drop the others. True when there is a new one to push."""
        frames: dict[tuple[str, Collective], tuple[int, int, bytes, str]] = {}
        new = False
        for key, speculation in held.items():
            name, kind = key
            if active(name, kind) != speculation.version:
                continue
            kept = self._frames.get(key)
            if kept is not None and kept[0] == speculation.serial:
                frames[key] = kept
                continue
            version = speculation.version + 1
            schedule = speculation.result.schedule.with_meta(version=version)
            digest = schedule_digest(schedule)
            frames[key] = (speculation.serial, speculation.version,
                           encode("candidate", communicator=name, collective=kind.value, version=version,
                                  schedule=dumps_schedule(schedule), digest=digest), digest)
            self.encoded += 1
            new = True
        self._frames = frames
        if new:
            self._fresh.put(True)
        return new

    def subscribe(self, communicator: str, identity: bytes) -> None:
        """A socket that asked for candidates (socket thread); a new one is sent what is held."""
        sockets = self._wanted.setdefault(communicator, set())
        if identity not in sockets and self._count < self.max_subscribers:
            sockets.add(identity)
            self._count += 1
            self._fresh.put(True)

    def holders(self, communicator: str, kind: Collective) -> bool:
        """Whether some socket was sent a candidate of (communicator, kind) (any thread: a read)."""
        return bool(self._holding.get((communicator, kind)))

    def sent_digest(self, communicator: str, kind: Collective, identity: bytes) -> str | None:
        """The digest of the last candidate of (communicator, kind) sent to ``identity`` (socket thread), None if
        none was: when the issued version has it, an ``activate`` frame suffices (module docstring)."""
        return self._holding.get((communicator, kind), {}).get(identity)

    def pushes(self) -> list[tuple[bytes, bytes]]:
        """(identity, candidate frame) for every socket that wants candidates and was not sent the current one
        of its communicator (socket thread)."""
        fresh = False
        while True:
            try:
                fresh = self._fresh.get_nowait() or fresh
            except queue.Empty:
                break
        if not fresh:
            return []
        out: list[tuple[bytes, bytes]] = []
        frames = self._frames  # replaced whole by the refreshing thread, never mutated
        for key, (serial, base, frame, digest) in frames.items():
            name, kind = key
            serial_sent, sent = self._sent.get(key, (None, set()))
            if serial_sent != serial:
                sent = set()
            for identity in self._wanted.get(name, ()):
                if identity not in sent:
                    out.append((identity, frame))
                    sent.add(identity)
                    self._holding.setdefault(key, {})[identity] = digest
                    self.pushed_at.setdefault((name, kind.value, base + 1), time.time())
            self._sent[key] = (serial, sent)
        for key in [key for key in self._sent if key not in frames]:
            del self._sent[key]
        while len(self.pushed_at) > 256:  # bounded: the oldest go
            self.pushed_at.pop(next(iter(self.pushed_at)))
        self.pushed += len(out)
        return out
