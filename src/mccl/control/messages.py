"""What the controller's messages ask, and the answers: parsing with bounds and the bounded state it reads.

:class:`Requests` is everything of :class:`~mccl.control.service.ControllerService` that
is about one message rather than sockets and threads: decode a frame with bounds
(:func:`.protocol.decode`; a frame above ``subprocess_bytes`` in a parser process, see
below), dispatch on its ``op``, and answer from state that no message can grow without
bound — communicators registered (``max_communicators``) and polled (twice that), the
latest call totals of each rank (``max_call_rows`` rows in all), ``status`` events
(``max_status_events``). Any failure of a message becomes an ``error`` reply and a
count; nothing a message holds ends the service (issue 13).

The parser process. ``json.loads`` of a 38 MiB schedule is one C call that holds the GIL
for ~2 s, and re-encoding it for the ranks another ~1.7 s (measured, 2026-12-01); in the
service's process either would stall the socket thread's polls. So a frame above
``subprocess_bytes`` is decoded in a spawned helper process, which for a ``register`` also
parses the schedule and writes its canonical text; both come back pickled (arrays and one
string: milliseconds) and the manager takes the text instead of encoding it again. A
client's own ``schedule_text`` field is always dropped: only the helper sets it.

Polls are answered from a snapshot of the active versions (:meth:`Requests.refresh`,
called off the socket thread after every change), so the socket thread never waits for
the manager's lock.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from mccl.control.manager import ScheduleManager
from mccl.control.protocol import (
    MAX_MESSAGE_BYTES,
    CallReport,
    calls_of,
    decode,
    encode,
    finite_or_none,
    samples_of,
    text_field,
    versions_field,
)
from mccl.control.tenancy.live import windows_reply
from mccl.errors import ControllerError
from mccl.schedule import Collective, Schedule, dumps_schedule, loads_schedule

__all__ = ["Limits", "Requests", "looks_heavy"]

log = logging.getLogger("mccl.control")


@dataclass(frozen=True)
class Limits:
    """The service's bounds (each a keyword of :class:`~mccl.control.service.ControllerService`)."""

    max_message_bytes: int = MAX_MESSAGE_BYTES  # larger frames are refused by libzmq (ZMQ_MAXMSGSIZE)
    inline_bytes: int = 256 << 10  # larger frames (and every register) go to the heavy-message thread
    max_communicators: int = 1024  # registered; twice that may be polled or report calls
    max_pending: int = 4  # heavy messages in hand at once; more are answered "busy"
    max_status_events: int = 1000
    subprocess_bytes: int = 1 << 20  # larger frames are decoded in the parser process
    max_ingest_backlog: int = 256  # telemetry batches waiting for the ingest thread; more are dropped
    max_call_rows: int = 1 << 20  # call-total rows kept in all


def looks_heavy(frame: bytes, limits: Limits) -> bool:
    """Whether a frame goes to the heavy-message thread: a large one, or any ``register``."""
    return len(frame) > limits.inline_bytes or b'"register"' in frame[:4096]


