"""A session's fast path in the service: the pipe pair of :mod:`.channel` and the thread that serves it.

Why a thread of its own. The session's socket thread waits in ``zmq_poll`` on two ZeroMQ sockets
(requests, connection events); a pipe added to that poll woke the thread through ZeroMQ's own checks of
both sockets and a Python poller before the frame was even read (the "to service" and "read" stages of
``benchmarks/provider.py``: ~50 µs together on a quiet machine). Here one thread per fast path blocks
in ``read`` on the request pipe (one system call per request; the pipe has a writer of the service's own,
through which :meth:`FastPath.stop` wakes it), and runs the frame it read — still the thread that reads a
request is the thread that runs it, and sessions still never share a thread. The session's lock
(:attr:`.session.Session.lock`) is held while a frame is handled, as the socket thread holds it while
handling a request, so a session's requests never run at once (a well-behaved tenant never sends two:
its client has one lock for both paths) and a ``free`` can never land between a cached check and the
collective that relies on it.

Why it may follow its tenant to a CPU (``channel.FOLLOW``). A request and its reply each wake a thread of
the other process; when that thread is placed on an idle CPU, the wake-up is an interrupt to a halted virtual
CPU (this machine's idle vCPUs halt at once), tens of µs each way on a quiet machine, while a wake-up on the
waker's own CPU, which then sleeps, is a context switch (a pipe round trip between two processes: 5.6 µs
on one CPU, 65 µs across two, measured here). A tenant that asks for it sends, with each request, the CPU its
calling thread runs on; the thread moves there (its affinity, one system call when the CPU changed) and
stays until the tenant runs elsewhere, or sends a request without it (then the thread may run on any of the
service's CPUs again). The tenant asks only while no task waits for a core (:class:`~.replyspin.IdleGate`):
under load a pinned thread cannot take a free CPU, and following cost 2–11 µs a call at load 25–30.
Off by default (``client.FOLLOW``): on the idle machine the move itself cost more
than it saved, 36–80 µs a call, measured. A thread the fast-path thread starts (a strategy's, from its ``between``) inherits where it is pinned. Only this session's thread moves, only within the service's own
CPUs; the job's gloo threads are untouched (they are where the in-process baseline has them too).

The tenant's ends are handed over as before (``/proc/<service pid>/fd/``, closed here once the tenant
says it opened them); the service's own writer never leaves the service. A broken framing or a tenant
that stops reading its replies ends the fast path only (its thread exits, the fds are closed); the
session and its socket stay, and the tenant may open a new one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

from mccl.provider import channel
from mccl.provider.checks import VIEW_CACHE, CollectiveChecks, Prepared, stamp
from mccl.provider.errors import BadRequest
from mccl.provider.keepwarm import KeepWarm
from mccl.provider.pollwait import PipePoll, compile_in_background
from mccl.provider.replyspin import IdleGate

__all__ = ["FastPath"]

log = logging.getLogger("mccl.provider")


class FastPath:
    """One session's pipe pair and its thread (module docstring). ``refusal(id, error)``: the session's
    error reply (counted) for a failed request; ``count``: the service's counters."""

    def __init__(self, session_id: int, checks: CollectiveChecks, lock: threading.Lock,
                 refusal: Callable[[int, Exception], dict], count: Callable[..., None],
                 warm: KeepWarm | None = None, poll_ns: int = 0) -> None:
        self.checks, self.lock, self.refusal, self.count = checks, lock, refusal, count
        self.poll_ns = poll_ns  # how long the thread polls for the next request before it sleeps in read (_next)
        self._gate = IdleGate()
        self.warm = warm  # the service's KeepWarm: each request keeps its CPUs out of deep idle a while (.keepwarm)
        self.keeps_warm = False  # (the tenant may ask: the session's "warm" request; client.WARM says why not by default)
        self._request, request_write = os.pipe()
        reply_read, self._reply = os.pipe()
        self._stop_write = os.dup(request_write)  # the service's own writer: stop() wakes the thread through it
        os.set_blocking(self._reply, False)  # a tenant that stops reading fills the pipe: its fast path closes
        os.set_blocking(self._stop_write, False)  # (a full pipe wakes the thread anyway)
        self.offered = [request_write, reply_read]  # the tenant's ends, until it has opened them
        self._reader = channel.FrameReader(self._request)
        self._pipe_poll = PipePoll(self._request)
        if poll_ns:
            compile_in_background()
        self._prepared: dict[bytes, Prepared] = {}  # requests (less their ids) already checked
        self._fds_lock = threading.Lock()  # the fds are closed once, by whichever of the thread and stop() is last
        self._stopping = False
        self._cpus = os.sched_getaffinity(0)  # where the thread may follow its tenant (channel.FOLLOW)
        self._cpu = -1  # the CPU the thread is pinned to (-1: none)
        self.closed = False
        self.thread = threading.Thread(target=self._run, name=f"mccl-session-{session_id}-fast", daemon=True)
        self.thread.start()

    def paths(self) -> dict[str, str]:
        pid = os.getpid()
        return {"request": f"/proc/{pid}/fd/{self.offered[0]}", "reply": f"/proc/{pid}/fd/{self.offered[1]}"}

    def attached(self) -> None:
        """The tenant has opened its ends: close the service's copies (only the tenant holds them now)."""
        with self._fds_lock:
            for fd in self.offered:
                os.close(fd)
            self.offered = []

    def forget(self) -> None:
        """Drop the prepared requests (an allocation is being freed; call with the session's lock held)."""
        self._prepared.clear()

    def stop(self) -> None:
        """End the fast path and wait for its thread (a collective in flight completes first)."""
        self._stopping = True
        with self._fds_lock:
            if not self.closed:
                with contextlib.suppress(OSError):  # (BlockingIOError: the pipe is full, the thread has data)
                    os.write(self._stop_write, b"\0")
        if threading.current_thread() is not self.thread:
            self.thread.join()

    # ---- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        """Block in ``read`` on the request pipe (one system call per request: no ``poll`` first). The pipe
        has a writer of the service's own (``_stop_write``), so the thread wakes on :meth:`stop`, never on the
        tenant's exit: the session ends the fast path when its connection drops (:mod:`.session`)."""
        try:
            while not self._stopping:
                frames = self._next()
                woke = time.perf_counter_ns()
                if self._stopping:
                    break
                if self.warm is not None and self.keeps_warm:
                    self.warm.touch(woke)
                if frames is None:  # the tenant broke the framing: the fast path ends
                    if self._reader._buffer:
                        self.count("malformed")
                    break
                for frame in frames:
                    with self.lock:
                        reply = self._answer(frame, woke)
                    try:
                        os.write(self._reply, reply)
                    except (BlockingIOError, BrokenPipeError):  # not reading its replies, or gone
                        self.count("malformed")
                        return
        except Exception:  # a bug here must end this fast path only
            log.exception("mccl provider: a session's fast path failed")
        finally:
            self._close()

    def _next(self) -> list[bytes] | None:
        """The next request frames: polled for up to ``poll_ns`` after the last reply while no task waits for a
        core (:class:`~.replyspin.IdleGate`), without the GIL (:mod:`.pollwait` says why both), then ``read``
        (at once when the poll saw the request, else it blocks)."""
        if self.poll_ns and self._gate.sample(time.perf_counter_ns()):
            self._pipe_poll.wait(self.poll_ns)
        return self._reader.read()

    def _answer(self, frame: bytes, woke: int) -> bytes:
        """The reply frame to one request frame; never raises. A traced request (``channel.TRACE``) gets
        its stage times back (:mod:`.channel`)."""
        if len(frame) >= channel.REQUEST.size and not frame[15] and self._cpu < 0:  # no flags: the usual request
            prepared = self._prepared.get(frame[8:])  # checked before, but for its id?
            if prepared is not None and self.checks.live(prepared):
                request_id = int.from_bytes(frame[:8], "little")
                try:
                    self.checks.execute(prepared)
                except BadRequest as refused:
                    return channel.encode_reply(request_id, self.refusal(request_id, BadRequest(refused.args[0])))
                except Exception as failed:
                    return channel.encode_reply(request_id, self.refusal(request_id, failed))
                return channel.encode_ok(request_id)
        request_id, stamps, cpu = 0, None, None
        if len(frame) >= channel.REQUEST.size:  # follow the tenant's CPU, or leave it when no longer asked
            follow = frame[channel.CPU_AT] | frame[channel.CPU_AT + 1] << 8 if frame[15] & channel.FOLLOW else 0
            if follow or self._cpu >= 0:
                self._follow(follow)
        if len(frame) > 15 and frame[15] & channel.TRACE:
            stamps, cpu = [woke], [] if frame[15] & channel.TRACE_CPU else None
            stamp(stamps, cpu)
        try:
            key = channel.request_key(frame) if len(frame) > 15 else frame
            prepared = self._prepared.get(key)  # the same request as before, but for its id (and cpu)?
            if prepared is not None and self.checks.live(prepared):
                request_id = int.from_bytes(frame[:8], "little")
                if stamps is not None:  # (a cached request: its look-up is its decoding)
                    stamp(stamps, cpu)
            else:
                request_id, _, message = channel.decode_request(frame)
                if stamps is not None:
                    stamp(stamps, cpu)
                prepared = self.checks.prepare(message)
                if len(self._prepared) >= VIEW_CACHE:
                    self._prepared.pop(next(iter(self._prepared)))
                self._prepared[key] = prepared
            self.checks.execute(prepared, stamps, cpu)
        except BadRequest as refused:
            request_id = refused.args[1] if len(refused.args) > 1 else request_id
            error = self.refusal(request_id, BadRequest(refused.args[0]))
        except Exception as failed:
            error = self.refusal(request_id, failed)
        else:
            if stamps is None:
                return channel.encode_ok(request_id)
            error = None
        if stamps is None:
            return channel.encode_reply(request_id, error)
        while len(stamps) < 5:  # (refused before the collective: the missing stages took no time)
            stamps.append(stamps[-1])
            if cpu is not None:
                cpu.append(cpu[-1])
        stamp(stamps, cpu)
        return channel.encode_reply(request_id, error, stamps + (cpu or []))

    def _follow(self, cpu_plus_one: int) -> None:
        """Move this thread to the tenant's CPU (``cpu_plus_one`` − 1; 0: unknown), if the service may run there."""
        target = cpu_plus_one - 1 if cpu_plus_one - 1 in self._cpus else -1
        if target == self._cpu:
            return
        try:
            os.sched_setaffinity(0, {target} if target >= 0 else self._cpus)  # (0: this thread)
        except OSError:  # (the CPU went offline or the service's own affinity changed: stay where it is)
            return
        self._cpu = target

    def _close(self) -> None:
        with self._fds_lock:
            for fd in (self._request, self._reply, self._stop_write, *self.offered):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.offered = []
            self.closed = True
