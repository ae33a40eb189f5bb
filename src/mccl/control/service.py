"""The controller service: the endpoint executors talk to (mccl-paper §3, Figure 3 ②③).

Transport choice. One ZeroMQ ROUTER socket bound at ``bind``; each executor rank
connects two DEALER sockets to it (:mod:`.client`):

* telemetry is a one-way stream. A DEALER with a small send high-water mark and
  ``IMMEDIATE`` sends without blocking; when the queue is full, or the service is
  not connected, the send fails at once and the client drops and counts the batch —
  a collective is never held up by the controller (§5).
* schedules are *pulled and pushed*: the client's ``poll()`` sends ``poll`` with the versions it
  has and reads the reply on its next call — fully non-blocking; and the poll subscribes
  that socket, so a version issued later is pushed to it at once (:mod:`.messages`; the
  client's ``wait()`` blocks idle on the socket for it — dispatch is one message, not a poll
  period). Unlike PUB/SUB
  this loses nothing to late joiners (a reply always carries the newest version,
  not a one-off announcement), needs no second port, and gives fail-static for
  free: a request left unanswered past the client's timeout means the controller
  is gone, and ``poll()`` raises :class:`~mccl.errors.ControllerError` so the
  runtime keeps its schedule. A poll every 50 ms per rank is ~100 µs of work here; with
  pushes, ranks poll only for liveness (``ControllerClient.interval_s``).

Authentication (:mod:`.auth`): on by default, CURVE with keys derived from a per-job
secret (``secret=``, else ``MCCL_CONTROL_SECRET_FILE`` / ``MCCL_CONTROL_SECRET``, else a
fresh one, :attr:`ControllerService.secret`). A peer without it never gets a message
through; its failed handshakes are counted (``stats["auth_failures"]``). Without
authentication the service binds to loopback only.

No message stops or stalls the service: what a message asks and its bounds are in
:mod:`.messages` (parsing with limits, the parser process for large frames, the bounded
state answers read); here, frames above ``max_message_bytes`` are refused by libzmq
(``ZMQ_MAXMSGSIZE``), and heavy messages — every ``register`` and any frame above
``inline_bytes`` — are handled on a worker thread, at most ``max_pending`` at a time
(more are refused with "busy"), so polls keep being answered meanwhile.

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
:func:`.protocol.calls_of`); the service keeps the latest of each (communicator, rank), bounded
(:class:`.messages.Requests`), and returns them in ``status``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import zmq

from mccl.control.auth import CurveServer, JobSecret, as_secret, is_loopback, new_secret, secret_from_env
from mccl.control.manager import ScheduleManager
from mccl.control.messages import Limits, Requests, looks_heavy
from mccl.control.protocol import MAX_MESSAGE_BYTES, encode
from mccl.errors import ControllerError

__all__ = ["ControllerService"]

log = logging.getLogger("mccl.control")

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
        self.limits = Limits(max_message_bytes=max_message_bytes, inline_bytes=inline_bytes,
                             max_communicators=max_communicators, max_pending=max_pending,
                             max_status_events=max_status_events, subprocess_bytes=subprocess_bytes,
                             max_ingest_backlog=max_ingest_backlog, max_call_rows=max_call_rows)
        if authenticate:
            self.secret: JobSecret | None = as_secret(secret) or secret_from_env() or new_secret()
        elif not is_loopback(bind):
            raise ControllerError(f"refusing to serve {bind} without authentication: only loopback, ipc or inproc "
                                  "endpoints may be unauthenticated")
        else:
            self.secret = None
        self._context = zmq.Context()
        self._curve: CurveServer | None = None
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes + 4096)  # JSON envelope of a maximal schedule
        try:
            if self.secret is not None:
                self._curve = CurveServer(self._context, self._socket, self.secret, _OneKey(self.secret.client_keys[0]),
                                          log_name="mccl.control.zap")
            self._socket.bind(bind)
        except zmq.ZMQError as error:
            self._close()
            raise ControllerError(f"cannot bind the controller at {bind}: {error}") from None
        self.address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.secret is not None and not is_loopback(self.address):
            log.info("mccl controller: listening beyond loopback at %s (CURVE-authenticated)", self.address)
        self.stats = {"telemetry_messages": 0, "samples": 0, "malformed": 0, "polls": 0, "replies": 0,
                      "schedules_sent": 0, "checks": 0, "auth_failures": 0, "busy": 0, "registrations": 0,
                      "telemetry_dropped": 0, "call_reports": 0, "call_reports_dropped": 0, "pushes": 0}
        self._ingest = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mccl-ingest")
        self._ingest_backlog = 0
        self._ingest_lock = threading.Lock()
        self._stop = threading.Event()
        self.requests = Requests(manager, self.limits, self.stats, take_telemetry=self._take_telemetry,
                                 on_stop=self._stop.set)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mccl-synth")
        self._heavy = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mccl-register")
        self._results: queue.SimpleQueue[tuple[bytes, bytes | None]] = queue.SimpleQueue()
        # ScheduleManager.step calls back after each issued version (pushed at once); not every manager's does
        self._step_hands_on = "on_issue" in inspect.signature(manager.step).parameters
        self._pending = 0
        self._step: Future | None = None
        self._thread: threading.Thread | None = None
        # the worker thread wakes the socket thread when a check issued a version (to push it at once)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)

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
        if self._curve is not None:
            self._curve.close()
        self._socket.close(linger=0)
        self._context.term()
        for fd in (getattr(self, "_wake_read", None), getattr(self, "_wake_write", None)):
            if fd is not None:
                os.close(fd)

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        if self._curve is not None:
            poller.register(self._curve.monitor, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        next_check = time.monotonic()
        try:
            while not self._stop.is_set():
                timeout_ms = max(0.0, (next_check - time.monotonic()) * 1e3)
                if self._pending:
                    timeout_ms = min(timeout_ms, _RESULT_WAIT_MS)
                ready = dict(poller.poll(timeout_ms))
                if self._curve is not None and self._curve.monitor in ready:
                    self._count_handshakes()
                if self._socket in ready:
                    self._drain()
                if self._wake_read in ready:
                    self._woken()
                self._send_results()
                self._push()
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.check_interval_s
                    if self._step is None or self._step.done():
                        self._step = self._worker.submit(self._run_step)
        finally:
            self._ingest.shutdown(wait=True, cancel_futures=True)
            self._heavy.shutdown(wait=True, cancel_futures=True)
            self._worker.shutdown(wait=True, cancel_futures=True)
            self.requests.close()
            self._close()

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:  # not copied: a 38 MiB frame's copy held the GIL ~30 ms (small ones are copied by pyzmq anyway)
                parts = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(parts) != 2:  # not one of our clients
                self.stats["malformed"] += 1
                continue
            identity, frame = parts[0].bytes, parts[1].buffer
            if looks_heavy(frame, self.limits):
                self._hand_off(identity, frame)
            else:
                reply = self.requests.handle(frame, identity)
                if reply is not None:
                    self._reply(identity, reply)

    def _count_handshakes(self) -> None:
        failed = self._curve.failed_handshakes()
        if failed and self.stats["auth_failures"] == 0:
            # Who, libzmq does not say (its event names this end). Seen from "unknown peers": a client of an
            # earlier job on this host, reconnecting forever to the port this service now holds (reproduced:
            # ~13 failed handshakes a second per stray socket), or a rank without the job's secret.
            log.warning("mccl controller: a peer failed the authentication handshake (a rank without the job's "
                        "secret, or a client of another job reconnecting to this reused port); further ones are "
                        "counted")
        self.stats["auth_failures"] += failed

    def _run_step(self) -> None:
        try:
            self.stats["checks"] += 1
            if self._step_hands_on:
                self.manager.step(on_issue=self._publish)
            else:  # a manager of another kind (time sharing's TenancyManager): refresh after its whole step
                self.manager.step()
            self._publish()
        except Exception:  # a bug in a check must not stop the service; it is logged
            log.exception("mccl controller: drift check failed")

    def _publish(self) -> None:
        """Refresh the snapshot; a changed version is pushed at once (not after the socket thread's poll timeout)."""
        if self.requests.refresh(self.requests.known()):
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # the pipe is full: the socket thread is waking anyway
            os.write(self._wake_write, b"!")

    def _woken(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: drained
            while os.read(self._wake_read, 4096):
                pass

    def _push(self) -> None:
        """Send newly issued versions to the sockets that polled for them (socket thread; :mod:`.messages`)."""
        for identity, frame in self.requests.pushes():
            self._reply(identity, frame)

    def _take_telemetry(self, samples: list) -> None:
        with self._ingest_lock:
            if self._ingest_backlog >= self.limits.max_ingest_backlog:
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

    def calls(self) -> dict[str, dict[int, list[tuple[str, str, int | None, int]]]]:
        """The latest call totals each rank reported, by communicator and rank (also in ``status``)."""
        return self.requests.calls()

    # ---- messages ----------------------------------------------------------------------
    def _reply(self, identity: bytes, payload: bytes) -> None:
        try:
            self._socket.send_multipart([identity, payload], zmq.NOBLOCK)
            self.stats["replies"] += 1
        except zmq.ZMQError:  # the client is gone or not reading; it will time out and ask again
            pass

    def _hand_off(self, identity: bytes, frame: bytes | memoryview) -> None:
        if self._pending >= self.limits.max_pending:
            self.stats["busy"] += 1
            self._reply(identity, encode("error", message=f"the controller is busy ({self._pending} large messages "
                                                          "in hand); try again"))
            return
        self._pending += 1

        def work() -> None:
            try:
                self._results.put((identity, self.requests.handle(frame)))
            except BaseException:  # noqa: BLE001 - handle() already turns every Exception into a reply
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
