"""The collective fast path: a pipe pair per session, binary frames, no ZeroMQ on the per-call path.

Why. A collective's request is ~100 bytes; what costs is the trip. A ZeroMQ request/reply between
two Python processes over ipc passes each message through both processes' ZeroMQ I/O threads (four
thread wake-ups per round trip): ~70 µs median here, CURVE included — most of issue 16's 100 µs
budget before the service does anything. A pipe written by one process and read by the other is
one kernel copy and one wake-up per direction: ~8 µs per round trip measured the same way
(``benchmarks/provider.py`` measures both floors in every run). The kernel's pipe buffer is the
command ring; the requests are small (≤ ``MAX_FRAME``, below ``PIPE_BUF``, so a frame is written
atomically), and a call is synchronous, so one frame is in flight per direction.

Who may use it. The session creates the pair only when its tenant asks on the session's own
ZeroMQ socket, after the CURVE handshake, and hands the tenant's ends over exactly as it hands over
shared-memory allocations (:mod:`.memory`): paths under ``/proc/<service pid>/fd/``, which the
tenant opens once, after which it says ``channel_attached`` and the service closes its copies of
those ends. From then on only the tenant process holds them; the frames it writes are its session's
and are checked exactly as the JSON requests are (:meth:`~.checks.CollectiveChecks.prepare`):
the fast path changes the encoding, never the checks. The service serves the pipe on a thread of the
session's own (:mod:`.fastpath`).

Frames (little-endian). Every frame is ``u32 length`` and that many bytes:

* request: ``u64 id, u32 comm, u8 kind, u8 dtype, u8 reduce, u8 flags, u8 refs``, a byte of padding and
  ``u16 cpu``, then ``refs`` × ``(u64 allocation id, u64 offset, u64 length)``. Codes index
  :data:`~.protocol.KINDS`, :data:`~.protocol.DTYPES` and :data:`~.protocol.REDUCTIONS` in their
  order. ``flags`` bit 0: trace (the reply carries the service's stage timestamps: its thread had read
  the frame, held the session's lock, decoded it, checked the references, ran the collective, encoded the
  reply); bit 1, with bit 0: the thread's CPU time at the last five of those points follows.
* reply: ``u64 id, u8 status`` (0 ok, 1 error), ``u8 stamps`` and 6 bytes of padding, then
  ``stamps`` × ``u64`` (``time.perf_counter_ns``, CLOCK_MONOTONIC: one clock for every process of
  the machine), then for an error the JSON ``{"error": class name, "message": ...}``.

A frame whose length field is outside ``HEADER..MAX_FRAME`` cannot be skipped (the stream has lost
its framing): the session closes the channel and the tenant falls back to its ZeroMQ socket, which
still works. Any other malformed frame gets an error reply, as on the socket.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from typing import Any

from mccl.provider.errors import BadRequest
from mccl.provider.protocol import DTYPES, KINDS, REDUCTIONS

__all__ = ["REQUEST", "REPLY", "REF", "MAX_FRAME", "MAX_REFS", "encode_request", "decode_request", "encode_reply",
           "encode_ok", "decode_reply", "HEAD", "ID", "LENGTH", "FrameReader", "KIND_CODES", "DTYPE_CODES", "REDUCE_CODES", "TRACE",
           "TRACE_CPU", "FOLLOW", "CPU", "CPU_AT", "request_key"]

LENGTH = struct.Struct("<I")
REQUEST = struct.Struct("<QIBBBBBxH")
CPU = struct.Struct("<H")
CPU_AT = 18  # where a request's ``cpu`` is, from the start of the request (its id)
REPLY = struct.Struct("<QBB6x")
REF = struct.Struct("<QQQ")
STAMP = struct.Struct("<Q")
HEAD = struct.Struct("<IQ")  # a request's length and id: what differs between two requests for the same thing
ID = struct.Struct("<Q")
MAX_REFS = 4
MAX_FRAME = 4000  # < PIPE_BUF (4096): a frame and its length are written atomically
TRACE = 1
TRACE_CPU = 2  # with TRACE: the stamps carry the service thread's CPU too (a system call each: ~2 µs here)
FOLLOW = 4  # the service's thread follows the tenant's thread to its CPU (``cpu`` is set)

KIND_NAMES, DTYPE_NAMES = tuple(KINDS), tuple(DTYPES)
KIND_CODES = {name: code for code, name in enumerate(KIND_NAMES)}
DTYPE_CODES = {name: code for code, name in enumerate(DTYPE_NAMES)}
REDUCE_CODES = {name: code for code, name in enumerate(REDUCTIONS)}


def encode_request(request_id: int, comm: int, kind: str, dtype: str, reduce: str, refs: Sequence[Sequence[int]],
                   flags: int = 0, cpu: int = 0) -> bytes:
    body = REQUEST.pack(request_id, comm, KIND_CODES[kind], DTYPE_CODES[dtype], REDUCE_CODES[reduce], flags,
                        len(refs), cpu) + b"".join(REF.pack(*ref) for ref in refs)
    return LENGTH.pack(len(body)) + body


def decode_request(body: bytes) -> tuple[int, int, dict[str, Any]]:
    """(id, flags, the request as the JSON protocol's dict), or :class:`BadRequest` (id in ``args[1]`` when
    the frame had one)."""
    if len(body) < REQUEST.size:
        raise BadRequest(f"a fast-path request is at least {REQUEST.size} bytes, this one {len(body)}", 0)
    request_id, comm, kind, dtype, reduce, flags, count, _ = REQUEST.unpack_from(body)
    if count > MAX_REFS or len(body) != REQUEST.size + count * REF.size:
        raise BadRequest(f"a fast-path request with {count} references is {REQUEST.size + count * REF.size} "
                         f"bytes, not {len(body)}", request_id)
    if kind >= len(KIND_NAMES) or dtype >= len(DTYPE_NAMES) or reduce >= len(REDUCTIONS):
        raise BadRequest(f"fast-path codes out of range (kind {kind}, dtype {dtype}, reduction {reduce})", request_id)
    refs = [list(REF.unpack_from(body, REQUEST.size + index * REF.size)) for index in range(count)]
    return request_id, flags, {"op": "collective", "id": request_id, "comm": comm, "kind": KIND_NAMES[kind],
                               "dtype": DTYPE_NAMES[dtype], "reduce": REDUCTIONS[reduce], "refs": refs}


def request_key(body: bytes) -> bytes:
    """What a request asks, less its id and ``cpu``: the key under which a checked request is kept."""
    return body[8:] if not body[15] & FOLLOW else body[8:CPU_AT] + body[CPU_AT + CPU.size:]


def encode_reply(request_id: int, error: dict[str, Any] | None = None, stamps: Sequence[int] = ()) -> bytes:
    body = REPLY.pack(request_id, 0 if error is None else 1, len(stamps)) + b"".join(STAMP.pack(s) for s in stamps)
    if error is not None:
        body += json.dumps({"error": error["error"], "message": error["message"][:500]}).encode()  # ASCII: ≤ 3 KB
    return LENGTH.pack(len(body)) + body


_OK = struct.Struct("<IQBB6x")  # a whole success reply without stamps: its length, then REPLY


def encode_ok(request_id: int) -> bytes:
    """The usual reply (success, untraced) in one pack: :func:`encode_reply` of ``request_id`` alone."""
    return _OK.pack(REPLY.size, request_id, 0, 0)


def decode_reply(body: bytes) -> tuple[int, dict[str, Any] | None, list[int]]:
    """(id, the error as ``{"error", "message"}`` or None, the service's stamps)."""
    request_id, status, count = REPLY.unpack_from(body)
    stamps = [STAMP.unpack_from(body, REPLY.size + index * STAMP.size)[0] for index in range(count)]
    error = json.loads(body[REPLY.size + count * STAMP.size:]) if status else None
    return request_id, error, stamps


class FrameReader:
    """Frames out of a non-blocking pipe's byte stream (partial reads are kept for the next call)."""

    def __init__(self, fd: int, max_frame: int = MAX_FRAME) -> None:
        self.fd = fd
        self.max_frame = max_frame
        self._buffer = bytearray()

    @property
    def pending(self) -> bool:
        """Whether part of a frame is kept from an earlier read."""
        return bool(self._buffer)

    def read(self) -> list[bytes] | None:
        """The complete frames available now; None at end of stream (the writer closed) or when a length
        field is out of range (see module docstring)."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:  # nothing now (a spurious wake-up)
            return []
        return self.take(chunk)

    def take(self, chunk: bytes) -> list[bytes] | None:
        """:meth:`read` of ``chunk``, which the caller read from the pipe itself (b"": the end of stream)."""
        if not chunk:
            return None
        if not self._buffer and len(chunk) > LENGTH.size and len(chunk) == LENGTH.size + LENGTH.unpack_from(chunk)[0] \
                and len(chunk) <= LENGTH.size + self.max_frame:
            return [chunk[LENGTH.size:]]  # the usual case: exactly one whole frame (a synchronous caller's)
        self._buffer += chunk
        return self._frames()

    def _frames(self) -> list[bytes] | None:
        frames = []
        while len(self._buffer) >= LENGTH.size:
            (length,) = LENGTH.unpack_from(self._buffer)
            if not 0 < length <= self.max_frame:
                return None
            if len(self._buffer) < LENGTH.size + length:
                break
            frames.append(bytes(self._buffer[LENGTH.size:LENGTH.size + length]))
            del self._buffer[:LENGTH.size + length]
        return frames
