"""The executor's client of the controller: the runtime's ``ScheduleSource`` and ``TelemetrySink``.

:class:`ControllerClient` implements both protocols of ``mccl.runtime.sources``
structurally (``poll()`` and ``submit(samples)``), so the runtime takes it as
``mccl.init(controller=client, sink=client)`` without change, and this module
imports neither torch nor the runtime. One client per rank and communicator.

* ``submit`` never blocks: a batch that the telemetry socket cannot take at once
  (queue full, controller not connected) is dropped and counted (``dropped``).
* ``poll`` never blocks: it reads the reply to its previous request (or a version the
  service pushed) and sends a new request. A request unanswered for ``timeout_s``
  raises :class:`~mccl.errors.ControllerError` — the runtime then keeps its last
  schedule (fail-static), as it does for every later call. A request that cannot
  go out (not connected yet) is not counted as sent: the next poll sends it again,
  and only ``timeout_s`` of that raises too (before, a first poll that raced the
  connection waited out the whole timeout for a reply that could never come).
* ``wait(timeout_s)`` is the pushed path (what the runtime's swap thread uses when its
  source has it): it blocks, idle, on the request socket until a frame arrives or the
  timeout passes, and asks (a poll) at most every ``interval_s``. The service remembers
  each polling socket and pushes a new version to it the moment it is issued
  (:mod:`.service`), so a version reaches the rank one message after the issue instead
  of on the poll after the one that asked (dispatch was ≤ 2 poll periods, and 16 ranks
  polling every 5 ms cost the controller 3200 requests a second). The poll stays: it
  subscribes the socket, carries the versions the rank has (a push it missed is answered
  by the next one), and detects a lost controller as before.
* ``candidates=True``: the polls ask the service for candidates too — a synthesis made ahead of the
  flag, pushed before the flag (:mod:`.candidates`). ``poll()``/``wait()`` return one as a
  :class:`Candidate` (not a Schedule): the runtime prepares it and adopts nothing; the version
  issued later arrives as before. Off by default, so a caller that takes every non-None answer
  for a new version sees none. When the version issued has a candidate's content, the service pushes
  only ``activate`` (collective, version, digest): the client returns the candidate it kept under that
  digest, as the new version, without a schedule on the wire or a parse (``activations``); one it no
  longer has is asked for at once, and the poll's answer carries the whole schedule (:mod:`.candidates`,
  "Activation by digest").
* A controller declared lost is asked again every ``timeout_s`` by later polls (which
  keep raising until it answers); once it answers, the client recovers: ``poll()``
  returns normally again (``recoveries`` counts it).
* Authentication (:mod:`.auth`): ``secret`` (a JobSecret, hex, or raw bytes), else
  ``MCCL_CONTROL_SECRET_FILE`` / ``MCCL_CONTROL_SECRET`` from the environment (how the
  launcher hands it to every rank); with none, the client speaks unauthenticated, which
  only a service started with ``authenticate=False`` accepts.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import zmq

from mccl.control.auth import HANDSHAKE_FAILED, JobSecret, as_secret, secret_from_env
from mccl.control.protocol import decode, encode, finite_samples, int_field, telemetry_message, text_field
from mccl.errors import ControllerError, MCCLError
from mccl.schedule import Collective, Schedule, dumps_schedule, loads_schedule

__all__ = ["Candidate", "ControllerClient", "wait_for_controller"]


@dataclass(frozen=True)
class Candidate:
    """A schedule the controller may issue next (synthesized ahead of the flag): to be prepared, not adopted.
    ``prestage_only`` is how the runtime's swap thread tells it from a new version (structurally: the runtime
    does not import this module)."""

    schedule: Schedule
    version: int
    prestage_only: ClassVar[bool] = True


class ControllerClient:
    """See module docstring. ``installed``: the schedules the rank starts with (their versions are
    not asked for again)."""

    def __init__(self, endpoint: str, communicator: str, rank: int, *, installed: Sequence[Schedule] = (),
                 timeout_s: float = 2.0, interval_s: float = 0.05, send_hwm: int = 16,
                 secret: JobSecret | str | bytes | None = None, candidates: bool = False) -> None:
        self.endpoint = endpoint
        self.secret = as_secret(secret) or secret_from_env()
        self.communicator = communicator
        self.rank = rank
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.candidates = candidates
        self.have = {schedule.collective.value: int(schedule.meta.version) for schedule in installed}
        self.dropped = 0
        self.sent_samples = 0
        self.sent_call_reports = 0
        self.received = 0
        self.recoveries = 0
        self.activations = 0  # new versions taken from a kept candidate by an ``activate`` frame
        self._kept: dict[tuple[str, str], Schedule] = {}  # (collective, digest) -> candidate, the newest few
        self._ask_now = False  # an ``activate`` for a candidate not kept: poll at once for the whole schedule
        self._context = zmq.Context()
        self._requests = self._socket(send_hwm)
        self._telemetry = self._socket(send_hwm)
        self._telemetry_lock = threading.Lock()
        self._request_lock = threading.Lock()
        self._sent_at: float | None = None  # when the unanswered request went out
        self._asked_at: float | None = None  # when the last request went out (wait() asks every interval_s)
        # when each version arrived here (wall clock, the controller's events are on the same clock): the
        # dispatch term of the reaction time (Fig. 13b); the newest few only
        self.arrivals: deque[tuple[str, int, float]] = deque(maxlen=64)
        self.candidate_arrivals: deque[tuple[str, int, float]] = deque(maxlen=64)  # likewise, candidates
        # (collective, version, CPU seconds this thread spent decoding the frame that brought it, whether it was an
        # ``activate`` frame): the rank's part of dispatch in CPU
        self.take_cpu: deque[tuple[str, int, float, bool]] = deque(maxlen=64)
        self._unsent_since: float | None = None  # since when a request could not go out (not connected)
        self._lost: str | None = None
        self._closed = False

    def _socket(self, hwm: int) -> zmq.Socket:
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if self.secret is not None:
            self.secret.make_client(socket)
        socket.setsockopt(zmq.SNDHWM, hwm)
        socket.setsockopt(zmq.IMMEDIATE, 1)  # no queueing towards a peer that is not connected
        try:
            socket.connect(self.endpoint)
        except zmq.ZMQError as error:
            socket.close()
            self._context.term()
            raise ControllerError(f"cannot connect to the controller at {self.endpoint!r}: {error}") from None
        return socket

    # ---- TelemetrySink ---------------------------------------------------------------------
    def submit(self, samples: Sequence[Any]) -> None:
        if not samples:
            return
        usable = finite_samples(samples)
        payload = telemetry_message(usable)
        kept = len(usable)
        with self._telemetry_lock:
            self.dropped += len(samples) - kept
            if self._closed or not kept:
                self.dropped += kept
                return
            try:
                self._telemetry.send(payload, zmq.NOBLOCK)
                self.sent_samples += kept
            except zmq.Again:
                self.dropped += kept

    def submit_calls(self, totals: Any) -> bool:
        """Send a rank's call totals (``mccl.runtime.calls.CallTotals``) with the telemetry; False when
        the telemetry socket cannot take them now (the runtime sends them again on its next flush)."""
        payload = telemetry_message((), totals)
        with self._telemetry_lock:
            if self._closed:
                return False
            try:
                self._telemetry.send(payload, zmq.NOBLOCK)
            except zmq.Again:
                return False
            self.sent_call_reports += 1
            return True

    # ---- ScheduleSource ----------------------------------------------------------------------
    def poll(self) -> Schedule | Candidate | None:
        with self._request_lock:
            return self._poll(0.0)

    def wait(self, timeout_s: float) -> Schedule | Candidate | None:
        """A new version, waiting idle up to ``timeout_s`` for one (pushed, or the answer to a poll); None if
        none came. Asks at most every ``interval_s``; raises :class:`ControllerError` as :meth:`poll` does."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._request_lock:
            while True:
                try:
                    found = self._poll(self.interval_s)
                except ControllerError:  # lost: idle out the wait (a caller looping on this must not spin)
                    if not self._closed:
                        self._requests.poll(max(int((deadline - time.monotonic()) * 1e3), 0), zmq.POLLIN)
                    raise
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if self._asked_at is None:  # the first request could not go out yet (not connected): retry soon
                    remaining = min(remaining, 0.01)
                else:  # wake up to ask again on time
                    remaining = min(remaining, max(self._asked_at + self.interval_s - time.monotonic(), 0.001))
                self._requests.poll(max(int(remaining * 1e3), 1), zmq.POLLIN)

    def _poll(self, ask_every_s: float) -> Schedule | Candidate | None:
        """One non-blocking round (the caller holds the request lock): read what arrived, ask again when
        nothing is outstanding and ``ask_every_s`` has passed since the last request."""
        if self._closed:
            raise ControllerError("the controller client was closed")
        found: Schedule | Candidate | None = None
        while found is None:
            try:
                frame = self._requests.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._sent_at = None
            if self._lost is not None:  # it answers again: recovered
                self._lost = None
                self.recoveries += 1
            cpu, activations = time.thread_time(), self.activations
            found = self._take(decode(frame))
            if found is not None and not isinstance(found, Candidate):
                self.take_cpu.append((found.collective.value, int(found.meta.version), time.thread_time() - cpu,
                                      self.activations > activations))
        now = time.monotonic()
        if self._lost is not None:
            if self._sent_at is not None and now - self._sent_at > self.timeout_s:
                self._sent_at = None  # ask again: a controller that was slow or restarted may answer it
            if self._sent_at is None:
                self._send_poll(now)
            raise ControllerError(self._lost)
        if self._sent_at is not None and now - self._sent_at > self.timeout_s:
            self._lost = f"the controller at {self.endpoint} did not answer for {self.timeout_s:g} s{self._hint()}"
            raise ControllerError(self._lost)
        due = self._asked_at is None or now - self._asked_at >= ask_every_s
        if self._ask_now and found is None:  # answered whatever is outstanding: the version, whole
            self._ask_now = not self._send_poll(now)
            due = False
        unsent = self._sent_at is None and found is None and due and not self._send_poll(now)
        if unsent and now - self._unsent_since > self.timeout_s:
            self._lost = (f"the controller at {self.endpoint} did not answer for {self.timeout_s:g} s "
                          f"(not connected){self._hint()}")
            raise ControllerError(self._lost)
        return found

    def _send_poll(self, now: float) -> bool:
        """Send a poll request; False (and the time since when) if it cannot go out (not connected)."""
        try:
            extra = {"candidates": True} if self.candidates else {}
            self._requests.send(encode("poll", communicator=self.communicator, rank=self.rank, have=self.have,
                                       **extra), zmq.NOBLOCK)
        except zmq.Again:  # not connected (yet): sent again on the next poll, lost after timeout_s of that
            if self._unsent_since is None:
                self._unsent_since = now
            return False
        self._sent_at, self._unsent_since, self._asked_at = now, None, now
        return True

    def _hint(self) -> str:
        return "" if self.secret is not None else " (this client has no control-plane secret: set MCCL_CONTROL_SECRET_FILE)"

    def _take(self, reply: dict[str, Any]) -> Schedule | Candidate | None:
        """The new version (or candidate) a reply brings, None when it brings none; :class:`ControllerError`
        naming the field for a malformed frame (the runtime's swap thread then keeps the last schedule: a
        ``KeyError`` there would have ended hot swapping for good)."""
        op = reply["op"]
        if op == "error":
            raise ControllerError(f"the controller refused a poll: {str(reply.get('message'))[:200]}")
        if op not in ("schedule", "candidate", "activate"):
            return None
        collective = text_field(reply, "collective")
        try:
            Collective(collective)
        except ValueError:
            raise ControllerError(f"{op}: unknown collective {collective[:40]!r}") from None
        version = int_field(reply.get("version"), f"{op}: 'version'", 0, 2**63 - 1)
        if version <= self.have.get(collective, 0):
            return None
        digest = reply.get("digest")
        if op == "activate":
            return self._activate(collective, version, text_field(reply, "digest"))
        text = reply.get("schedule")
        if not isinstance(text, str):
            raise ControllerError(f"{op}: 'schedule' must be a schedule file's text, got {type(text).__name__}")
        try:
            schedule = loads_schedule(text)
        except MCCLError as error:
            raise ControllerError(f"the controller sent an unreadable schedule: {error}") from None
        if schedule.collective.value != collective:
            raise ControllerError(f"{op}: a {schedule.collective.value} schedule sent as version {version} of "
                                  f"{collective}")
        if op == "candidate":  # prepared by the runtime, not adopted: ``have`` stays
            self.candidate_arrivals.append((collective, version, time.time()))
            if not self.candidates:
                return None
            if isinstance(digest, str):
                self._kept[(collective, digest)] = schedule
                while len(self._kept) > 4:
                    self._kept.pop(next(iter(self._kept)))
            return Candidate(schedule, version)
        self.have[collective] = version
        self.received += 1
        self.arrivals.append((collective, version, time.time()))
        return schedule

    def _activate(self, collective: str, version: int, digest: str) -> Schedule | None:
        """The kept candidate with ``digest`` as ``version`` of ``collective``; None (and a poll at once, answered
        with the whole schedule) when it is not kept here (module docstring)."""
        schedule = self._kept.get((collective, digest))
        if schedule is None:
            self._ask_now = True
            return None
        if int(schedule.meta.version) != version:
            schedule = schedule.with_meta(version=version)
        self.have[collective] = version
        self.received += 1
        self.activations += 1
        self.arrivals.append((collective, version, time.time()))
        return schedule

    # ---- set-up and operators -------------------------------------------------------------------
    def request(self, op: str, timeout_s: float | None = None, **fields: Any) -> dict[str, Any]:
        """A blocking request/reply on a socket of its own (set-up, status): ControllerError on timeout."""
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if self.secret is not None:
            self.secret.make_client(socket)
        # a refused handshake (wrong secret, or none against an authenticating service) would otherwise
        # read as a silent controller: say so at once
        monitor = socket.get_monitor_socket(HANDSHAKE_FAILED)
        try:
            socket.connect(self.endpoint)
            socket.send(encode(op, **fields))
            poller = zmq.Poller()
            poller.register(socket, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            ready = dict(poller.poll(int((timeout_s or self.timeout_s) * 1e3)))
            if socket not in ready and monitor in ready:
                raise ControllerError(f"the controller at {self.endpoint} refused this client's handshake: "
                                      + ("its control-plane secret is not the one the controller was started with"
                                         " (or the controller runs --insecure)" if self.secret is not None else
                                         "this client has no control-plane secret: set MCCL_CONTROL_SECRET_FILE"))
            if socket not in ready:
                raise ControllerError(f"the controller at {self.endpoint} did not answer {op!r} "
                                      f"within {timeout_s or self.timeout_s:g} s{self._hint()}")
            reply = decode(socket.recv())
        finally:
            socket.disable_monitor()
            monitor.close(linger=0)
            socket.close(linger=0)
        if reply["op"] == "error":
            raise ControllerError(f"the controller refused {op!r}: {reply.get('message')}")
        return reply

    def register(self, schedule: Schedule) -> int:
        """Tell the controller the schedule this communicator runs (startup); returns the active version."""
        reply = self.request("register", communicator=self.communicator, schedule=dumps_schedule(schedule))
        self.have[schedule.collective.value] = max(self.have.get(schedule.collective.value, 0),
                                                   int(schedule.meta.version))
        return int(reply["version"])

    def status(self) -> dict[str, Any]:
        return self.request("status")

    def telemetry_ready(self, timeout_s: float = 0.0) -> bool:
        """Whether telemetry can go out now, waiting up to ``timeout_s`` for the connection to the
        controller. Samples submitted while it cannot are dropped and counted in ``dropped``, never
        queued (a rank must not block on, or pile up for, a controller that is not there)."""
        with self._telemetry_lock:
            if self._closed:
                return False
            return bool(self._telemetry.poll(max(int(timeout_s * 1000), 0), zmq.POLLOUT))

    def close(self) -> None:
        with self._request_lock, self._telemetry_lock:
            if self._closed:
                return
            self._closed = True
            self._requests.close(linger=0)
            self._telemetry.close(linger=0)
            self._context.term()


def wait_for_controller(endpoint: str, *, secret: Any = None, timeout_s: float = 30.0,
                        alive: Callable[[], bool] | None = None, communicator: str = "probe") -> None:
    """Return once the controller at ``endpoint`` answers a ``status`` request; raise
    :class:`ControllerError` after ``timeout_s``, or at once when ``alive()`` says the process that
    should serve it has gone (a launcher that started the service passes its liveness check). The error
    names the whole wait, not the last 1 s probe (which read as a controller that answers slowly)."""
    deadline = time.monotonic() + timeout_s
    probe = ControllerClient(endpoint, communicator, -1, secret=secret)
    try:
        while True:
            try:
                probe.request("status", timeout_s=1.0)
                return
            except ControllerError as error:
                if alive is not None and not alive():
                    raise ControllerError(f"the controller at {endpoint} exited before it answered") from None
                if time.monotonic() > deadline:
                    raise ControllerError(f"the controller at {endpoint} did not answer within {timeout_s:g} s "
                                          f"(last attempt: {error})") from None
    finally:
        probe.close()
