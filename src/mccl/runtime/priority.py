"""The reaction path's threads above the collective's: per-thread CPU priority (Linux niceness).

Why (issue 15, seventh session). On a machine whose cores the ranks' collectives keep busy (the emulated
fabric: 8 ranks on 2 cores), a version pushed by the controller waits for a core three times on every
rank before it can be adopted — the ZeroMQ I/O thread that reads it, the hot-swap thread that stages it
and joins the round, and again for the out-of-band exchange — each wake-up competing with seven other
ranks' busy main threads at the same priority. The work itself is ~1 ms; the waits were 25–114 ms
(BENCHMARKS.md, sixth session). A thread whose niceness is below the main threads' is scheduled ahead
of them when it wakes (CFS: weight ~1.25× per step of niceness), so the swap round's few milliseconds of
work run when they are due instead of when a busy rank yields.

Niceness is per thread on Linux, and a thread inherits its creator's at creation: :func:`raised` lowers
the calling thread's niceness for a block, so the threads a library starts inside it (ZeroMQ's I/O
thread, started with a context's first socket) keep the raised priority after it. Lowering niceness needs
``CAP_SYS_NICE`` (root): without it the change is refused, reported by the return value, and everything
runs as before — priority is an optimisation, never a condition of correctness.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["raise_thread_priority", "raised", "thread_nice"]


def thread_nice() -> int:
    """The calling thread's niceness."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _set_thread_nice(nice: int) -> bool:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (PermissionError, OSError):  # not root (EACCES/EPERM), or a platform without per-thread priority
        return False
    return True


def raise_thread_priority(by: int) -> bool:
    """Lower the calling thread's niceness by ``by`` (≥ 0) steps; False when refused (module docstring)."""
    if by < 0:
        raise ValueError(f"raise_thread_priority takes a non-negative number of steps, got {by}")
    return by == 0 or _set_thread_nice(max(thread_nice() - by, -20))


@contextlib.contextmanager
def raised(by: int | None) -> Iterator[bool]:
    """The calling thread ``by`` steps of niceness higher for the block (None or 0: unchanged); threads
    created inside keep it. Yields whether it was raised."""
    if not by:
        yield False
        return
    before = thread_nice()
    ok = raise_thread_priority(by)
    try:
        yield ok
    finally:
        if ok:
            _set_thread_nice(before)  # raising niceness back is always allowed
