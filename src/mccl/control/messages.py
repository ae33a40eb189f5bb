"""What the controller's messages ask, and the answers: parsing with bounds and the bounded state it reads.

:class:`Requests` is everything of :class:`~mccl.control.service.ControllerService` that
is about one message rather than sockets and threads: decode a frame with bounds
(:func:`.protocol.decode`; a frame above ``subprocess_bytes`` in a parser process, see
below), dispatch on its ``op``, and answer from state that no message can grow without
bound — communicators registered (``max_communicators``) and polled (twice that), the
latest call totals of each rank (``max_call_rows`` rows in all), ``status`` events
(``max_status_events``). Any failure of a message becomes an ``error`` reply and a
count; nothing a message holds ends the service (issue 13).

The parser process (:mod:`.parser`). ``json.loads`` of a 38 MiB schedule is one C call that
holds the GIL for ~2 s; re-encoding it, validating it and its overlay map another ~2.5 s
(measured, 2026-12-01); in the service's process any of it would stall the socket thread's
polls. So a frame above ``subprocess_bytes`` is decoded in a spawned helper process, which for
a ``register`` also parses, validates and prepares the schedule (:mod:`.prepared`) and encodes the
poll reply that serves it; the manager takes the prepared pieces instead of computing them
(``ScheduleManager.register(prepared=)``), and the service never needs the schedule's text.

Pushes. A poll also subscribes the socket that sent it (its ZeroMQ identity, with the versions it
said it has; at most ``max_subscribers`` in all, beyond that a socket is only answered): when a
refresh puts a newer version of a communicator in the snapshot, :meth:`Requests.pushes` gives the
socket thread that version's encoded reply for every subscriber that lacks it — the version reaches
the ranks one message after it is issued, not on their next poll. A subscriber that was sent a candidate
with the issued version's content is pushed a short ``activate`` frame instead (:mod:`.candidates`,
"Activation by digest").

Polls are answered from a snapshot of the active versions (:meth:`Requests.refresh`,
called off the socket thread after every change), so the socket thread never waits for
the manager's lock. A ``schedule`` reply is encoded once per version and kept (``json.dumps`` of
a 38 MiB text is ~0.16 s holding the GIL; before, it ran on the socket thread for every rank
that fetched it); a registration from the parser process comes with its reply encoded there.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mccl.control.candidates import CandidatePushes
from mccl.control.manager import ScheduleManager
from mccl.control.parser import ParsedRegistration, ParserProcess
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
from mccl.schedule import Collective, loads_schedule
from mccl.schedule.serialize import schedule_digest

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
    max_subscribers: int = 1 << 16  # polling sockets remembered for pushes, in all


def looks_heavy(frame: bytes | memoryview, limits: Limits) -> bool:
    """Whether a frame goes to the heavy-message thread: a large one, or any ``register``."""
    return len(frame) > limits.inline_bytes or b'"register"' in bytes(frame[:4096])


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
        self._parser = ParserProcess(manager.topology, limits.max_message_bytes)
        self.communicators: set[str] = set()  # registered here (bounded by max_communicators)
        self._watched: set[str] = set()  # polled here: the snapshot covers them too (bounded likewise)
        self._snapshot: dict[str, dict[Collective, int]] = {}  # active versions; replaced whole, never mutated
        # encoded ``schedule`` replies, the two newest versions of each (communicator, kind) that has an active
        # schedule here (bounded like the snapshot): {(communicator, kind): ((version, frame), ...)}
        self._replies: dict[tuple[str, Collective], tuple[tuple[int, bytes], ...]] = {}
        # which path ran each rank's calls: {communicator: {rank: rows}}, the latest report of each rank
        self._calls: dict[str, dict[int, list[tuple[str, str, int | None, int]]]] = {}
        self._call_rows = 0  # rows kept in all (bounded by max_call_rows)
        self._calls_lock = threading.Lock()  # the heavy-message thread may take a large telemetry message
        # pushes (module docstring): {communicator: {identity: versions it has}}, touched by the socket thread only;
        # communicators whose snapshot changed, queued by whichever thread refreshed
        self._subscribers: dict[str, dict[bytes, dict[str, int]]] = {}
        self._subscriber_count = 0
        self._changed: queue.SimpleQueue[str] = queue.SimpleQueue()
        # the reaction path (Fig. 13b): per version, when its reply was encoded and first pushed (wall clock)
        self.deliveries: dict[tuple[str, str, int], dict[str, float | int | None]] = {}
        self._deliveries_lock = threading.Lock()  # written by the refreshing thread and the socket thread
        self.candidates = CandidatePushes(limits.max_subscribers)  # syntheses ahead, pushed before the flag
        # (communicator, kind) -> (version, digest) of an issued version whose content some socket was sent as a
        # candidate (refreshing thread writes, socket thread reads): those sockets get an ``activate`` frame
        self._issued_digests: dict[tuple[str, Collective], tuple[int, str]] = {}

    def close(self) -> None:
        self._parser.close()

    def known(self) -> list[str]:
        """The communicators the snapshot covers: registered or polled here."""
        return list(self.communicators | self._watched)

    def refresh(self, communicators: list[str]) -> bool:
        """Re-read the active versions of ``communicators`` into the snapshot (off the socket thread), each
        with its encoded ``schedule`` reply ready: a registration's comes from the parser process; one the
        manager issued is encoded here, once (the socket thread only sends). True when a version changed
        (queued for :meth:`pushes`)."""
        fresh = {}
        for name in communicators:
            entry = {}
            for kind_name, version in self.manager.versions(name).items():
                kind = Collective(kind_name)
                if not any(kept == version for kept, _ in self._replies.get((name, kind), ())):
                    latest = self.manager.latest(name, kind)
                    if latest is None:
                        continue
                    version = latest[0]
                    self._keep_reply(name, kind, version, encode("schedule", collective=kind.value, version=version,
                                                                 schedule=latest[1]))
                    self._note_digest(name, kind, version)
                    with self._deliveries_lock:
                        self._delivery(name, kind, version)["encoded_at"] = time.time()
                entry[kind] = version
            if entry or name in self._snapshot:
                fresh[name] = entry
        changed = False
        if fresh:
            before = self._snapshot
            self._snapshot = {**self._snapshot, **fresh}
            for name, entry in fresh.items():
                if entry != before.get(name):
                    self._changed.put(name)
                    changed = True
        held = getattr(self.manager, "held_speculations", None)  # a manager of another kind has none
        if held is not None and self.candidates.refresh(held(), lambda name, kind: self._snapshot.get(name, {}).get(kind)):
            changed = True
        return changed

    def _note_digest(self, name: str, kind: Collective, version: int) -> None:
        """The issued version's digest, when some socket holds a candidate of (name, kind): hashing a schedule is
        ~1 GB/s, so only then (refreshing thread)."""
        latest_schedule = getattr(self.manager, "latest_schedule", None)  # a manager of another kind has none
        if latest_schedule is None or not self.candidates.holders(name, kind):
            return
        latest = latest_schedule(name, kind)
        if latest is not None and latest[0] == version:
            self._issued_digests = {**self._issued_digests, (name, kind): (version, schedule_digest(latest[1]))}

    def _frame_for(self, name: str, kind: Collective, version: int, identity: bytes) -> bytes | None:
        """What to push ``identity`` for a new ``version``: an ``activate`` frame when it was sent a candidate
        with that content, else the encoded schedule reply (None: not encoded yet)."""
        issued = self._issued_digests.get((name, kind))
        if issued is not None and issued[0] == version and \
                self.candidates.sent_digest(name, kind, identity) == issued[1]:
            self.stats["activations"] = self.stats.get("activations", 0) + 1
            return encode("activate", collective=kind.value, version=version, digest=issued[1])
        return next((kept for number, kept in self._replies.get((name, kind), ()) if number == version), None)

    def pushes(self) -> list[tuple[bytes, bytes]]:
        """(identity, encoded schedule reply) for every subscriber of a communicator whose snapshot changed
        since the last call and that lacks its newest version (socket thread only; module docstring)."""
        out: list[tuple[bytes, bytes]] = []
        names: set[str] = set()
        while True:
            try:
                names.add(self._changed.get_nowait())
            except queue.Empty:
                break
        for name in names:
            active = self._snapshot.get(name, {})
            for identity, have in self._subscribers.get(name, {}).items():
                for kind, version in active.items():
                    if version > have.get(kind.value, 0):
                        frame = self._frame_for(name, kind, version, identity)
                        if frame is not None:
                            out.append((identity, frame))
                            have[kind.value] = version
                            with self._deliveries_lock:
                                delivery = self._delivery(name, kind, version)
                                delivery["pushed_at"] = delivery["pushed_at"] or time.time()
                                delivery["pushed_to"] = int(delivery["pushed_to"] or 0) + 1
        self.stats["pushes"] = self.stats.get("pushes", 0) + len(out)
        candidates = self.candidates.pushes()
        self.stats["candidates_pushed"] = self.stats.get("candidates_pushed", 0) + len(candidates)
        return out + candidates

    def _delivery(self, name: str, kind: Collective, version: int) -> dict[str, float | int | None]:
        key = (name, kind.value, version)
        if key not in self.deliveries:
            if len(self.deliveries) >= 256:  # bounded: the oldest goes
                self.deliveries.pop(next(iter(self.deliveries)))
            self.deliveries[key] = {"encoded_at": None, "pushed_at": None, "pushed_to": 0}
        return self.deliveries[key]

    def _subscribe(self, communicator: str, identity: bytes, have: dict[str, int]) -> None:
        subscribers = self._subscribers.get(communicator)
        if subscribers is not None and identity in subscribers:
            subscribers[identity] = dict(have)
        elif self._subscriber_count < self.limits.max_subscribers and communicator in self._watched:
            self._subscribers.setdefault(communicator, {})[identity] = dict(have)
            self._subscriber_count += 1

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

    def handle(self, frame: bytes | memoryview, identity: bytes | None = None) -> bytes | None:
        """The reply to one message (None: no reply). Never raises: any failure is an error reply. ``frame``
        may be libzmq's buffer (a large one is handed to the parser process without a copy here). ``identity``:
        the sender's socket (socket thread only): a poll subscribes it to pushes."""
        op: str | None = None
        try:
            registration: ParsedRegistration | None = None
            if len(frame) > self.limits.subprocess_bytes:  # in the parser process (module docstring)
                message, registration = self._parser.parse(frame)
            else:
                message = decode(bytes(frame), max_bytes=self.limits.max_message_bytes)
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
                return self._answer_poll(message, identity)
            if op == "register":
                return self._register(message, registration)
            if op == "windows":  # a time-shared tenant's send windows (issue 16, mccl.control.tenancy.live)
                return windows_reply(self.manager, message)
            if op == "status":
                events = [dataclasses.asdict(event) for event in self.manager.events[-self.limits.max_status_events:]]
                stats = {**self.stats, "samples_taken": self.manager.samples_taken,
                         "samples_ignored": self.manager.samples_ignored, "speculations": self.manager.speculations,
                         **{f"speculations_{how}": count for how, count in getattr(self.manager, "speculation_reuse", {}).items()}}
                calls = {name: {str(rank): [list(row) for row in rows] for rank, rows in ranks.items()}
                         for name, ranks in self.calls().items()}
                reactions = [dataclasses.asdict(item) for item in list(self.manager.reactions)]
                with self._deliveries_lock:
                    deliveries = [{"communicator": name, "collective": kind, "version": version, **row}
                                  for (name, kind, version), row in self.deliveries.items()]
                candidates = [{"communicator": name, "collective": kind, "version": version, "pushed_at": at}
                              for (name, kind, version), at in list(self.candidates.pushed_at.items())]
                return encode("status", events=finite_or_none(events), stats=finite_or_none(stats), calls=calls,
                              reactions=finite_or_none(reactions), deliveries=finite_or_none(deliveries),
                              candidates=finite_or_none(candidates))
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

    def _register(self, message: dict[str, Any], registration: ParsedRegistration | None) -> bytes:
        communicator = text_field(message, "communicator")
        if registration is None and not isinstance(message.get("schedule"), str):
            raise ControllerError("register: 'schedule' must be a schedule file's text")
        if communicator not in self.communicators and len(self.communicators) >= self.limits.max_communicators:
            raise ControllerError(f"register: the controller serves at most {self.limits.max_communicators} communicators")
        if registration is None:  # a small one, parsed, validated and prepared here (milliseconds)
            version = self.manager.register(communicator, loads_schedule(message["schedule"]))
        else:
            schedule = registration.schedule
            # kept first: a refresh that saw the new version without its reply would encode it here (1.9 s)
            self._keep_reply(communicator, schedule.collective, int(schedule.meta.version), registration.reply)
            version = self.manager.register(communicator, schedule, prepared=registration.prepared)
        self.communicators.add(communicator)
        self.refresh([communicator])
        self.stats["registrations"] += 1
        return encode("ok", version=version)

    def _keep_reply(self, communicator: str, kind: Collective, version: int, frame: bytes) -> None:
        """Keep a version's encoded reply with the newest other one (a registration's lands before the snapshot
        shows it). One assignment: the two threads that refresh may race here at worst into encoding one again."""
        kept = [entry for entry in self._replies.get((communicator, kind), ()) if entry[0] != version]
        self._replies[(communicator, kind)] = tuple(sorted([*kept, (version, frame)], key=lambda entry: entry[0])[-2:])

    def _answer_poll(self, message: dict[str, Any], identity: bytes | None = None) -> bytes:
        """From the snapshot: the socket thread never waits for the manager (see module docstring)."""
        communicator = text_field(message, "communicator")
        have = versions_field(message)
        if communicator not in self._watched and len(self._watched) < 2 * self.limits.max_communicators:
            self._watched.add(communicator)
        if identity is not None:
            self._subscribe(communicator, identity, have)
            if message.get("candidates") is True and communicator in self._watched:
                self.candidates.subscribe(communicator, identity)
        active = self._snapshot.get(communicator, {})
        for kind in Collective:
            version = active.get(kind)
            if version is not None and version > have.get(kind.value, 0):
                for kept, frame in self._replies.get((communicator, kind), ()):
                    if kept == version:  # always, but for a refresh racing the next: then the next poll has it
                        self.stats["schedules_sent"] += 1
                        return frame
        return encode("idle", versions={kind.value: version for kind, version in active.items()})
