"""How a fast-path call waits for its reply: it spins or it sleeps, whichever its own recent calls measured cheaper
(:class:`ReplyWait`, used by :mod:`.client`).

Why it matters. A call hands off twice (the request wakes the service's thread, the reply wakes the tenant's), and
what a hand-off costs depends on the machine's idleness more than on the code: this VM's idle vCPUs halt at once
(``haltpoll.guest_halt_poll_ns`` is 0), and waking a halted vCPU goes through the hypervisor — tens of µs, more
after a long halt; under load a woken thread lands on a busy CPU and costs a context switch. A tenant that polls its
reply pipe keeps its CPU awake and sees the reply at once; but a poller also takes a core that the service's thread
or the job's gloo worker may need. The coordinator's same-run measurements (BENCHMARKS.md, sixth session, re-runs)
show the two regimes pulling apart: on the idle box spinning took 47–205 µs off every call up to 512 KiB (`nofollow`
16–58 µs added against `plain` 63–98), while at load ~2.6 the same two read 21–87 and 14–75 — the spin no better, at
8 MiB AllGather worse (74 against 58). No fixed rule is right on both, so each call decides from measurement:

* **Per request, by measured duration.** For every distinct request (the same key as the encoded request's cache)
  the last ``_WINDOW`` durations (send to reply) of each way are kept; the first calls alternate until each way has
  ``_FIRST``; then the call takes the way whose median is lower, and now and then one takes the other, so a change
  of regime (the machine goes idle, a core gets busy) is seen. Such a call costs the difference of the two medians,
  so it comes once in (that difference ÷ ``_EXPLORE_NS``) calls, between ``_EXPLORE`` and ``_EXPLORE_MAX``: ≤ 5 µs
  a call on average where that allows (a spin that shares its core with an 8 MiB copy can cost milliseconds).
* **Spinning is over the whole call**, from the send until the reply or ``spin_ns`` past the duration expected (the
  request's last), so the tenant's vCPU never halts in between: the service's thread and the job's gloo worker then
  find it awake. A call expected longer than ``MAX_SPIN_NS`` always sleeps (a wake-up is under 1 % of it).
* **Never while a task waits for a core** (:class:`IdleGate`): the instantaneous count of runnable tasks in
  ``/proc/loadavg`` (sampled at most every 50 ms, right *before* a request is sent: the caller is in it) must not
  exceed the cores this process may use. Under load a spin cost more than it saved (fourth session: the service's
  gloo thread waited for the spinner's core, 80–230 µs worse per call at load 20). Such calls sleep and are not
  recorded (they say nothing of the idle machine's choice).

The sixth session's rule (spin gated by load alone, a nap until half a window before a long call's reply) and its
following of the tenant's CPU are what the measurements above compared; ``benchmarks/provider.py --single-host``
keeps a fixed-spin and a following variant beside this one.
"""

from __future__ import annotations

import os
import select
import time

__all__ = ["IdleGate", "ReplyWait", "MAX_SPIN_NS"]

_SAMPLE_NS = 50_000_000  # how often the runnable count is read
_WINDOW = 8  # durations kept per request and way
_FIRST = 3  # durations of each way before the call chooses
_EXPLORE = 16  # at most every 16th call of a request takes the way not chosen ...
_EXPLORE_MAX = 256  # ... at least every 256th
_EXPLORE_NS = 5_000  # ... and their cost averaged over the calls between is at most this where those bounds allow
MAX_SPIN_NS = 10_000_000
"""A call expected longer than this (10 ms) never spins: its wake-up (≤ ~0.1 ms measured here) is under 1 % of it,
and a spin would burn a core for the whole call."""


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


def _median(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


class _Ways:
    """One request's recent durations (ns) of each way, and the way they choose."""

    __slots__ = ("spin", "sleep", "calls", "best", "last", "explore_every")

    def __init__(self) -> None:
        self.spin: list[int] = []
        self.sleep: list[int] = []
        self.calls = 0
        self.best = True  # spin
        self.last = 0  # the last duration, either way (what a spin expects)
        self.explore_every = _EXPLORE


class ReplyWait:
    """The reply wait of one client (module docstring). ``spin_ns``: how far past the expected reply a spin polls;
    ``fd``: the reply pipe; ``gate``: the client's :class:`IdleGate` (or ``idle``, to make one); ``adaptive``: False
    spins every call the gate and ``MAX_SPIN_NS`` allow (the fixed rule, for the benchmark's comparison)."""

    def __init__(self, spin_ns: int, fd: int, idle=_no_task_waits_for_a_core, gate: IdleGate | None = None,
                 adaptive: bool = True) -> None:
        self.spin_ns = spin_ns
        self.fd = fd
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        self._poll = poller.poll
        self.adaptive = adaptive
        self.gate = gate if gate is not None else IdleGate(idle)
        self._ways: dict[tuple, _Ways] = {}
        # (counts for the benchmark and tests) calls that spun, that slept by choice, that took the way not chosen
        self.spun = self.slept = self.explored = 0

    def choose(self, key: tuple, now: int) -> bool | None:
        """Right before request ``key`` is sent (``now``: ``perf_counter_ns``): True to spin, False to sleep, None
        to sleep unrecorded (a task waits for a core)."""
        if not self.gate.sample(now):
            return None
        ways = self._ways.get(key)
        if ways is None:
            if len(self._ways) >= 256:
                self._ways.clear()
            ways = self._ways[key] = _Ways()
        ways.calls += 1
        if ways.last > MAX_SPIN_NS:
            spin = False
        elif not self.adaptive:
            spin = True
        elif len(ways.spin) < _FIRST or len(ways.sleep) < _FIRST:
            spin = len(ways.spin) <= len(ways.sleep)  # (alternate until each way has its first durations)
        elif ways.calls % ways.explore_every:
            spin = ways.best
        else:
            spin = not ways.best
            self.explored += 1
        if spin:
            self.spun += 1
        else:
            self.slept += 1
        return spin

    def spin(self, key: tuple, sent: int) -> None:
        """After the request ``key`` was sent at ``sent``: poll the reply pipe, yielding the CPU between polls, until
        the reply is there or ``spin_ns`` past the duration expected; the caller then reads it (or sleeps in
        ``poll`` for a later one)."""
        ways = self._ways.get(key)
        until = sent + (ways.last if ways is not None else 0) + self.spin_ns
        poll = self._poll
        while not poll(0) and time.perf_counter_ns() < until:
            os.sched_yield()

    def record(self, key: tuple, took_ns: int, spun: bool) -> None:
        """The call ``key`` took ``took_ns`` from its send to its reply, spinning or not (as :meth:`choose` said)."""
        ways = self._ways.get(key)
        if ways is None:
            return
        ways.last = took_ns
        durations = ways.spin if spun else ways.sleep
        durations.append(took_ns)
        if len(durations) > _WINDOW:
            del durations[0]
        if len(ways.spin) >= _FIRST and len(ways.sleep) >= _FIRST:
            spin, sleep = _median(ways.spin), _median(ways.sleep)
            ways.best = spin <= sleep
            ways.explore_every = min(_EXPLORE_MAX, max(_EXPLORE, abs(spin - sleep) // _EXPLORE_NS))

    def choices(self, key: tuple) -> tuple[list[int], list[int], bool] | None:
        """(recent spin durations, recent sleep durations, whether it spins) of request ``key`` (tests, benchmark)."""
        ways = self._ways.get(key)
        return None if ways is None else (list(ways.spin), list(ways.sleep), ways.best)
