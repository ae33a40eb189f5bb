"""The user API, shaped like torch.distributed's (re-exported as ``mccl.init``, ``mccl.all_gather_into_tensor``, ...).

::

    import mccl
    comm = mccl.init(topology=topo, schedules=[ag_schedule, a2a_schedule])   # on every rank
    mccl.all_gather_into_tensor(out, inp, group=comm)
    work = mccl.all_to_all_single(out, inp, group=comm, async_op=True); work.wait()
    comm.stage(new_schedule)                                                  # hot swap, every rank

``group`` is a :class:`Communicator`, or a process group created with backend
``"mccl"`` (its communicator is used), or None when the default group itself is an
mccl group. A collective kind without an installed schedule runs torch's own
collective on the transport group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from mccl.errors import MCCLError
from mccl.runtime import torch_private
from mccl.runtime.communicator import Communicator
from mccl.runtime.hotswap import StoreControl
from mccl.runtime.sources import ScheduleSource, TelemetrySink
from mccl.runtime.telemetry import TelemetryConfig
from mccl.runtime.transport import Transport
from mccl.schedule import Schedule
from mccl.topology import Topology

__all__ = ["init", "communicator_of", "all_gather_into_tensor", "all_to_all_single", "reduce_scatter_tensor",
           "all_reduce", "barrier"]


def init(group: dist.ProcessGroup | None = None, controller: ScheduleSource | None = None, *,
         topology: Topology | None = None, schedules: Sequence[Schedule] = (), sink: TelemetrySink | None = None,
         telemetry: TelemetryConfig | None = None, hot_swap: bool = True, name: str | None = None,
         driver: str | None = None, check: bool = False, poll_s: float = 0.02) -> Communicator:
    """A communicator over ``group`` (default: the world group); call it on every rank of the group, in the same order.

    ``controller``: where new schedule versions come from (the controller's client;
    :class:`~mccl.runtime.sources.LocalScheduleSource` until it exists). ``sink``:
    where telemetry samples go (none: telemetry off). ``hot_swap``: start the swap
    thread and its control channel (the job's TCPStore). ``check``: agree on every collective's
    sizes and dtype across the ranks before any data moves (one small AllGather per call, see
    :mod:`mccl.runtime.agreement`; the "mccl" backend does it by default). ``poll_s``: how often the
    swap thread asks ``controller`` for a new version (the dispatch term of the reaction time); a controller
    that can ``wait`` (:class:`~mccl.control.ControllerClient`: the service pushes new versions) is waited on
    for up to ``poll_s`` at a time instead, and a pushed version is taken the moment it lands.
    """
    if not dist.is_initialized():
        raise MCCLError("mccl.init needs torch.distributed to be initialized (dist.init_process_group)")
    group = group or dist.group.WORLD
    store = torch_private.default_store()
    group_name = getattr(group, "group_name", "world") or "world"
    # a per-rank counter in the store: equal on every rank when every rank inits in the same order
    count = store.add(f"mccl/communicators/{group_name}/{group.rank()}", 1)
    name = name or f"{group_name}#{count}"
    transport = Transport(group, store=dist.PrefixStore(f"mccl/liveness/{group_name}#{count}/", store))
    control = StoreControl(store, f"mccl/control/{name}/", transport.rank, transport.size) if hot_swap else None
    return Communicator(transport, name=name, topology=topology, schedules=schedules, source=controller, sink=sink,
                        telemetry=telemetry, control=control, driver=driver, check=check, poll_s=poll_s)


def communicator_of(group: Communicator | dist.ProcessGroup | None) -> Communicator:
    if isinstance(group, Communicator):
        return group
    candidate = group if group is not None else (dist.group.WORLD if dist.is_initialized() else None)
    communicator = getattr(candidate, "communicator", None)
    if isinstance(communicator, Communicator):
        return communicator
    raise MCCLError("pass group=<mccl Communicator> (from mccl.init) or a process group created with backend 'mccl'")


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    return communicator_of(group).all_gather_into_tensor(output, input, async_op=async_op)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int] | None = None,
                      input_split_sizes: Sequence[int] | None = None, group=None, async_op: bool = False):
    return communicator_of(group).all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                                    async_op=async_op)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op=dist.ReduceOp.SUM, group=None,
                          async_op: bool = False):
    return communicator_of(group).reduce_scatter_tensor(output, input, op, async_op=async_op)


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    return communicator_of(group).all_reduce(tensor, op, async_op=async_op)


def barrier(group=None, async_op: bool = False):
    return communicator_of(group).barrier(async_op=async_op)
