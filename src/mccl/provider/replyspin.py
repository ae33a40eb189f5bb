"""When a fast-path call spins for its reply instead of sleeping (:class:`ReplySpin`, used by :mod:`.client`).

Why spin at all. This machine's idle vCPUs halt at once (``haltpoll.guest_halt_poll_ns`` is 0): a reply that
finds its tenant's vCPU halted waits for the hypervisor to wake it, once per call on top of the service's own
wake-up. A tenant that polls the reply pipe across the moment the reply comes sees it at once. Measured on a
quiet machine by the coordinator (BENCHMARKS.md, fourth session, re-runs): a 200 µs spin from the send took
the added time from 91–114 µs to 80–97 µs at ≤ 64 KiB AllGather and every AllReduce size — but not for the
512 KiB / 8 MiB AllGather, whose replies come after the spin had ended.

Two rules make it cheap and harmless, where the fourth session's fixed spin was not:

* **Around the expected reply only.** The call's duration is remembered per request (the same key as the
  encoded request's cache); a call expected to take longer than the spin window first sleeps (``select``, µs
  resolution; ``poll`` rounds to ms) until half a window before it is due, then polls across it. A call with no
  history, or a short one, polls from the send, as before. Either way at most ``spin_ns`` of polling per call.
* **Only while no task waits for a core.** Under load the spin cost more than it saved (fourth session: the service's
  gloo thread waited for the spinner's core, 80–230 µs worse per call at load 20). Spinning pays only when no
  task waits for a core: the instantaneous count of runnable tasks in ``/proc/loadavg`` (sampled at most every
  50 ms, right *before* a request is sent: the caller is in it) must not exceed the cores this process may use.
  Otherwise the call sleeps in ``poll`` at once. (The fifth session sampled right after the send, when the
  service's freshly woken thread was counted too: on the quiet machine the gate then refused 80–90 % of the
  calls — 366–654 of 3300 spun in the coordinator's re-runs — so "spin" and "no spin" measured mostly the same
  path.)

Sixth session: the window is 1 ms (``client.SPIN_US``), so a call up to ~1 ms — every size here but the 8 MiB
AllGather — polls from its send to its reply. The coordinator's quiet re-run showed why a shorter spin does not
do: with the spin ending at 200 µs and replies at ~300 µs, the reply's trip to the tenant took 93–111 µs of the
call (a halted vCPU woken), against 25–30 µs under load. A spinning tenant also keeps its CPU awake for the
service's thread, which follows it there (:mod:`.fastpath`).
"""

from __future__ import annotations

import os
import select
import time

__all__ = ["IdleGate", "ReplySpin"]

_SAMPLE_NS = 50_000_000  # how often the runnable count is read
_NAP_MIN_NS = 50_000  # a shorter sleep than this is not worth a timer (and the kernel's timer slack is 50 µs)


def _no_task_waits_for_a_core() -> bool:
    """Whether no more tasks are runnable now than this process has cores (False where it cannot be read)."""
    try:
        with open("/proc/loadavg", "rb") as handle:
            running = int(handle.read().split()[3].split(b"/")[0])
        return running <= len(os.sched_getaffinity(0))
    except (OSError, ValueError, IndexError):
        return False


class IdleGate:
    """Whether no task waits for a core, re-read at most every 50 ms (module docstring). The client asks it before
    each fast-path send, for the spin and for the service thread's following (:mod:`.fastpath`: under load a thread
    pinned to its tenant's CPU cannot take the other, free one — 2–11 µs a call at load 25–30, measured)."""

    def __init__(self, idle=_no_task_waits_for_a_core) -> None:
        self.idle = idle  # (replaceable in tests)
        self.now = False
        self._sampled = -_SAMPLE_NS

    def sample(self, now: int) -> bool:
        """Right before a request is sent (``now``: ``perf_counter_ns``): whether a core is free."""
        if now - self._sampled > _SAMPLE_NS:
            self._sampled, self.now = now, self.idle()
        return self.now


class ReplySpin:
    """The reply wait's spin for one client (module docstring). ``spin_ns``: the most a call polls; ``fd``: the
    reply pipe; ``idle``: whether spinning may take a core now, or ``gate``: an :class:`IdleGate` to share."""

    def __init__(self, spin_ns: int, fd: int, idle=_no_task_waits_for_a_core, gate: IdleGate | None = None) -> None:
        self.spin_ns = spin_ns
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self.gate = gate if gate is not None else IdleGate(idle)
        self._took: dict[tuple, int] = {}  # the last duration (ns) of each request
        self.spun = 0  # calls that spun (for the benchmark and tests)

    def sample(self, now: int) -> bool:
        """Right before a request is sent (``now``: ``perf_counter_ns``): re-read whether a core is free."""
        return self.gate.sample(now)

    def wait(self, key: tuple, sent: int) -> None:
        """After the request ``key`` was sent at ``sent`` (``perf_counter_ns``; :meth:`sample` called before):
        nap and spin as the module docstring says; returns when the reply is there or the window has passed (the
        caller then polls)."""
        if not self.gate.now:
            return
        now = time.perf_counter_ns()
        took = self._took.get(key)
        half = self.spin_ns // 2
        if took is not None and took > self.spin_ns:
            nap = sent + took - half - now
            if nap > _NAP_MIN_NS and not self._nap(nap):
                return  # (the reply came while it slept)
            until = sent + took + half
        else:
            until = now + self.spin_ns
        self.spun += 1
        poll = self._poll.poll
        while not poll(0) and time.perf_counter_ns() < until:
            os.sched_yield()

    def _nap(self, nap_ns: int) -> bool:
        """Sleep ``nap_ns`` unless the reply comes first; whether the whole nap passed without it."""
        if self.fd < 1024:  # (select's descriptor limit; poll's timeout is whole milliseconds)
            readable, _, _ = select.select([self.fd], [], [], nap_ns / 1e9)
            return not readable
        return not self._poll.poll(nap_ns // 1_000_000)

    def record(self, key: tuple, took_ns: int) -> None:
        """The call ``key`` took ``took_ns`` from its send to its reply."""
        if len(self._took) >= 256:
            self._took.clear()
        self._took[key] = took_ns
