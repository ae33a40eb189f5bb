"""Which ranks are still there: a side channel of small TCP connections, one per pair of ranks.

The transport group cannot tell who failed. gloo reports an error only on the
connection to a rank that went away, and only to an operation that uses it: a rank
waiting on a live peer that is itself stuck behind the dead rank waits until the
process-group timeout (30 min by default), and the first error a survivor sees often
names a live rank that gave up first ("rank 0 stopped answering" when rank 2 died,
issue 13). gloo's abort does not unblock a pending receive either. So every rank
keeps, next to the transport group, a mesh of plain TCP connections to every other
rank of the group:

* **A process that dies** (SIGKILL, a crash, an OOM kill) has its sockets closed by
  the kernel: every peer reads end-of-file at once.
* **A process that hangs or a host that vanishes** stops sending heartbeats (a
  message every ``timeout_s / 5``, at most every second): a peer silent for
  ``timeout_s`` while this rank waits on something it may hold up is declared lost.
  Silence alone, while nothing waits on the peer, is not a loss: on a machine with
  more runnable threads than cores a live process can be starved of CPU for seconds
  (measured here: two ranks at load 30 on 2 cores declared each other lost after 5 s).
* **Gossip.** A rank that learns of a loss tells every other rank before it acts on
  it, so when survivors then give up and exit, the ranks still waiting already know
  the first rank that failed and name it, not the survivor that left after it.
* **Leaving is not failing.** A process that exits normally says goodbye first (an
  ``atexit`` hook): its peers record a *departure*, which breaks nothing by itself (a
  rank that finished its last collective may exit while a peer still completes its
  own); it becomes a loss only if this rank still waits on it ``timeout_s`` later.

Losses are kept in the order they were learned (in one polling round, messages are
read before end-of-file and silence is checked last); :meth:`Liveness.first_lost` is
what :class:`~mccl.runtime.transport.Transport` names in its :class:`PeerLost`.

The addresses are exchanged once through the job's store (so the store may die with
rank 0 afterwards: this channel does not use it again). A connecting rank proves it
read the store by echoing the listener's random nonce. Listening sockets bind to the
address this host uses to reach the store (loopback for a local job), never to every
interface. ``MCCL_PEER_TIMEOUT`` (seconds, default 10) sets ``timeout_s``; torch's own
default for a process group is 30 minutes. A killed process is found at once whatever the
timeout (end-of-file); the timeout bounds the detection of a hung one.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import secrets
import selectors
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from mccl.errors import MCCLError

__all__ = ["DEFAULT_PEER_TIMEOUT_S", "Liveness", "Loss", "peer_timeout_s"]

log = logging.getLogger("mccl.runtime")

DEFAULT_PEER_TIMEOUT_S = 10.0
_MESSAGE = struct.Struct("!ci")  # kind, rank: b"h" heartbeat, b"l" a loss the sender learned of, b"b" goodbye
_HELLO = struct.Struct("!i16s")  # connecting rank, the listener's nonce


def peer_timeout_s(value: float | str | None = None) -> float:
    """The liveness timeout in seconds: ``value``, else ``MCCL_PEER_TIMEOUT``, else 10; 0.05 to 86400."""
    raw = value if value is not None else os.environ.get("MCCL_PEER_TIMEOUT", DEFAULT_PEER_TIMEOUT_S)
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        raise MCCLError(f"MCCL_PEER_TIMEOUT must be a number of seconds, not {raw!r}") from None
    if not math.isfinite(seconds) or not 0.05 <= seconds <= 86400:
        raise MCCLError(f"MCCL_PEER_TIMEOUT must be between 0.05 and 86400 seconds, not {raw!r}")
    return seconds


@dataclass(frozen=True)
class Loss:
    """A rank this rank no longer counts on: ``how`` it was learned, ``at`` (time.monotonic())."""

    rank: int
    how: str
    at: float

    def describe(self) -> str:
        return f"rank {self.rank} stopped answering ({self.how})"


class Liveness:
    """The liveness mesh of one group, as this rank sees it (module docstring). ``lost`` is set once
    any rank is lost; it never clears (a group that lost a rank is broken)."""

    def __init__(self, store: dist.Store, rank: int, size: int, *, timeout_s: float | None = None,
                 connect_timeout_s: float = 60.0, waits_on: Callable[[int], bool] = lambda rank: False,
                 on_loss: Callable[[int], None] = lambda rank: None) -> None:
        """``waits_on(rank)``: whether this rank waits on something ``rank`` may hold up (a silent or
        departed rank is lost only then); ``on_loss(rank)``: called once, on this thread, after the first loss
        is recorded and gossiped (the transport breaks its group there)."""
        self.rank, self.size = rank, size
        self.timeout_s = peer_timeout_s(timeout_s)
        self.interval_s = min(max(self.timeout_s / 5, 0.01), 1.0)
        self.lost = threading.Event()
        self._losses: list[Loss] = []
        self._lock = threading.Lock()
        self._peers: dict[socket.socket, int] = {}
        self._inbox: dict[int, bytes] = {}
        self._heard: dict[int, float] = {}
        self.departed: dict[int, float] = {}  # rank -> when it said goodbye (time.monotonic())
        self._stop = False
        self._waits_on, self._on_loss = waits_on, on_loss
        self._wake_reader, self._wake_writer = socket.socketpair()  # close() wakes the thread at once
        self._connect(store, connect_timeout_s)
        self._thread = threading.Thread(target=self._run, name="mccl-liveness", daemon=True)
        self._thread.start()
        atexit.register(_say_goodbye, weakref.ref(self))

    # ---- what the transport asks ------------------------------------------------------
    def losses(self) -> list[Loss]:
        with self._lock:
            return list(self._losses)

    def first_lost(self, grace_s: float = 0.0) -> Loss | None:
        """The first rank lost, waiting up to ``grace_s`` for one (a gloo error can beat the socket's EOF)."""
        if grace_s > 0:
            self.lost.wait(grace_s)
        with self._lock:
            return self._losses[0] if self._losses else None

    def explain(self, peer: int | None, grace_s: float) -> Loss | None:
        """Why an operation on ``peer`` (None: a collective) failed: the first rank lost, else a rank
        that left (``peer``, or any for a collective); waits up to ``grace_s`` for either to be known."""
        deadline = time.monotonic() + grace_s
        while True:
            loss = self.first_lost()
            if loss is not None:
                return loss
            left = {rank: at for rank, at in list(self.departed.items()) if peer is None or rank == peer}
            if left:
                rank, at = min(left.items(), key=lambda item: item[1])
                return Loss(rank, "it left the group", at)
            if time.monotonic() >= deadline:
                return None
            self.lost.wait(0.01)

    def close(self) -> None:
        """Say goodbye, stop watching and close the connections."""
        if not self._stop:
            self._broadcast(_MESSAGE.pack(b"b", self.rank))
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"x")
        self._thread.join(timeout=5)

    # ---- set-up: addresses through the store, then one connection per pair -------------
    def _connect(self, store: dist.Store, timeout_s: float) -> None:
        host = _local_address(store)
        listener = socket.create_server((host, 0), backlog=max(1, min(self.size, socket.SOMAXCONN)))
        nonce = secrets.token_bytes(16)
        store.set(f"addr/{self.rank}", f"{host} {listener.getsockname()[1]} {nonce.hex()}")
        deadline = time.monotonic() + timeout_s
        try:
            for peer in range(self.rank):  # connect to lower ranks; higher ranks connect to us
                peer_host, port, peer_nonce = store.get(f"addr/{peer}").decode().split()
                sock = socket.create_connection((peer_host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
                sock.sendall(_HELLO.pack(self.rank, bytes.fromhex(peer_nonce)))
                self._add(sock, peer)
            while len(self._peers) < self.size - 1:
                listener.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    missing = sorted(set(range(self.rank + 1, self.size)) - set(self._peers.values()))
                    raise MCCLError(f"liveness channel: ranks {missing} did not connect within "
                                    f"{timeout_s:.0f} s") from None
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                hello = _read_exactly(sock, _HELLO.size)
                peer, echoed = _HELLO.unpack(hello) if hello is not None else (-1, b"")
                if echoed != nonce or not self.rank < peer < self.size or peer in self._peers.values():
                    sock.close()  # not a rank of this group (it did not read our nonce from the store)
                    continue
                self._add(sock, peer)
        except BaseException:
            for sock in self._peers:
                sock.close()
            raise
        finally:
            listener.close()

    def _add(self, sock: socket.socket, peer: int) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._peers[sock] = peer
        self._inbox[peer] = b""
        self._heard[peer] = time.monotonic()

    # ---- the watching thread ----------------------------------------------------------
    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for sock in self._peers:
            selector.register(sock, selectors.EVENT_READ)
        selector.register(self._wake_reader, selectors.EVENT_READ)
        next_beat = 0.0
        try:
            while not self._stop:
                now = time.monotonic()
                if now >= next_beat:
                    self._broadcast(_MESSAGE.pack(b"h", self.rank))
                    next_beat = now + self.interval_s
                closed = []
                for key, _ in selector.select(timeout=max(0.0, next_beat - time.monotonic())):
                    if key.fileobj is self._wake_reader:
                        continue
                    if not self._read(key.fileobj):
                        closed.append(key.fileobj)
                for sock in closed:  # after every message of this round
                    selector.unregister(sock)
                    peer = self._peers.pop(sock)
                    if peer not in self.departed:
                        self._lose(peer, "its connection closed: the process exited or was killed")
                    sock.close()
                now = time.monotonic()
                for sock, peer in list(self._peers.items()):
                    if (now - self._heard[peer] > self.timeout_s and peer not in self.departed
                            and self._waits_on(peer)):
                        selector.unregister(sock)
                        del self._peers[sock]
                        sock.close()
                        self._lose(peer, f"no heartbeat for {self.timeout_s:g} s")
                for peer, at in list(self.departed.items()):
                    if now - at > self.timeout_s and self._waits_on(peer):
                        self._lose(peer, f"it left the group {now - at:.1f} s ago while this rank waits on it")
        except Exception:  # the watcher must not take the process down; say so and stop watching
            log.exception("mccl: the liveness watcher of rank %d stopped", self.rank)
        finally:
            selector.close()
            for sock in [*self._peers, self._wake_reader, self._wake_writer]:
                sock.close()

    def _read(self, sock: socket.socket) -> bool:
        """Read what ``sock`` has; False on end-of-file or a broken connection."""
        peer = self._peers[sock]
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        self._heard[peer] = time.monotonic()
        buffer = self._inbox[peer] + data
        whole = len(buffer) - len(buffer) % _MESSAGE.size
        for offset in range(0, whole, _MESSAGE.size):
            kind, about = _MESSAGE.unpack_from(buffer, offset)
            if kind == b"l" and 0 <= about < self.size and about != self.rank:
                self._lose(about, f"rank {peer} lost it")
            elif kind == b"b":
                self.departed.setdefault(peer, time.monotonic())
        self._inbox[peer] = buffer[whole:]
        return True

    def _lose(self, peer: int, how: str) -> None:
        with self._lock:
            if any(loss.rank == peer for loss in self._losses):
                return
            self._losses.append(Loss(peer, how, time.monotonic()))
        log.error("mccl: rank %d: rank %d stopped answering (%s)", self.rank, peer, how)
        self._broadcast(_MESSAGE.pack(b"l", peer))  # gossip first, so ranks that wait on us learn the cause
        first = not self.lost.is_set()
        self.lost.set()
        if first:
            try:
                self._on_loss(peer)
            except Exception:  # the watcher keeps watching; the waits then end at the group's timeout
                log.exception("mccl: rank %d could not break its group after losing rank %d", self.rank, peer)

    def _broadcast(self, message: bytes) -> None:
        for sock in list(self._peers):
            with contextlib.suppress(OSError):  # a broken connection shows up as end-of-file on the next read
                sock.send(message)  # 8 bytes into an idle socket buffer: never partial in practice


def _say_goodbye(ref: weakref.ref) -> None:
    """At a normal interpreter exit: peers learn this rank left, rather than died."""
    liveness = ref()
    if liveness is not None:
        liveness.close()


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    try:
        while len(data) < n:
            part = sock.recv(n - len(data))
            if not part:
                return None
            data += part
    except OSError:
        return None
    return data


def _local_address(store: dist.Store) -> str:
    """The address this host uses to reach the store's host (loopback for a local job): the one
    interface peers can reach us on, found without sending a packet (a UDP socket's connect)."""
    inner = store
    while isinstance(inner, dist.PrefixStore):
        inner = inner.underlying_store
    host = getattr(inner, "host", None)
    if not host:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(getattr(inner, "port", 9)) or 9))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
