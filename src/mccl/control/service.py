"""The controller service: the endpoint executors talk to (mccl-paper §3, Figure 3 ②③).

Transport choice. One ZeroMQ ROUTER socket bound at ``bind``; each executor rank
connects two DEALER sockets (:mod:`.client`):

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

Threads. The service thread owns the socket (ZeroMQ sockets are single-threaded):
it ingests telemetry, answers requests, and every ``check_interval_s`` hands
``ScheduleManager.step`` (drift test, synthesis) to one worker thread, so telemetry
keeps flowing while a synthesis runs (the manager aborts a synthesis whose
degradation cleared meanwhile).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import zmq

from mccl.control.manager import ScheduleManager
from mccl.control.protocol import decode, encode, samples_of
from mccl.errors import ControllerError, MCCLError
from mccl.schedule import Collective, loads_schedule

__all__ = ["ControllerService"]

log = logging.getLogger("mccl.control")


class ControllerService:
    """Serve ``manager`` at ``bind`` (e.g. ``tcp://127.0.0.1:5555``; port ``*`` picks a free one)."""

    def __init__(self, manager: ScheduleManager, bind: str, *, check_interval_s: float = 0.02) -> None:
        self.manager = manager
        self.check_interval_s = check_interval_s
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(bind)
        except zmq.ZMQError as error:
            self._socket.close()
            self._context.term()
            raise ControllerError(f"cannot bind the controller at {bind}: {error}") from None
        self.address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.stats = {"telemetry_messages": 0, "samples": 0, "malformed": 0, "polls": 0, "replies": 0,
                      "schedules_sent": 0, "checks": 0}
        self._stop = threading.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mccl-synth")
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

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        next_check = time.monotonic()
        try:
            while not self._stop.is_set():
                timeout_ms = max(0.0, (next_check - time.monotonic()) * 1e3)
                if poller.poll(timeout_ms):
                    while True:
                        try:
                            identity, frame = self._socket.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        except ValueError:  # not two frames: not one of our clients
                            self.stats["malformed"] += 1
                            continue
                        self._handle(identity, frame)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.check_interval_s
                    if self._step is None or self._step.done():
                        self._step = self._worker.submit(self._run_step)
        finally:
            self._worker.shutdown(wait=True, cancel_futures=True)
            self._socket.close(linger=0)
            self._context.term()

    def _run_step(self) -> None:
        try:
            self.stats["checks"] += 1
            self.manager.step()
        except Exception:  # a bug in a check must not stop the service; it is logged
            log.exception("mccl controller: drift check failed")

    # ---- messages ----------------------------------------------------------------------
    def _reply(self, identity: bytes, payload: bytes) -> None:
        try:
            self._socket.send_multipart([identity, payload], zmq.NOBLOCK)
            self.stats["replies"] += 1
        except zmq.Again:  # the client is gone or not reading; it will time out and ask again
            pass

    def _handle(self, identity: bytes, frame: bytes) -> None:
        try:
            message = decode(frame)
            op = message["op"]
            if op == "telemetry":
                samples = samples_of(message)
                self.stats["telemetry_messages"] += 1
                self.stats["samples"] += len(samples)
                self.manager.ingest(samples)
            elif op == "poll":
                self.stats["polls"] += 1
                self._reply(identity, self._answer_poll(message))
            elif op == "register":
                schedule = loads_schedule(str(message["schedule"]))
                version = self.manager.register(str(message["communicator"]), schedule)
                self._reply(identity, encode("ok", version=version))
            elif op == "status":
                events = [dataclasses.asdict(event) for event in self.manager.events]
                stats = {**self.stats, "samples_taken": self.manager.samples_taken,
                         "samples_ignored": self.manager.samples_ignored}
                self._reply(identity, encode("status", events=events, stats=stats))
            elif op == "stop":
                self._reply(identity, encode("ok"))
                self._stop.set()
            else:
                raise ControllerError(f"unknown controller operation {op!r}")
        except (MCCLError, KeyError, TypeError, ValueError) as error:
            self.stats["malformed"] += 1
            if self.stats["malformed"] == 1:
                log.warning("mccl controller: bad message (%s); further ones are only counted", error)
            if decode_op(frame) not in (None, "telemetry"):
                self._reply(identity, encode("error", message=str(error)))

    def _answer_poll(self, message: dict) -> bytes:
        communicator = str(message["communicator"])
        have = {str(k): int(v) for k, v in dict(message.get("have", {})).items()}
        for kind in Collective:
            latest = self.manager.latest(communicator, kind)
            if latest is not None and latest[0] > have.get(kind.value, 0):
                self.stats["schedules_sent"] += 1
                return encode("schedule", collective=kind.value, version=latest[0], schedule=latest[1])
        return encode("idle", versions=self.manager.versions(communicator))


def decode_op(frame: bytes) -> str | None:
    try:
        return str(decode(frame)["op"])
    except (MCCLError, KeyError):
        return None
