"""Tenant buffers in shared memory, and the check of every reference a tenant sends (MCCS §3.1).

The service allocates each tenant buffer (as MCCS allocates the tenant's GPU buffers and hands out
CUDA IPC handles): an anonymous shared-memory file (``memfd_create``) whose pages are reserved at
once (``posix_fallocate``: a full tmpfs is an error here, not a SIGBUS in the service when a
collective first touches the page) and *sealed* against shrinking and growing (``F_SEAL_SHRINK |
F_SEAL_GROW | F_SEAL_SEAL``: a tenant that truncated a buffer under the service's mapping would make
the service's next access fault — a crash of every tenant's service). The tenant opens it once
through ``/proc/<service pid>/fd/<fd>`` and maps it; when the tenant says it has (``attached``), or
the session ends, the service closes that descriptor, and the file has no name left at all: only
the two mappings hold it. A collective names its buffers by :class:`Ref` (allocation id, byte
offset, byte length), never by address.

:meth:`Registry.resolve` is the only way from a tenant's reference to memory, and it refuses
(:class:`~mccl.provider.errors.BadReference`) a reference that is not three non-negative integers,
names an allocation that is unknown *or another tenant's* (one message for both, so a tenant cannot
probe for others' ids), or is not wholly inside the allocation (checked as ``length <= size - offset``
after ``offset <= size``: no sum that could overflow in a C reimplementation), or does not fit the
element type (offset and length multiples of the element size).

Why not ``multiprocessing.shared_memory``: it makes named ``/dev/shm`` files, which cannot be
sealed, so a tenant holding one open could shrink it; and on Python 3.11 a process that *attaches*
registers the segment with its resource tracker, which unlinks it when that process exits.

Out of scope, as for the controller (:mod:`mccl.control.auth`): a tenant process running as the
service's own Unix user can read any of the service's memory (``/proc/<pid>/mem``); a provider runs
the service as a user of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from mccl.provider.errors import BadReference, QuotaExceeded

__all__ = ["Ref", "Segment", "Registry", "map_segment", "MAX_INT"]

MAX_INT = 2**63 - 1  # the largest offset, length or id a reference may carry (an int64, as a C service reads it)


@dataclass(frozen=True)
class Ref:
    """A buffer reference as a tenant sends it: ``[allocation id, byte offset, byte length]``."""

    alloc_id: int
    offset: int
    length: int

    @classmethod
    def parse(cls, value: object, what: str = "buffer reference") -> Ref:
        """Three non-negative int64s, or :class:`BadReference` naming what is wrong (never another error)."""
        if not isinstance(value, list | tuple) or len(value) != 3:
            raise BadReference(f"{what}: expected [allocation id, offset, length], got {_show(value)}")
        for name, item in zip(("allocation id", "offset", "length"), value, strict=True):
            if type(item) is not int:  # bool is an int subclass: refuse it too
                raise BadReference(f"{what}: the {name} must be an integer, got {_show(item)}")
            if not 0 <= item <= MAX_INT:
                raise BadReference(f"{what}: the {name} {_show(item)} is outside 0..2^63-1")
        return cls(*value)

    def as_list(self) -> list[int]:
        return [self.alloc_id, self.offset, self.length]


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(eq=False)
class Segment:
    """One allocation: a sealed memfd the service created and maps (see module docstring)."""

    alloc_id: int
    tenant: str
    nbytes: int
    fd: int | None  # open until the tenant has mapped it
    buffer: mmap.mmap = field(repr=False)

    @property
    def path(self) -> Path:
        """Where the tenant opens it, while :attr:`fd` is open."""
        return Path(f"/proc/{os.getpid()}/fd/{self.fd}")

    @classmethod
    def create(cls, alloc_id: int, tenant: str, nbytes: int) -> Segment:
        descriptor = os.memfd_create(f"mccl-provider-{alloc_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(descriptor, nbytes)
            os.posix_fallocate(descriptor, 0, nbytes)
            fcntl.fcntl(descriptor, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            buffer = mmap.mmap(descriptor, nbytes)
        except OSError as error:
            os.close(descriptor)
            raise QuotaExceeded(f"cannot allocate {nbytes} bytes of shared memory: {error.strerror}") from None
        return cls(alloc_id, tenant, nbytes, descriptor, buffer)

    def unlink(self) -> None:
        """Close the descriptor the tenant opened it by (idempotent): the mappings stay, nobody can open it again."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        self.unlink()
        # a tensor still viewing it (a result in flight) makes close() refuse: the GC unmaps it later
        with contextlib.suppress(BufferError):
            self.buffer.close()


