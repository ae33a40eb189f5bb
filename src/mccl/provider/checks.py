"""A session's collective requests checked and run: references to views, sizes against the job.

One :class:`CollectiveChecks` per session (:mod:`.session`). Both request paths (the session
socket's JSON and the fast path's binary frames, :mod:`.fastpath`) go through :meth:`prepare` and
:meth:`execute`: the fast path changes the encoding, never the checks. A reference goes to memory only
through :meth:`~.memory.Registry.resolve` (the tenant's own, live allocation, wholly inside it, aligned
to the element type); what it resolved to is cached while the allocation lives (:meth:`buffer`), so a
training loop's repeated buffers are checked once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from mccl.provider.errors import BadReference, BadRequest, JobFailed
from mccl.provider.jobs import TORCH_DTYPES, Job
from mccl.provider.memory import Registry, Segment
from mccl.provider.protocol import DTYPES, KINDS, REDUCTIONS

__all__ = ["CollectiveChecks", "Prepared", "check_shapes", "stamp"]

VIEW_CACHE = 64  # checked references kept per session, by (allocation, offset, length, dtype)

Prepared = tuple[Job, str, list[torch.Tensor], str, list[Segment]]
"""A checked collective: (job, kind, tensors viewing the buffers, reduction, their segments)."""


class CollectiveChecks:
    """The checks of one session's collectives (module docstring). ``jobs``: the session's communicators
    by id (shared, the session adds to it); ``count``: the service's counters."""

    def __init__(self, tenant: str, registry: Registry, jobs: dict[int, Job], count: Callable[..., None]) -> None:
        self.tenant = tenant
        self.registry = registry
        self.jobs = jobs
        self.count = count
        self._views: dict[tuple[int, int, int, str], tuple[Segment, torch.Tensor]] = {}

    def prepare(self, message: dict) -> Prepared:
        """A collective request (the JSON protocol's dict) checked, or a :class:`BadRequest` /
        :class:`BadReference` naming what is wrong. Only the segments' liveness can change after this (the
        tenant of a session never changes, an allocation's size never does, ids are never reused): a caller
        that keeps a prepared request checks :meth:`live` before running it again; the job's state is
        checked by :meth:`execute` every time."""
        comm = message.get("comm")
        job = self.jobs.get(comm) if type(comm) is int else None
        if job is None:
            raise BadRequest(f"no communicator {str(comm)[:20]} in this session (join a job first)")
        kind, dtype, reduce = message.get("kind"), message.get("dtype"), message.get("reduce", "sum")
        if kind not in KINDS:
            raise BadRequest(f"unknown collective {str(kind)[:40]!r} (one of {', '.join(KINDS)})")
        if dtype not in DTYPES:
            raise BadRequest(f"unknown dtype {str(dtype)[:40]!r} (one of {', '.join(DTYPES)})")
        if reduce not in REDUCTIONS or (reduce == "avg" and not TORCH_DTYPES[dtype].is_floating_point):
            raise BadRequest(f"reduction {str(reduce)[:20]!r} is not one of {', '.join(REDUCTIONS)} "
                             "(avg: floating-point dtypes only)")
        refs = message.get("refs")
        names = KINDS[kind]
        if not isinstance(refs, list) or len(refs) != len(names):
            raise BadReference(f"{kind} takes {len(names)} buffer references ({', '.join(names)})")
        buffers = [self.buffer(ref, dtype, f"{kind} {name}") for ref, name in zip(refs, names, strict=True)]
        check_shapes(kind, [length for length, _, _ in buffers], job.size, DTYPES[dtype])
        return job, kind, [view for _, view, _ in buffers], reduce, [segment for _, _, segment in buffers]

    def live(self, prepared: Prepared) -> bool:
        """Whether every segment a prepared request views is still allocated (see :meth:`prepare`)."""
        live = self.registry.live
        return all(live(segment) for segment in prepared[4])

    def execute(self, prepared: Prepared, stamps: list[int] | None = None, cpu: list[int] | None = None) -> None:
        """Run a checked collective. ``stamps``, ``cpu``: append the stage times before and after the
        collective (tracing; :func:`stamp`)."""
        job, kind, tensors, reduce, _ = prepared
        if job.broken:
            raise JobFailed(f"job {job.spec.name!r} is broken ({job.failure}); join it again")
        if stamps is not None:
            stamp(stamps, cpu)
        job.run(kind, tensors, reduce)
        if stamps is not None:
            stamp(stamps, cpu)
        self.count("collectives")

    def buffer(self, ref: object, dtype: str, what: str) -> tuple[int, torch.Tensor, Segment]:
        """(byte length, tensor view, its segment) of a reference. A reference checked before (same three
        integers, same dtype) is taken from the cache while its allocation is still live in the registry."""
        if type(ref) is list and len(ref) == 3 and type(ref[0]) is int and type(ref[1]) is int \
                and type(ref[2]) is int:
            cached = self._views.get((ref[0], ref[1], ref[2], dtype))
            if cached is not None and self.registry.live(cached[0]):
                return ref[2], cached[1], cached[0]
        segment, checked = self.registry.resolve(self.tenant, ref, DTYPES[dtype], what)
        torch_dtype = TORCH_DTYPES[dtype]
        view = (torch.empty(0, dtype=torch_dtype) if checked.length == 0 else
                torch.frombuffer(segment.buffer, dtype=torch_dtype, count=checked.length // DTYPES[dtype],
                                 offset=checked.offset))
        if len(self._views) >= VIEW_CACHE:
            self._views.pop(next(iter(self._views)))
        self._views[(checked.alloc_id, checked.offset, checked.length, dtype)] = (segment, view)
        return checked.length, view, segment

    def forget(self, alloc_id: int | None = None) -> None:
        """Drop the cached views of one allocation (being freed), or all of them."""
        self._views = {} if alloc_id is None else {key: view for key, view in self._views.items()
                                                   if key[0] != alloc_id}


def stamp(stamps: list[int], cpu: list[int] | None) -> None:
    """A traced request's stage time: wall (``perf_counter_ns``: one clock for every process here), and this
    thread's CPU when ``cpu`` is a list (``thread_time_ns``: a system call, ~2 µs here, so only when asked)."""
    stamps.append(time.perf_counter_ns())
    if cpu is not None:
        cpu.append(time.thread_time_ns())


def check_shapes(kind: str, lengths: list[int], size: int, itemsize: int) -> None:
    """The sizes of a collective's buffers against each other and the job's size, in bytes."""
    if kind == "all_gather" and lengths[0] != size * lengths[1]:
        raise BadReference(f"all_gather: the output is {lengths[0]} bytes; it must be {size} × the input's "
                           f"{lengths[1]}")
    if kind == "reduce_scatter" and lengths[1] != size * lengths[0]:
        raise BadReference(f"reduce_scatter: the input is {lengths[1]} bytes; it must be {size} × the output's "
                           f"{lengths[0]}")
    if kind == "all_to_all" and (lengths[0] != lengths[1] or (lengths[1] // itemsize) % size):
        raise BadReference(f"all_to_all: input and output must be the same size, a multiple of {size} elements "
                           f"(got {lengths[1]} and {lengths[0]} bytes)")
