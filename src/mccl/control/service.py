"""The controller service: the endpoint executors talk to (mccl-paper §3, Figure 3 ②③).

Transport choice. One ZeroMQ ROUTER socket bound at ``bind``; each executor rank
connects two DEALER sockets to it (:mod:`.client`):

* telemetry is a one-way stream. A DEALER with a small send high-water mark and
  ``IMMEDIATE`` sends without blocking; when the queue is full, or the service is
  not connected, the send fails at once and the client drops and counts the batch —
  a collective is never held up by the controller (§5).
* schedules are *pulled*: the client's ``poll()`` sends ``poll`` with the versions it
  has and reads the reply on its next call — fully non-blocking. Unlike PUB/SUB
  this loses nothing to late joiners (a reply always carries the newest version,
  not a one-off announcement), needs no second port, and gives fail-static for
  free: a request left unanswered past the client's timeout means the controller
  is gone, and ``poll()`` raises :class:`~mccl.errors.ControllerError` so the
  runtime keeps its schedule. A poll every 50 ms per rank is ~100 µs of work here.

Authentication (:mod:`.auth`): on by default, CURVE with keys derived from a per-job
secret (``secret=``, else ``MCCL_CONTROL_SECRET_FILE`` / ``MCCL_CONTROL_SECRET``, else a
fresh one, :attr:`ControllerService.secret`). A peer without it never gets a message
through; its failed handshakes are counted (``stats["auth_failures"]``). Without
authentication the service binds to loopback only.

No message stops or stalls the service: every message is parsed with bounds
(:func:`.protocol.decode`), every handler's failure becomes an ``error`` reply and a
count, frames above ``max_message_bytes`` are refused by libzmq (``ZMQ_MAXMSGSIZE``),
registrations per communicator name are bounded (``max_communicators``), and heavy
messages — every ``register`` (parse and validate a schedule) and any frame above
``inline_bytes`` — are handled on a worker thread, at most ``max_pending`` at a time
(more are refused with "busy"), so polls keep being answered meanwhile. Frames above
``subprocess_bytes`` are parsed in a helper process: ``json.loads`` of a 38 MiB
schedule is one C call that holds the GIL for ~2 s, which a thread alone cannot hide
(measured: a poll then waited 2.6 s); the helper returns the parsed schedule's arrays,
which unpickle in milliseconds.

Threads. The service thread owns the socket (ZeroMQ sockets are single-threaded)
and never waits for the manager's lock (``ScheduleManager.register`` holds it while it
writes a schedule's text, seconds for a 38 MiB one): it answers polls from a snapshot
of the active versions that the other threads refresh after every change they make,
and hands telemetry to an ingest thread (in order; batches beyond ``max_ingest_backlog``
are dropped and counted, as a client drops what it cannot send). Every
``check_interval_s`` it hands ``ScheduleManager.step`` (drift test, synthesis) to one
worker thread, so telemetry keeps flowing while a synthesis runs (the manager aborts a
synthesis whose degradation cleared meanwhile). Replies computed on the heavy-message
thread are sent by the service thread. The snapshot covers the communicators registered
or polled here; a poll for one registered on the manager directly is answered once the
next check has refreshed it (≤ ``check_interval_s`` plus a check).

Which path ran each call: a telemetry message may carry a rank's call totals (``calls``,
:func:`.protocol.calls_of`); the service keeps the latest of each (communicator, rank) — totals,
so the newest replaces the last and a dropped report costs nothing once the next arrives — at
most ``max_call_rows`` rows in all (more are dropped and counted), and returns them in ``status``.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import queue
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from mccl.control.auth import JobSecret, as_secret, is_loopback, new_secret, secret_from_env
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
from mccl.errors import ControllerError
from mccl.schedule import Collective, Schedule, dumps_schedule, loads_schedule

__all__ = ["ControllerService"]

log = logging.getLogger("mccl.control")

_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_RESULT_WAIT_MS = 5.0  # how often the service thread looks for replies of the heavy-message thread


class _OneKey:
    """The ZAP credentials provider: exactly the job's client key is let in."""

    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.allowed