class Requests:
    """The answers to messages (module docstring). ``take_telemetry(samples)`` hands checked samples
    on (to the service's ingest thread); ``on_stop()`` is called by a ``stop`` message. ``stats`` is
    the service's counters, shared with it."""

    def __init__(self, manager: ScheduleManager, limits: Limits, stats: dict[str, int], *,
                 take_telemetry: Callable[[list], None], on_stop: Callable[[], None]) -> None:
        self.manager = manager
        self.limits = limits
        self.stats = stats
        self._take_telemetry = take_telemetry
        self._on_stop = on_stop
        self._parser: ProcessPoolExecutor | None = None
        self.communicators: set[str] = set()  # registered here (bounded by max_communicators)
        self._watched: set[str] = set()  # polled here: the snapshot covers them too (bounded likewise)
        self._snapshot: dict[str, dict[Collective, tuple[int, str]]] = {}  # replaced whole, never mutated
        # which path ran each rank's calls: {communicator: {rank: rows}}, the latest report of each rank
        self._calls: dict[str, dict[int, list[tuple[str, str, int | None, int]]]] = {}
        self._call_rows = 0  # rows kept in all (bounded by max_call_rows)
        self._calls_lock = threading.Lock()  # the heavy-message thread may take a large telemetry message

    def close(self) -> None:
        if self._parser is not None:
            self._parser.shutdown(wait=True, cancel_futures=True)

    def known(self) -> list[str]:
        """The communicators the snapshot covers: registered or polled here."""
        return list(self.communicators | self._watched)

    def refresh(self, communicators: list[str]) -> None:
        """Re-read the active versions of ``communicators`` into the snapshot (off the socket thread)."""
        fresh = {}
        for name in communicators:
            entry = {kind: latest for kind in Collective if (latest := self.manager.latest(name, kind)) is not None}
            if entry or name in self._snapshot:
                fresh[name] = entry
        if fresh:
            self._snapshot = {**self._snapshot, **fresh}

    def take_calls(self, report: CallReport) -> None:
        """Keep a rank's latest call totals (they are totals, so the newest replaces the last); a report
        beyond the bounds (communicator names, rows kept in all) is dropped and counted."""
        communicator, rank, rows = report
        with self._calls_lock:
            ranks = self._calls.get(communicator)
            known = len(ranks[rank]) if ranks is not None and rank in ranks else 0
            if ((ranks is None and len(self._calls) >= 2 * self.limits.max_communicators)
                    or self._call_rows - known + len(rows) > self.limits.max_call_rows):
                self.stats["call_reports_dropped"] += 1
                return
            self._calls.setdefault(communicator, {})[rank] = rows
            self._call_rows += len(rows) - known
            self.stats["call_reports"] += 1

    def calls(self) -> dict[str, dict[int, list[tuple[str, str, int | None, int]]]]:
        """The latest call totals each rank reported, by communicator and rank (also in ``status``)."""
        with self._calls_lock:
            return {name: dict(ranks) for name, ranks in self._calls.items()}

    def _parse_elsewhere(self, frame: bytes) -> dict[str, Any]:
        """decode() (and a register's schedule parsed) in the helper process; see module docstring."""
        if self._parser is None:
            self._parser = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return self._parser.submit(_parse_message, frame, self.limits.max_message_bytes).result()
        except BrokenProcessPool:  # the helper died (memory?): a fresh one for the next message
            self._parser = None
            raise ControllerError("the controller could not parse that message (its parser process died)") from None

    def handle(self, frame: bytes) -> bytes | None:
        """The reply to one message (None: no reply). Never raises: any failure is an error reply."""
        op: str | None = None
        try:
            if len(frame) > self.limits.subprocess_bytes:
                message = self._parse_elsewhere(frame)
            else:
                message = decode(frame, max_bytes=self.limits.max_message_bytes)
                message.pop("schedule_text", None)  # a client's text is never served unparsed
            op = message["op"]
            if op == "telemetry":
                samples = samples_of(message)
                calls = calls_of(message)  # both checked before either is taken
                self.stats["telemetry_messages"] += 1
                self.stats["samples"] += len(samples)
                if samples:
                    self._take_telemetry(samples)
                if calls is not None:
                    self.take_calls(calls)
                return None
            if op == "poll":
                self.stats["polls"] += 1
                return self._answer_poll(message)
            if op == "register":
                return self._register(message)
            if op == "windows":  # a time-shared tenant's send windows (issue 16, mccl.control.tenancy.live)
                return windows_reply(self.manager, message)
            if op == "status":
                events = [dataclasses.asdict(event) for event in self.manager.events[-self.limits.max_status_events:]]
                stats = {**self.stats, "samples_taken": self.manager.samples_taken,
                         "samples_ignored": self.manager.samples_ignored}
                calls = {name: {str(rank): [list(row) for row in rows] for rank, rows in ranks.items()}
                         for name, ranks in self.calls().items()}
                return encode("status", events=finite_or_none(events), stats=finite_or_none(stats), calls=calls)
            if op == "stop":
                self._on_stop()
                return encode("ok")
            raise ControllerError(f"unknown controller operation {op[:40]!r}")
        except Exception as error:  # noqa: BLE001 - no message may end the service (issue 13)
            self.stats["malformed"] += 1
            if self.stats["malformed"] == 1:
                log.warning("mccl controller: bad message (%s); further ones are only counted", str(error)[:200])
            if op == "telemetry":
                return None
            text = str(error) if isinstance(error, ControllerError) else f"{type(error).__name__}: {error}"
            try:
                return encode("error", message=text[:1000])
            except Exception:  # noqa: BLE001 - an error text json cannot hold
                return encode("error", message=type(error).__name__)

    def _register(self, message: dict[str, Any]) -> bytes:
        communicator = text_field(message, "communicator")
        schedule = message.get("schedule")
        if not isinstance(schedule, str | Schedule):
            raise ControllerError("register: 'schedule' must be a schedule file's text")
        if communicator not in self.communicators and len(self.communicators) >= self.limits.max_communicators:
            raise ControllerError(f"register: the controller serves at most {self.limits.max_communicators} communicators")
        if isinstance(schedule, str):
            schedule = loads_schedule(schedule)
        text = message.get("schedule_text")  # the canonical text, from the parser process
        version = self.manager.register(communicator, schedule, text=text if isinstance(text, str) else None)
        self.communicators.add(communicator)
        self.refresh([communicator])
        self.stats["registrations"] += 1
        return encode("ok", version=version)

    def _answer_poll(self, message: dict[str, Any]) -> bytes:
        """From the snapshot: the socket thread never waits for the manager (see module docstring)."""
        communicator = text_field(message, "communicator")
        have = versions_field(message)
        if communicator not in self._watched and len(self._watched) < 2 * self.limits.max_communicators:
            self._watched.add(communicator)
        active = self._snapshot.get(communicator, {})
        for kind in Collective:
            latest = active.get(kind)
            if latest is not None and latest[0] > have.get(kind.value, 0):
                self.stats["schedules_sent"] += 1
                return encode("schedule", collective=kind.value, version=latest[0], schedule=latest[1])
        return encode("idle", versions={kind.value: latest[0] for kind, latest in active.items()})



def _parse_message(frame: bytes, max_bytes: int) -> dict[str, Any]:
    """In the helper process: the decoded message; a register's schedule as a Schedule and its canonical
    text (what the manager serves to ranks), both pickled back (arrays and one string: milliseconds)."""
    message = decode(frame, max_bytes=max_bytes)
    message.pop("schedule_text", None)  # only this process sets it
    if message["op"] == "register" and isinstance(message.get("schedule"), str):
        message["schedule"] = loads_schedule(message["schedule"])
        message["schedule_text"] = dumps_schedule(message["schedule"])
    return message
