"""Keeps the service's CPUs out of deep idle while a tenant that asks is active (:class:`KeepWarm`).

Not asked by default (``client.WARM``): its benefit was never shown in a same-run A/B — on beat off about as
often as off beat on — while it costs CPU on a machine other work shares. The service still offers it; its
process waits on a pipe, at no cost, until a session asks.

Why. On the idle machine the provider's call cost about twice what it cost under light load, and so did the
in-process call — in CPU time, not only in waiting: the coordinator's idle run measured the in-process 4 KiB
AllGather at 265 µs of CPU against 132 at load 2.6 (BENCHMARKS.md, sixth session, re-runs). A vCPU with nothing
to run halts at once here (``haltpoll.guest_halt_poll_ns`` is 0); a host core idle long enough goes into a deep
C-state, which flushes its L1 and L2 and takes tens of µs to leave. Every thread the call wakes then starts cold
on a cold core. The provider's call wakes more threads than the in-process one (the service's fast-path thread
and the tenant's on top of gloo's worker), so it loses more: its added time grew from 18–87 µs at load ~2.5 to
94–129 (326 at 8 MiB AllGather) idle. ``benchmarks/provider_gap.py`` measures the same growth with the idle
time between a session's calls set directly.

What. While any session that keeps warm has sent a request within ``active_ns`` (100 ms), one thread per CPU of
the service, pinned there, wakes every ``tick_s`` (0.5 ms) and sleeps again: no core of the service stays idle
long enough to go deep, so the next request's wake-ups land on shallow idle. Only while no task waits for a core
(the runnable count of ``/proc/loadavg``, as :class:`~.replyspin.IdleGate`): a busy machine has no idle core to
keep warm, and there the threads check every 50 ms. Nothing runs once the tenants stop calling.

Where. The ticking threads live in a small process of their own (``python -c``, no imports beyond the standard
library), not in the service: ticking threads inside the service took its GIL 4,000 times a second and cost the
fast-path thread 26 µs of CPU a call (161 → 187 µs, ticking forced on at load ~8, measured). The service writes
the time of each request into 8 bytes of shared memory (``touch``: one ``pack_into``) and a byte into a pipe when
a quiet spell ends; the process exits when that pipe closes (the service ended, however).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
import subprocess
import sys

__all__ = ["KeepWarm", "TICK_S", "ACTIVE_NS"]

log = logging.getLogger("mccl.provider")

TICK_S = 0.0005
"""How often each CPU's thread wakes while a tenant is active: below the host's idle time for a deep C-state."""
ACTIVE_NS = 100_000_000
"""How long after a session's last request the CPUs are kept warm (a training step's collectives come closer)."""

_SHARED = struct.Struct("<QQ")  # the last request's perf_counter_ns (written here), ticks so far (written there)

_TICKER = r"""
import mmap, os, select, struct, sys, threading, time
shared_fd, wake_fd, tick_s, active_ns = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
cpus = [int(cpu) for cpu in sys.argv[5].split(",")]
shared = mmap.mmap(shared_fd, 16)
last, count = struct.Struct("<Q"), struct.Struct("<Q")
active = threading.Event()
state = {"idle": False, "sampled": -1e18}
lock = threading.Lock()

def idle(now):
    with lock:
        if now - state["sampled"] > 0.05:
            state["sampled"] = now
            try:
                with open("/proc/loadavg", "rb") as handle:
                    running = int(handle.read().split()[3].split(b"/")[0])
                state["idle"] = running <= len(os.sched_getaffinity(0))
            except (OSError, ValueError, IndexError):
                state["idle"] = False
        return state["idle"]

def tick(cpu):
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        pass
    while True:
        active.wait()
        time.sleep(tick_s if idle(time.monotonic()) else 0.05)
        with lock:
            count.pack_into(shared, 8, count.unpack_from(shared, 8)[0] + 1)

for cpu in cpus:
    threading.Thread(target=tick, args=(cpu,), daemon=True).start()
while True:
    quiet = time.perf_counter_ns() - last.unpack_from(shared, 0)[0]
    if quiet > active_ns:
        active.clear()
        select.select([wake_fd], [], [])
        if not os.read(wake_fd, 4096):
            sys.exit(0)
        continue
    active.set()
    time.sleep(min((active_ns - quiet) / 1e9, 0.01) + 1e-4)
"""


class KeepWarm:
    """A ticking process for CPUs ``cpus`` (default: the service's own), started by :meth:`start` (module
    docstring). Sessions call :meth:`touch` with each request."""

    def __init__(self, cpus: set[int] | None = None, *, tick_s: float = TICK_S, active_ns: int = ACTIVE_NS) -> None:
        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        self.tick_s = tick_s
        self.active_ns = active_ns
        self.last = -active_ns  # perf_counter_ns of the last request of a session that keeps warm
        self._shared_fd = os.memfd_create("mccl-keepwarm", os.MFD_CLOEXEC)
        os.ftruncate(self._shared_fd, _SHARED.size)
        self._shared = mmap.mmap(self._shared_fd, _SHARED.size)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self.process: subprocess.Popen | None = None

    def start(self) -> KeepWarm:
        """Start the ticking process; where none can start (no interpreter to run), the service runs without."""
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-S", "-c", _TICKER, str(self._shared_fd), str(self._wake_read), repr(self.tick_s),
                 str(self.active_ns), ",".join(map(str, self.cpus))],
                pass_fds=(self._shared_fd, self._wake_read), stdin=subprocess.DEVNULL, close_fds=True)
        except OSError as error:
            log.warning("mccl provider: the CPUs will not be kept warm (%s)", error)
            return self
        os.close(self._wake_read)  # (the process holds it: it sees EOF once the service's end closes)
        return self

    @property
    def ticks(self) -> int:
        """Ticks so far, all CPUs together (for the benchmark and tests)."""
        return _SHARED.unpack_from(self._shared, 0)[1]

    def touch(self, now_ns: int) -> None:
        """A session's request arrived at ``now_ns`` (``perf_counter_ns``): keep warm for ``active_ns`` more."""
        quiet = now_ns - self.last
        self.last = now_ns
        struct.pack_into("<Q", self._shared, 0, now_ns)
        if quiet > self.active_ns:  # (the process may be waiting for this: wake it)
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(self._wake_write, b"\0")

    def stop(self) -> None:
        """End the process (it exits at the pipe's end) and wait for it."""
        for fd in (self._wake_write, self._shared_fd) + ((self._wake_read,) if self.process is None else ()):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.process is not None:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
