"""Keeps the service's CPUs out of deep idle while a tenant is active (:class:`KeepWarm`).

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
long enough to go deep, so the next request's wake-ups land on shallow idle. It costs a timer wake-up per CPU and
tick (measured by :attr:`KeepWarm.ticks` and the service's CPU in ``benchmarks/provider.py``), and nothing once
the tenants stop calling (the threads then wait on an event). Only while no task waits for a core
(:class:`~.replyspin.IdleGate`): a busy machine has no idle core to keep warm, and there the threads check every
50 ms.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from mccl.provider.replyspin import IdleGate

__all__ = ["KeepWarm", "TICK_S", "ACTIVE_NS"]

TICK_S = 0.0005
"""How often each CPU's thread wakes while a tenant is active: below the host's idle time for a deep C-state."""
ACTIVE_NS = 100_000_000
"""How long after a session's last request the CPUs are kept warm (a training step's collectives come closer)."""
_LOADED_S = 0.05  # how long a thread sleeps when a task waits for a core (then nothing is idle)


class KeepWarm:
    """One ticking thread per CPU ``cpus`` (default: the service's own), started by :meth:`start` (module
    docstring). Sessions call :meth:`touch` with each request."""

    def __init__(self, cpus: set[int] | None = None, *, tick_s: float = TICK_S, active_ns: int = ACTIVE_NS,
                 gate: IdleGate | None = None) -> None:
        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        self.tick_s = tick_s
        self.active_ns = active_ns
        self.gate = gate if gate is not None else IdleGate()
        self.last = -active_ns  # perf_counter_ns of the last request of a session that keeps warm
        self.ticks = 0  # (for the benchmark and tests)
        self._active = threading.Event()
        self._gate_lock = threading.Lock()
        self._stopping = False
        self.threads = [threading.Thread(target=self._run, args=(cpu,), name=f"mccl-keepwarm-{cpu}", daemon=True)
                        for cpu in self.cpus]

    def start(self) -> KeepWarm:
        for thread in self.threads:
            thread.start()
        return self

    def touch(self, now_ns: int) -> None:
        """A session's request arrived at ``now_ns`` (``perf_counter_ns``): keep warm for ``active_ns`` more."""
        self.last = now_ns
        if not self._active.is_set():
            self._active.set()

    def stop(self) -> None:
        self._stopping = True
        self._active.set()
        for thread in self.threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=5)

    def _run(self, cpu: int) -> None:
        with contextlib.suppress(OSError):  # (the CPU went offline: keep warm wherever the thread runs)
            os.sched_setaffinity(0, {cpu})  # (0: this thread)
        while not self._stopping:
            now = time.perf_counter_ns()
            if now - self.last > self.active_ns:
                self._active.clear()
                if time.perf_counter_ns() - self.last > self.active_ns:  # (a touch between the check and the clear)
                    self._active.wait()
                continue
            with self._gate_lock:  # (one IdleGate for every thread)
                idle = self.gate.sample(now)
            time.sleep(self.tick_s if idle else _LOADED_S)
            self.ticks += 1
