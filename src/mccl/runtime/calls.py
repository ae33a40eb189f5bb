"""Which path ran each call of a communicator: an mccl schedule (and its version) or the wrapped transport.

A user who switches a training job to the "mccl" backend cannot tell from results
alone whether a collective ran an mccl schedule or fell through to gloo/NCCL (both are
correct, only one is mccl). :class:`CallLog` answers it per communicator: one
:class:`CallRecord` per call in a bounded ring, plus running counts by (operation,
path) that never drop; ``communicator.calls.counts()`` is what a test or an operator reads.

The same counts, by (operation, path, schedule version), go to the controller with the
telemetry (:meth:`CallLog.totals`, sent by :class:`~mccl.runtime.telemetry.TelemetryBuffer`):
totals since creation rather than increments, so a report the telemetry socket drops (it
never blocks a rank) is made good by the next one instead of leaving the controller short.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

__all__ = ["CallLog", "CallRecord", "CallTotals", "DELEGATED", "SCHEDULE"]

SCHEDULE = "schedule"
DELEGATED = "delegated"


@dataclass(frozen=True)
class CallRecord:
    """One call: its sequence number (0 for a call outside the communicator's sequence), the
    torch-level operation (``all_gather_into_tensor``, ``broadcast``, ...), the path
    (:data:`SCHEDULE` or :data:`DELEGATED`) and the schedule version when a schedule ran."""

    seq: int
    op: str
    path: str
    version: int | None = None

    @property
    def label(self) -> str:
        """``"schedule v3"`` or ``"delegated"``: what a log line or a table shows."""
        return f"{SCHEDULE} v{self.version}" if self.path == SCHEDULE else self.path


@dataclass(frozen=True)
class CallTotals:
    """What a rank reports to the controller: the calls of ``communicator`` on ``rank`` since creation by
    (operation, path, schedule version — None when delegated). ``generation``: how many calls that is
    (a report is sent again only when it grew)."""

    communicator: str
    rank: int
    counts: dict[tuple[str, str, int | None], int]
    generation: int


class CallLog:
    """The last ``keep`` call records and the counts of every call since creation; thread-safe
    (the communicator's worker thread and the caller's thread both record)."""

    def __init__(self, keep: int = 4096) -> None:
        self._lock = threading.Lock()
        self._recent: collections.deque[CallRecord] = collections.deque(maxlen=keep)
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._by_version: collections.Counter[tuple[str, str, int | None]] = collections.Counter()
        self._generation = 0

    def record(self, seq: int, op: str, version: int | None) -> CallRecord:
        """Record a call; ``version`` None means it was delegated to the transport."""
        record = CallRecord(seq, op, DELEGATED if version is None else SCHEDULE, version)
        with self._lock:
            self._recent.append(record)
            self._counts[(op, record.path)] += 1
            self._by_version[(op, record.path, version)] += 1
            self._generation += 1
        return record

    @property
    def generation(self) -> int:
        """How many calls were recorded (grows with every call: whether a report is due)."""
        return self._generation

    def totals(self, communicator: str, rank: int) -> CallTotals:
        """The counts by (operation, path, version) since creation, as reported to the controller."""
        with self._lock:
            return CallTotals(communicator, rank, dict(self._by_version), self._generation)

    def recent(self) -> list[CallRecord]:
        with self._lock:
            return list(self._recent)

    def counts(self) -> dict[tuple[str, str], int]:
        """Calls since creation by (operation, path)."""
        with self._lock:
            return dict(self._counts)

    def scheduled(self, op: str) -> int:
        """How many ``op`` calls ran an mccl schedule."""
        with self._lock:
            return self._counts[(op, SCHEDULE)]

    def delegated(self, op: str) -> int:
        """How many ``op`` calls ran on the wrapped transport."""
        with self._lock:
            return self._counts[(op, DELEGATED)]
