"""Waiting on a CPU for a pipe to become readable, without the GIL (:class:`PipePoll`): how the service's fast-path
thread polls for its tenant's next request after each reply (``ServiceConfig.poll_us``, :mod:`.fastpath`).

Why poll at all. A thread asleep in ``read`` lets its vCPU halt (this VM's idle vCPUs halt at once), and the
tenant's next request then wakes it through the hypervisor: tens of µs on every call, the largest part of the
service's added time on small collectives (BENCHMARKS.md, twelfth session). MCCS's service threads poll all the
time; here a thread polls for a window after each reply, and only while no task waits for a core.

Why compiled. A Python loop around ``poll(fd, 0)`` holds the GIL but for the system call itself, and CPython hands
a released GIL to a waiting thread only when that thread's switch interval (5 ms) runs out: one session's polling
would delay every other Python thread of the service (another session's, a job's, the socket threads) by up to
5 ms. Here the loop is numba-compiled and runs with the GIL released, calling libc's ``poll`` and
``clock_gettime`` through ctypes. numba cannot cache a function that calls through ctypes pointers, so it is
compiled once per process (~0.5 s) by :func:`compile_in_background`; until then :meth:`PipePoll.wait` returns at
once (the caller sleeps in ``read`` as before).
"""

from __future__ import annotations

import ctypes
import logging
import select
import threading
import time
from collections.abc import Callable

import numpy as np

__all__ = ["PipePoll", "compile_in_background", "compiled"]

log = logging.getLogger("mccl.provider")

_CLOCK_MONOTONIC = 1  # (Linux; what time.monotonic_ns reads)
_compiled: list[Callable] = []  # the compiled loop, once it is
_failed: list[Exception] = []  # why it could not be compiled, if it could not (never retried)
_compiling = threading.Lock()


def _compile() -> None:
    import numba

    libc = ctypes.CDLL(None, use_errno=True)
    poll, clock_gettime = libc.poll, libc.clock_gettime
    poll.argtypes, poll.restype = (ctypes.c_size_t, ctypes.c_ulong, ctypes.c_int), ctypes.c_int  # (pollfd*, n, ms)
    clock_gettime.argtypes, clock_gettime.restype = (ctypes.c_int, ctypes.c_size_t), ctypes.c_int  # (clock, ts*)

    @numba.njit(nogil=True, cache=False)
    def poll_until(pollfd_address: int, clock_address: int, clock: np.ndarray, deadline_ns: int) -> bool:
        while True:
            if poll(pollfd_address, 1, 0) > 0:  # readable, or its writer gone (POLLHUP): read() tells which
                return True
            clock_gettime(_CLOCK_MONOTONIC, clock_address)
            if clock[0] * 1_000_000_000 + clock[1] >= deadline_ns:
                return False

    pollfd, clock = np.array([-1, 0], np.int32), np.zeros(2, np.int64)  # (poll skips a negative fd)
    poll_until(pollfd.ctypes.data, clock.ctypes.data, clock, 0)  # compiles it; returns at once (deadline 0)
    _compiled.append(poll_until)


def compile_in_background() -> None:
    """Compile the loop on a daemon thread (once per process; later calls do nothing). A failure is logged once and
    not retried: the fast paths then sleep in ``read`` as they did before polling existed."""
    def run() -> None:
        with _compiling:
            if _compiled or _failed:
                return
            try:
                _compile()
            except Exception as error:  # (numba or libc not as expected here: no polling, said once)
                _failed.append(error)
                log.warning("mccl provider: no polling for requests (could not compile the poll loop: %s: %s)",
                            type(error).__name__, error)

    if not _compiled and not _failed and not _compiling.locked():
        threading.Thread(target=run, name="mccl-pollwait-compile", daemon=True).start()


def compiled() -> bool:
    """Whether :meth:`PipePoll.wait` polls yet."""
    return bool(_compiled)


class PipePoll:
    """Polls one file descriptor for readability (``wait``), on this CPU, with the GIL released."""

    def __init__(self, fd: int) -> None:
        self._pollfd = np.array([fd, select.POLLIN], np.int32)  # struct pollfd {int fd; short events, revents;}
        self._clock = np.zeros(2, np.int64)  # struct timespec (the loop's clock reading)

    def wait(self, ns: int) -> bool:
        """Poll for up to ``ns``: True once the fd is readable (or hung up), False when the time ran out or the
        loop is not compiled yet."""
        if not _compiled:
            return False
        return bool(_compiled[0](self._pollfd.ctypes.data, self._clock.ctypes.data, self._clock,
                                 time.monotonic_ns() + ns))
