"""Every private torch API the runtime uses, in one place, each with why it is needed.

Checked against torch==2.13.0. A private name (leading underscore, or a class only
reachable through ``torch._C``) may change in any torch release without notice; keeping
them here means an upgrade is checked in one file, and the rest of the runtime uses
public torch only. When torch grows a public equivalent, replace the wrapper's body.

* :func:`work_from_future` — a Python subclass of ``dist.Work`` (torch's C++ ``Work``
  trampoline calls its ``wait`` / ``get_future`` from C++ callers too: DDP, FSDP2).
  A Python ``ProcessGroup`` must return a c10d ``Work`` from its collectives, and the
  communicator's ``async_op=True`` calls return one too. Not the private
  ``_create_work_from_future``, which torch's own Python groups use: its ``wait()``
  returns True when the future failed (checked on 2.13.0), so a collective that raised
  ``PeerLost`` or ``CollectiveMismatch`` on the worker thread looked successful to every
  caller that waits on the Work (``work.wait()``, DDP's parameter check, FSDP2's
  all-gathers) and left its output unwritten. Only ``get_future().wait()`` raised.
* :func:`default_store` — ``torch.distributed.distributed_c10d._get_default_store``.
  ``mccl.init`` puts its hot-swap control channel on the job's store; torch keeps that
  store only in this private getter (``init_process_group`` takes no store back out).
* :func:`start_coalescing` / :func:`end_coalescing` — ``ProcessGroup._start_coalescing``
  and ``_end_coalescing``. NCCL needs a step's sends and receives inside one
  ``ncclGroupStart/End`` or two ranks that each receive before they send deadlock; the
  public ``dist.batch_isend_irecv`` goes through the world's registry of groups, which a
  transport group built directly from a store (the "mccl" backend's) is not in. These
  two are what ``dist._coalescing_manager`` itself calls.
* :func:`all_gather_base` / :func:`reduce_scatter_base` — ``_allgather_base`` and
  ``_reduce_scatter_base``: the fallback for a transport group that is a bare c10d
  ``Backend`` (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` objects), which has no
  ``all_gather_single`` / ``reduce_scatter_single``.
* :data:`AllgatherOptions` — a public class that ``torch.distributed`` does not
  re-export (unlike ``AllToAllOptions``, ``ReduceScatterOptions``); only reachable via
  ``torch._C``.
* :func:`backend_name` — ``ProcessGroup._get_backend_name``: the backend of a group not
  registered with torch.distributed (``dist.get_backend`` only knows registered ones).
* :func:`register_backend` — ``ProcessGroup._register_backend``: the "mccl" group registers its
  delegate (gloo / NCCL) as its c10d backend for a device type, which is what torch's own
  ``init_process_group`` does for every group it builds. Without it, a C++ caller of an
  operation the Python group does not override gets "No backend type associated with
  device type cpu", and ``group.group_name`` (read by ``DeviceMesh`` and the functional
  collectives) "ProcessGroup name not set": torch keeps a group's name on its backends.
* :func:`backend_creator` — ``torch.distributed.Backend._plugins``: the creator registered for a
  backend name. ``register_backend`` refuses a name twice and torch has no public getter; the
  "mccl" backend keeps its per-process ``setup`` on its creator, found here, rather than in a
  module global.
* :data:`PROCESS_GROUP_ALIASES` / :func:`add_private_aliases` — the private method
  names under which torch's C++ ``ProcessGroup`` trampoline (and older Python callers,
  e.g. ``torch.distributed.nn.functional``'s ``_reduce_scatter_base``) reach a Python
  process group's gather and reduce-scatter, and ``dist._coalescing_manager`` opens and
  closes a coalescing window; the "mccl" backend answers to them too.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

__all__ = ["AllgatherOptions", "FutureWork", "PROCESS_GROUP_ALIASES", "add_private_aliases", "all_gather_base", "backend_creator",
           "backend_name",
           "default_store", "end_coalescing", "reduce_scatter_base", "register_backend", "start_coalescing",
           "work_from_future"]

TORCH_CHECKED = "2.13.0"

# private method name torch may call on a Python ProcessGroup -> the public method that serves it
PROCESS_GROUP_ALIASES = {"_allgather_base": "all_gather_single", "_reduce_scatter_base": "reduce_scatter_single",
                         "_start_coalescing": "start_coalescing", "_end_coalescing": "end_coalescing"}


class FutureWork(dist.Work):
    """A c10d ``Work`` that completes with a ``torch.futures.Future`` and whose ``wait()`` raises the
    future's error (see the module docstring: the private factory's ``wait()`` swallows it)."""

    def __init__(self, future: torch.futures.Future) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: object = None) -> bool:
        """Block until the collective is done; raise its error if it failed. ``timeout`` is not
        applied (as with torch's own future-backed Work): mccl bounds a lost peer itself
        (``MCCL_PEER_TIMEOUT``, :mod:`mccl.runtime.liveness`)."""
        self._future.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()


def work_from_future(future: torch.futures.Future) -> FutureWork:
    """A c10d ``Work`` that completes with ``future``, raising its error on ``wait()`` (module docstring)."""
    return FutureWork(future)


def default_store() -> dist.Store:
    """The store of the default process group (see module docstring)."""
    return dist.distributed_c10d._get_default_store()


def start_coalescing(group: object, device: torch.device) -> None:
    """Open an NCCL group on ``group`` (see module docstring)."""
    group._start_coalescing(device)


def end_coalescing(group: object, device: torch.device) -> object:
    """Close the NCCL group opened by :func:`start_coalescing`; one Work for all its operations."""
    return group._end_coalescing(device)


def all_gather_base(group: object, output: torch.Tensor, input: torch.Tensor) -> object:
    """A bare c10d Backend's all-gather into one tensor (see module docstring)."""
    return group._allgather_base(output, input)


def reduce_scatter_base(group: object, output: torch.Tensor, input: torch.Tensor, options: object) -> object:
    """A bare c10d Backend's reduce-scatter of one tensor (see module docstring)."""
    return group._reduce_scatter_base(output, input, options)


def register_backend(group: dist.ProcessGroup, device: str, backend_type: object, backend: object) -> None:
    """Make ``backend`` ``group``'s c10d backend for ``device`` tensors (see module docstring)."""
    group._register_backend(torch.device(device), backend_type, backend)


def backend_name(group: object) -> str | None:
    """``group``'s backend name from its private getter, or None where it has none."""
    getter = getattr(group, "_get_backend_name", None)
    return None if getter is None else str(getter())


def backend_creator(name: str) -> object | None:
    """The creator function registered for backend ``name``, or None (see module docstring)."""
    plugin = dist.Backend._plugins.get(name.upper())
    return None if plugin is None else plugin.creator_fn


def add_private_aliases(cls: type) -> type:
    """Class decorator: answer torch's private method names with the class's public ones."""
    for private, public in PROCESS_GROUP_ALIASES.items():
        setattr(cls, private, getattr(cls, public))
    return cls
