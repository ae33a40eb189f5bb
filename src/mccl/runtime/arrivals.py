"""When each receive's last byte arrived: waiter threads for the receive-side telemetry (gloo).

Why: the eager driver waits on the receives that unlock nothing (and, on a rank with one upstream
peer, on all of them) one at a time, in its own order (earliest step first), and gloo's
``Work.is_completed()`` stays False until the Work is waited on (torch 2.13). So such a receive
that arrives while the driver waits on another one is noticed only when its own turn comes — its
arrival time is lost, and with it the telemetry's windows (measured on the 8-rank emulated fabric,
before the relays' receives got threads of their own, :mod:`mccl.runtime.completions`: half of rank
0's inter-host receives of an AllGather were found done, 20–110 ms after they had arrived). A few threads that do nothing but block in ``wait()`` on the receives,
in the order they were posted, stamp most arrivals exactly (65 of 66 there).

Which receives: those through the NIC, and only where its byte counter is read
(:class:`mccl.runtime.telemetry.Meters`): the counter needs its readings at the arrivals, and a
waiter's hand-over costs CPU per receive — with every receive watched, a loopback AllGather (CPU-bound,
many small receives) cost +55 % CPU; the NIC's few large receives per collective cost nothing measurable.

How it stays safe:

* **One waiter per Work.** A gloo receive must be waited on once (a second ``wait`` blocks on a
  receive that never comes), so a :class:`TimedReceive` is *claimed* by whoever waits first — a
  waiter thread or the executor itself. The executor never waits on a waiter: if no waiter has
  claimed the receive yet it claims it and waits directly, so a receive posted behind receives
  that cannot complete yet (they wait for this rank's own forwarding) cannot deadlock the call,
  however few waiters there are.
* **Errors travel.** A failed wait (a broken group: :meth:`mccl.runtime.transport.Transport._break`)
  is stored and raised again to the executor, which turns it into ``PeerLost`` as before.
* **Cost.** The waiters are idle in a C++ wait with the GIL released; per watched receive one
  hand-over (a deque append, a condition notify, an event). Threads are started once per communicator.

**The NIC's byte counter** (``counter``, :func:`nic_rx_counter`): when the ranks' NIC is named (gloo's
``GLOO_SOCKET_IFNAME``), the waiter also reads the kernel's count of bytes the NIC has received right after
it stamps an arrival (``counted``). Why: arrival times alone cannot say how many bytes crossed the port
between two arrivals when transfers overlap — part of a concurrent transfer has already arrived before
the first of them completes, and counting it whole made a window read up to 2× the port's rate on the
emulated fabric. The counter does: it moves with every packet (on the NIC that carries the inter-host
traffic; receive-side windows of the host fabric go without it).

``arrived``: the arrival time (``time.perf_counter()``) when the waiter was blocked on the receive
for more than :data:`BLOCKED_WAIT_S` (it saw the last byte arrive), else None (the receive had
completed before anyone waited: its time is unknown). A waiter's stamp can be late by the time the
thread needs to get the GIL back (≤ the interpreter's switch interval, 5 ms, while the executor runs
Python; usually µs, since the executor mostly waits too).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable

__all__ = ["ArrivalClock", "TimedReceive", "BLOCKED_WAIT_S", "stamp", "nic_rx_counter", "nic_payload_share",
           "TCP_IPV4_HEADERS", "ETHERNET_HEADER"]

# What a full-size segment of gloo's TCP connections carries besides payload: IPv4 (20) and TCP with the
# timestamp option (32, Linux's default), inside the MTU; and the Ethernet header (14) the NIC's counter and a
# shaper count on top of it (netemu.md §2a: goodput 1448/1514 of the rate at MTU 1500)
TCP_IPV4_HEADERS = 52
ETHERNET_HEADER = 14

# A wait that returned later than this after it began was blocked on the operation, so the
# operation completed (its last byte arrived) when the wait returned; a quicker return means it
# had completed earlier, at a time nobody saw.
BLOCKED_WAIT_S = 1e-3


def stamp(began: float, now: float | None = None) -> float | None:
    """The arrival time of an operation whose wait began at ``began`` and returned at ``now``
    (default: now): ``now`` if the wait was blocked, None if the operation had completed before."""
    now = time.perf_counter() if now is None else now
    return now if now - began > BLOCKED_WAIT_S else None


class TimedReceive:
    """A posted receive (a gloo Work) whose arrival a waiter thread may time; waits like a Work."""

    __slots__ = ("work", "arrived", "counted", "_counter", "_claimed", "_lock", "_done", "_error")

    def __init__(self, work: object, counter: Callable[[], int] | None = None) -> None:
        self.work = work
        self.arrived: float | None = None
        self.counted: int | None = None  # the NIC's received bytes right after the arrival (when timed)
        self._counter = counter
        self._claimed = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _claim(self) -> bool:
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def _run(self) -> None:
        """Wait on the Work (the one wait it gets) and stamp its arrival."""
        began = time.perf_counter()
        try:
            self.work.wait()
        except BaseException as error:  # re-raised to the executor by wait()
            self._error = error
        self.arrived = stamp(began)
        if self.arrived is not None and self._counter is not None:
            self.counted = self._counter()
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self) -> bool:
        if self._claim():
            self._run()  # nobody got to it yet: wait here, never on a waiter (module docstring)
        else:
            self._done.wait()  # idle wait, the GIL is free
        if self._error is not None:
            raise self._error
        return True


class ArrivalClock:
    """``waiters`` threads that wait on the watched receives in the order they were posted."""

    def __init__(self, waiters: int, counter: Callable[[], int] | None = None,
                 counted: Callable[[int], bool] | None = None) -> None:
        self.waiters = max(0, int(waiters))
        self.counter = counter
        self.counted = counted  # which senders' receives are watched: those crossing the counted NIC (None: all)
        self._queue: collections.deque[TimedReceive] = collections.deque()
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stop = False

    def watch(self, work: object, peer: int = -1) -> object:
        """``work`` (a just-posted receive from ``peer``) as a :class:`TimedReceive` a waiter will time, if
        it crosses the counted NIC (``counted``); any other receive as it is."""
        if self.counted is not None and not self.counted(peer):
            return work
        timed = TimedReceive(work, self.counter)
        if self.waiters == 0:
            return timed
        if not self._threads:
            self._start()
        with self._ready:
            self._queue.append(timed)
            self._ready.notify()
        return timed

    def _start(self) -> None:
        for index in range(self.waiters):
            thread = threading.Thread(target=self._wait_forever, name=f"mccl-arrivals-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _wait_forever(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stop:
                    self._ready.wait()
                if self._stop:
                    return
                timed = self._queue.popleft()
            if timed._claim():
                timed._run()

    def close(self) -> None:
        """Stop the waiters once they are idle (one blocked on a receive that never comes is a daemon)."""
        with self._ready:
            self._stop = True
            self._queue.clear()
            self._ready.notify_all()


def nic_rx_counter(interface: str | None = None) -> Callable[[], int] | None:
    """A reader of the bytes ``interface`` (default: ``GLOO_SOCKET_IFNAME``, the NIC gloo's connections use)
    has received, from ``/proc/self/net/dev`` (the calling process's network namespace); None when no
    interface is named, it is the loopback, or it has no counter there. One ``pread`` and a parse: ~16 µs.
    Meant for a NIC of this rank's own (one per GPU, as on a rail-optimized fabric and the emulated one);
    a window whose counter grew by much more than its own receives falls back to arrival times
    (:data:`mccl.runtime.windows.OWN_TRAFFIC`)."""
    name = interface or os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if not name or name == "lo":  # the loopback carries every local process's traffic: no port of this rank
        return None
    key = name.encode() + b":"
    try:
        fd = os.open("/proc/self/net/dev", os.O_RDONLY)
    except OSError:
        return None

    def read() -> int:
        text = os.pread(fd, 1 << 16, 0)
        at = text.find(key)
        return int(text[at + len(key):].split(None, 1)[0]) if at >= 0 else -1

    try:
        if read() < 0:
            os.close(fd)
            return None
    except (OSError, ValueError):
        os.close(fd)
        return None
    return read


def nic_payload_share(interface: str | None = None) -> float | None:
    """Payload per byte the NIC's counter (:func:`nic_rx_counter`) counts, for a full-size data segment of a
    TCP/IPv4 connection: ``(MTU − 52) / (MTU + 14)`` (1448/1514 at MTU 1500), with the MTU of ``interface``
    (default: ``GLOO_SOCKET_IFNAME``) in the calling thread's network namespace; None where there is no
    counter or the MTU cannot be read. Why not the window's own payload ÷ counter growth: the counter also
    counts the ACKs of this rank's own sends, which share the port's time but are not the port's capacity
    (:func:`mccl.runtime.windows._counted_rate`)."""
    import fcntl
    import socket
    import struct

    name = interface or os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if not name or name == "lo" or len(name) >= 16:
        return None
    siocgifmtu = 0x8921  # <linux/sockios.h>
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            answer = fcntl.ioctl(probe.fileno(), siocgifmtu, struct.pack("16si", name.encode(), 0))
    except OSError:
        return None
    mtu = struct.unpack("16si", answer)[1]
    if mtu <= TCP_IPV4_HEADERS:
        return None
    return (mtu - TCP_IPV4_HEADERS) / (mtu + ETHERNET_HEADER)