def map_segment(path: str | Path, nbytes: int) -> mmap.mmap:
    """The tenant's side: map a segment the service created, by its path, before the service closes it."""
    descriptor = os.open(path, os.O_RDWR)
    try:
        if os.fstat(descriptor).st_size != nbytes:
            raise BadReference(f"{path}: the segment is not {nbytes} bytes")
        return mmap.mmap(descriptor, nbytes)
    finally:
        os.close(descriptor)


class Registry:
    """Every allocation of one service, by id; ids are never reused (a stale id cannot name new memory).

    Quotas bound what one tenant can take: ``max_bytes`` in all and ``max_allocations`` live at once."""

    def __init__(self, *, max_bytes: int = 8 << 30, max_allocations: int = 1024) -> None:
        self.max_bytes = max_bytes
        self.max_allocations = max_allocations
        self._segments: dict[int, Segment] = {}
        self._next_id = 1
        self._lock = threading.Lock()
        self.foreign = 0  # references to another tenant's allocation (refused like unknown ones, counted apart)

    def allocate(self, tenant: str, nbytes: object) -> Segment:
        if type(nbytes) is not int or not 0 < nbytes <= self.max_bytes:
            raise QuotaExceeded(f"an allocation is 1..{self.max_bytes} bytes, not {_show(nbytes)}")
        with self._lock:
            mine = [segment for segment in self._segments.values() if segment.tenant == tenant]
            if len(mine) >= self.max_allocations:
                raise QuotaExceeded(f"tenant {tenant!r} holds {len(mine)} allocations, the most one tenant may")
            held = sum(segment.nbytes for segment in mine)
            if held + nbytes > self.max_bytes:
                raise QuotaExceeded(f"tenant {tenant!r} holds {held} bytes; {nbytes} more would pass its quota "
                                    f"of {self.max_bytes}")
            alloc_id = self._next_id
            self._next_id += 1
            segment = Segment.create(alloc_id, tenant, nbytes)
            self._segments[alloc_id] = segment
            return segment

    def owned(self, tenant: str, alloc_id: object) -> Segment:
        """The tenant's own allocation ``alloc_id``; an unknown and a foreign id get the same refusal."""
        segment = self._segments.get(alloc_id) if type(alloc_id) is int else None
        if segment is None or segment.tenant != tenant:
            if segment is not None:
                self.foreign += 1
            raise BadReference(f"allocation {_show(alloc_id)} is not an allocation of tenant {tenant!r}")
        return segment

    def resolve(self, tenant: str, value: object, itemsize: int = 1, what: str = "buffer reference") -> tuple[Segment, Ref]:
        """The segment and the checked reference, or :class:`BadReference` (see module docstring)."""
        ref = Ref.parse(value, what)
        segment = self.owned(tenant, ref.alloc_id)
        if ref.offset > segment.nbytes or ref.length > segment.nbytes - ref.offset:
            raise BadReference(f"{what}: bytes [{ref.offset}, {ref.offset} + {ref.length}) are outside allocation "
                               f"{ref.alloc_id} ({segment.nbytes} bytes)")
        if ref.offset % itemsize or ref.length % itemsize:
            raise BadReference(f"{what}: offset {ref.offset} and length {ref.length} must be multiples of the "
                               f"element size {itemsize}")
        return segment, ref

    def live(self, segment: Segment) -> bool:
        """Whether ``segment`` is still registered (not freed): a cached check of a reference holds while it is."""
        return self._segments.get(segment.alloc_id) is segment

    def release(self, tenant: str, alloc_id: object) -> None:
        segment = self.owned(tenant, alloc_id)
        with self._lock:
            self._segments.pop(segment.alloc_id, None)
        segment.close()

    def release_all(self, ids: set[int]) -> None:
        with self._lock:
            segments = [self._segments.pop(alloc_id) for alloc_id in ids if alloc_id in self._segments]
        for segment in segments:
            segment.close()

    def __len__(self) -> int:
        return len(self._segments)