class ControllerService:
    """Serve ``manager`` at ``bind`` (e.g. ``tcp://127.0.0.1:5555``; port ``*`` picks a free one).

    ``secret``: the job's control-plane secret (a :class:`~mccl.control.auth.JobSecret`, hex, or
    raw bytes); None takes it from the environment or makes a fresh one. ``authenticate=False``:
    no authentication (loopback binds only)."""

    def __init__(self, manager: ScheduleManager, bind: str, *, check_interval_s: float = 0.02,
                 secret: JobSecret | str | bytes | None = None, authenticate: bool = True,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, inline_bytes: int = 256 << 10,
                 max_communicators: int = 1024, max_pending: int = 4, max_status_events: int = 1000,
                 subprocess_bytes: int = 1 << 20, max_ingest_backlog: int = 256,
                 max_call_rows: int = 1 << 20) -> None:
        self.manager = manager
        self.check_interval_s = check_interval_s
        self.max_message_bytes = max_message_bytes
        self.inline_bytes = inline_bytes
        self.max_communicators = max_communicators
        self.max_pending = max_pending
        self.max_status_events = max_status_events
        self.subprocess_bytes = subprocess_bytes
        self.max_ingest_backlog = max_ingest_backlog
        self.max_call_rows = max_call_rows
        self._parser: ProcessPoolExecutor | None = None
        if authenticate:
            self.secret: JobSecret | None = as_secret(secret) or secret_from_env() or new_secret()
        elif not is_loopback(bind):
            raise ControllerError(f"refusing to serve {bind} without authentication: only loopback, ipc or inproc "
                                  "endpoints may be unauthenticated")
        else:
            self.secret = None
        self._context = zmq.Context()
        self._authenticator: ThreadAuthenticator | None = None
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes + 4096)  # JSON envelope of a maximal schedule
        self._monitor: zmq.Socket | None = None
        try:
            if self.secret is not None:
                self._authenticator = ThreadAuthenticator(self._context, log=logging.getLogger("mccl.control.zap"))
                self._authenticator.start()
                self._authenticator.configure_curve_callback("*", _OneKey(self.secret.client_keys[0]))
                self.secret.make_server(self._socket)
                self._monitor = self._socket.get_monitor_socket(_HANDSHAKE_FAILED)
            self._socket.bind(bind)
        except zmq.ZMQError as error:
            self._close()
            raise ControllerError(f"cannot bind the controller at {bind}: {error}") from None
        self.address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.secret is not None and not is_loopback(self.address):
            log.info("mccl controller: listening beyond loopback at %s (CURVE-authenticated)", self.address)
        self.stats = {"telemetry_messages": 0, "samples": 0, "malformed": 0, "polls": 0, "replies": 0,
                      "schedules_sent": 0, "checks": 0, "auth_failures": 0, "busy": 0, "registrations": 0,
                      "telemetry_dropped": 0, "call_reports": 0, "call_reports_dropped": 0}
        self._communicators: set[str] = set()  # registered here (bounded by max_communicators)
        self._watched: set[str] = set()  # polled here: the snapshot covers them too (bounded likewise)
        self._snapshot: dict[str, dict[Collective, tuple[int, str]]] = {}  # replaced whole, never mutated
        self._ingest = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mccl-ingest")
        self._ingest_backlog = 0
        self._ingest_lock = threading.Lock()
        # which path ran each rank's calls: {communicator: {rank: rows}}, the latest report of each rank
        self._calls: dict[str, dict[int, list[tuple[str, str, int | None, int]]]] = {}
        self._call_rows = 0  # rows kept in all (bounded by max_call_rows)
        self._calls_lock = threading.Lock()  # the heavy-message thread may take a large telemetry message
        self._stop = threading.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mccl-synth")
        self._heavy = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mccl-register")
        self._results: queue.SimpleQueue[tuple[bytes, bytes | None]] = queue.SimpleQueue()
        self._pending = 0
        self._step: Future | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> ControllerService:
        self._thread = threading.Thread(target=self.serve_forever, name="mccl-controller", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)

    def client_environment(self) -> dict[str, str]:
        """What a launcher puts in each executor's environment so its ControllerClient authenticates."""
        from mccl.control.auth import SECRET_ENV

        return {} if self.secret is None else {SECRET_ENV: self.secret.hex}

    def _close(self) -> None:
        if self._monitor is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
        self._socket.close(linger=0)
        if self._authenticator is not None:
            self._authenticator.stop()
        self._context.term()

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        next_check = time.monotonic()
        try:
            while not self._stop.is_set():
                timeout_ms = max(0.0, (next_check - time.monotonic()) * 1e3)
                if self._pending:
                    timeout_ms = min(timeout_ms, _RESULT_WAIT_MS)
                ready = dict(poller.poll(timeout_ms))
                if self._monitor is not None and self._monitor in ready:
                    self._count_handshakes()
                if self._socket in ready:
                    self._drain()
                self._send_results()
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.check_interval_s
                    if self._step is None or self._step.done():
                        self._step = self._worker.submit(self._run_step)
        finally:
            self._ingest.shutdown(wait=True, cancel_futures=True)
            self._heavy.shutdown(wait=True, cancel_futures=True)
            self._worker.shutdown(wait=True, cancel_futures=True)
            if self._parser is not None:
                self._parser.shutdown(wait=True, cancel_futures=True)
            self._close()

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                parts = self._socket.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            if len(parts) != 2:  # not one of our clients
                self.stats["malformed"] += 1
                continue
            identity, frame = parts
            if len(frame) > self.inline_bytes or _looks_like_register(frame):
                self._hand_off(identity, frame)
            else:
                reply = self._handle(identity, frame)
                if reply is not None:
                    self._reply(identity, reply)

    def _count_handshakes(self) -> None:
        while True:
            try:
                self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.stats["auth_failures"] += 1
            if self.stats["auth_failures"] == 1:
                log.warning("mccl controller: a peer failed the authentication handshake; further ones are counted")

    def _run_step(self) -> None:
        try:
            self.stats["checks"] += 1
            self.manager.step()
            self._refresh(list(self._communicators | self._watched))
        except Exception:  # a bug in a check must not stop the service; it is logged
            log.exception("mccl controller: drift check failed")

    def _refresh(self, communicators: list[str]) -> None:
        """Re-read the active versions of ``communicators`` into the snapshot (off the socket thread)."""
        fresh = {}
        for name in communicators:
            entry = {kind: latest for kind in Collective if (latest := self.manager.latest(name, kind)) is not None}
            if entry or name in self._snapshot:
                fresh[name] = entry
        if fresh:
            self._snapshot = {**self._snapshot, **fresh}

    def _take_telemetry(self, samples: list) -> None:
        with self._ingest_lock:
            if self._ingest_backlog >= self.max_ingest_backlog:
                self.stats["telemetry_dropped"] += len(samples)
                return
            self._ingest_backlog += 1

        def ingest() -> None:
            try:
                self.manager.ingest(samples)
            except Exception:  # noqa: BLE001 - checked samples; a failure here is a bug, logged
                log.exception("mccl controller: telemetry ingest failed")
            finally:
                with self._ingest_lock:
                    self._ingest_backlog -= 1

        self._ingest.submit(ingest)

    def _take_calls(self, report: CallReport) -> None:
        """Keep a rank's latest call totals (they are totals, so the newest replaces the last); a report
        beyond the bounds (communicator names, rows kept in all) is dropped and counted."""
        communicator, rank, rows = report
        with self._calls_lock:
            ranks = self._calls.get(communicator)
            known = len(ranks[rank]) if ranks is not None and rank in ranks else 0
            if ((ranks is None and len(self._calls) >= 2 * self.max_communicators)
                    or self._call_rows - known + len(rows) > self.max_call_rows):
                self.stats["call_reports_dropped"] += 1
                return
            self._calls.setdefault(communicator, {})[rank] = rows
            self._call_rows += len(rows) - known
            self.stats["call_reports"] += 1

    def calls(self) -> dict[str, dict[int, list[tuple[str, str, int | None, int]]]]:
        """The latest call totals each rank reported, by communicator and rank (also in ``status``)."""
        with self._calls_lock:
            return {name: dict(ranks) for name, ranks in self._calls.items()}

    # ---- messages ----------------------------------------------------------------------
    def _reply(self, identity: bytes, payload: bytes) -> None:
        try:
            self._socket.send_multipart([identity, payload], zmq.NOBLOCK)
            self.stats["replies"] += 1
        except zmq.ZMQError:  # the client is gone or not reading; it will time out and ask again
            pass

    def _hand_off(self, identity: bytes, frame: bytes) -> None:
        if self._pending >= self.max_pending:
            self.stats["busy"] += 1
            self._reply(identity, encode("error", message=f"the controller is busy ({self._pending} large messages "
                                                          "in hand); try again"))
            return
        self._pending += 1

        def work() -> None:
            try:
                self._results.put((identity, self._handle(identity, frame)))
            except BaseException:  # noqa: BLE001 - _handle already turns every Exception into a reply
                self._results.put((identity, None))
                raise

        self._heavy.submit(work)

    def _send_results(self) -> None:
        while True:
            try:
                identity, reply = self._results.get_nowait()
            except queue.Empty:
                return
            self._pending -= 1
            if reply is not None:
                self._reply(identity, reply)

    def _parse_elsewhere(self, frame: bytes) -> dict[str, Any]:
        """decode() (and a register's schedule parsed) in the helper process; see module docstring."""
        if self._parser is None:
            self._parser = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return self._parser.submit(_parse_message, frame, self.max_message_bytes).result()
        except BrokenProcessPool:  # the helper died (memory?): a fresh one for the next message
            self._parser = None
            raise ControllerError("the controller could not parse that message (its parser process died)") from None

    def _handle(self, identity: bytes, frame: bytes) -> bytes | None:
        """The reply to one message (None: no reply). Never raises: any failure is an error reply."""
        op: str | None = None
        try:
            if len(frame) > self.subprocess_bytes:
                message = self._parse_elsewhere(frame)
            else:
                message = decode(frame, max_bytes=self.max_message_bytes)
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
                    self._take_calls(calls)
                return None
            if op == "poll":
                self.stats["polls"] += 1
                return self._answer_poll(message)
            if op == "register":
                return self._register(message)
            if op == "status":
                events = [dataclasses.asdict(event) for event in self.manager.events[-self.max_status_events:]]
                stats = {**self.stats, "samples_taken": self.manager.samples_taken,
                         "samples_ignored": self.manager.samples_ignored}
                calls = {name: {str(rank): [list(row) for row in rows] for rank, rows in ranks.items()}
                         for name, ranks in self.calls().items()}
                return encode("status", events=finite_or_none(events), stats=finite_or_none(stats), calls=calls)
            if op == "stop":
                self._stop.set()
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
        if communicator not in self._communicators and len(self._communicators) >= self.max_communicators:
            raise ControllerError(f"register: the controller serves at most {self.max_communicators} communicators")
        if isinstance(schedule, str):
            schedule = loads_schedule(schedule)
        text = message.get("schedule_text")  # the canonical text, from the parser process
        version = self.manager.register(communicator, schedule, text=text if isinstance(text, str) else None)
        self._communicators.add(communicator)
        self._refresh([communicator])
        self.stats["registrations"] += 1
        return encode("ok", version=version)

    def _answer_poll(self, message: dict[str, Any]) -> bytes:
        """From the snapshot: the socket thread never waits for the manager (see module docstring)."""
        communicator = text_field(message, "communicator")
        have = versions_field(message)
        if communicator not in self._watched and len(self._watched) < 2 * self.max_communicators:
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


def _looks_like_register(frame: bytes) -> bool:
    """Whether a (small) frame asks to register: such work goes to the heavy-message thread."""
    return b'"register"' in frame[:4096]
