"""mccl as a torch.distributed backend: a training script changes only its backend string.

::

    import mccl.runtime.backend as mb
    mb.register(setup=my_setup)            # once per process; setup(rank, size) -> (topology, schedules)
    dist.init_process_group("mccl")        # was "gloo" / "nccl"; or new_group(backend="mccl")
    # DDP, FSDP1, FSDP2 (fully_shard), DeviceMesh, DTensor, functional collectives: unchanged

:func:`register` calls ``torch.distributed.Backend.register_backend`` for the cpu and
cuda devices; its creator returns :class:`MCCLProcessGroup`, a Python ``ProcessGroup``
subclass (torch 2.13's plugin API: a creator that returns a ProcessGroup replaces the
one torch would build; torch's C++ ``ProcessGroup`` trampoline reaches its Python
methods from C++ callers too: DDP's reducer, functional collectives).

Two transport groups live under it, both built from the group's store:

* the **schedule transport** (gloo on CPU, NCCL where CUDA is available;
  ``MCCL_TRANSPORT=gloo|nccl`` overrides) under the :class:`Communicator`, which runs
  AllGather, ReduceScatter, AllReduce and AllToAll — tensor, list and coalesced forms —
  through the installed schedules, in sequence order (see :mod:`mccl.runtime.collectives`);
* the **delegate** (gloo for cpu tensors, NCCL for cuda ones), registered with
  ``ProcessGroup._register_backend`` as this group's c10d backend for its device. Every
  other c10d operation — broadcast, reduce, gather, scatter, send/recv, the object
  collectives built on them — runs there with that backend's own semantics, and torch
  reads the group's name (``_set_group_name``, which ``DeviceMesh`` and functional
  collectives need) from it. It is a group of its own because the schedule transport's
  point-to-point tags and in-order collectives must not interleave with the user's.

Which path ran each call: ``communicator(group).calls`` (:mod:`mccl.runtime.calls`).
Mismatched sizes or dtypes across ranks: :class:`~mccl.runtime.agreement.CollectiveMismatch`
on every rank before data moves (``MCCL_CHECK=0`` turns the check off); the check is one
small AllToAll per call on the schedule transport (BENCHMARKS.md says what it costs).

Per-call CPU on gloo (what decides the step time when ranks share cores): the executor
cuts chunks into slices of gloo's own segment size, 1 MiB, not the 64 KiB meant for
NCCL-like transports (:func:`mccl.runtime.backend_transports.slice_bytes`; ``MCCL_SLICE_BYTES`` overrides,
rank 0's value holds for the group), and one-step schedules (direct AllGather, ReduceScatter, AllToAll)
run as one gloo alltoallv, its waits in C++ (:func:`mccl.runtime.executor.default_driver`).

The NCCL branch (:mod:`mccl.runtime.backend_transports`) is the same two calls
with ``ProcessGroupNCCL``, and the executor drives it with the stepwise driver through the
same :class:`~mccl.runtime.transport.Transport` as gloo. **It has never been run**: these
machines have no GPU, and no test exercises it. On NCCL the ReduceScatter adds in the
schedule's order (``reduction_order`` None): NCCL picks its algorithm, and so its order, per
call, so there is no fixed order to match.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from mccl.errors import MCCLError
from mccl.runtime import torch_private
from mccl.runtime.backend_transports import delegates, group_slice_bytes, transport_backend
from mccl.runtime.communicator import Communicator
from mccl.runtime.hotswap import StoreControl
from mccl.runtime.transport import Transport
from mccl.schedule import Schedule
from mccl.topology import Topology

__all__ = ["BACKEND", "MCCLProcessGroup", "Setup", "communicator", "register"]

BACKEND = "mccl"

Setup = Callable[[int, int], tuple[Topology | None, Sequence[Schedule]]]
"""``setup(rank, size) -> (topology, schedules)``: what a new "mccl" group installs (every rank alike)."""


def _done(result: list[torch.Tensor]) -> object:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return torch_private.work_from_future(future)


def _is_async(opts: object) -> bool:
    return bool(getattr(opts, "asyncOp", False))


def _reduce_op(opts: object) -> object:
    if opts is None:
        return dist.ReduceOp.SUM
    return opts if isinstance(opts, dist.ReduceOp | dist.ReduceOp.RedOpType) else opts.reduceOp


@torch_private.add_private_aliases  # torch may reach the gather and reduce-scatter by their private names
class MCCLProcessGroup(dist.ProcessGroup):
    """A ProcessGroup whose AllGather / ReduceScatter / AllReduce / AllToAll run through an mccl
    :class:`Communicator` and whose other operations run on the delegate backend (module docstring)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta, *, group_name: str | None = None,
                 setup: Setup | None = None) -> None:
        super().__init__(rank, size)
        inner, transport_name = transport_backend(store, rank, size, timeout)
        self._transport_device = "cuda" if transport_name == "nccl" else "cpu"
        control = StoreControl(store, "mccl-control/", rank, size)
        # named after the group from the start (torch hands the creator the name), so telemetry and
        # errors attached before the first collective carry the name the communicator keeps
        name = f"mccl:{group_name}" if group_name else "mccl"
        transport = Transport(inner, backend=transport_name, store=dist.PrefixStore("mccl-liveness/", store))
        self.communicator = Communicator(transport, name=name, control=control,
                                         check=os.environ.get("MCCL_CHECK", "1") != "0",
                                         slice_bytes=group_slice_bytes(store, rank, transport_name))
        # sums bit-identical to gloo's where the ReduceScatter schedule allows (mccl.runtime.reduction_order);
        # NCCL picks its own algorithm and order per call, so there is no order to match
        self.communicator.reduction_order = "gloo" if transport_name == "gloo" else None
        self._delegate = {}
        for device, (backend, backend_type) in delegates(store, rank, size, timeout).items():
            torch_private.register_backend(self, device, backend_type, backend)
            self._delegate[device] = backend
        self._coalesced: list[object] | None = None
        if setup is not None:
            topology, schedules = setup(rank, size)
            self.communicator.configure(topology=topology, schedules=schedules)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # ---- routing --------------------------------------------------------------------
    def _mccl(self, *tensors: torch.Tensor) -> Communicator | None:
        """The communicator when every tensor lives where its transport does; else None (delegate)."""
        if all(tensor.device.type == self._transport_device for tensor in tensors):
            return self.communicator
        return None

    def _delegated(self, op: str, tensors: Sequence[torch.Tensor], call: Callable[[object], object]) -> object:
        device = tensors[0].device.type if tensors else "cpu"
        backend = self._delegate.get(device)
        if backend is None:
            raise MCCLError(f"{op}: the mccl group has no backend for {device} tensors")
        self.communicator.calls.record(0, op, None)
        return self._track(call(backend))

    def _track(self, work: object) -> object:
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _result(self, work: object | None, result: list[torch.Tensor]) -> object:
        return self._track(work if work is not None else _done(result))

    def _all(self, works: list[object | None], result: list[torch.Tensor]) -> object:
        """One Work for several calls (coalesced forms): done when every one is."""
        pending = [work for work in works if work is not None]
        if not pending:
            return self._result(None, result)
        def first_error_or_result(done: torch.futures.Future) -> list[torch.Tensor]:
            # collect_all completes when every call has, failed or not: raise the first failure's error
            for future in done.value():
                future.wait()
            return result

        future = torch.futures.collect_all([work.get_future() for work in pending]).then(first_error_or_result)
        return self._track(torch_private.work_from_future(future))

    # ---- AllGather ------------------------------------------------------------------
    def all_gather_single(self, output, input, opts=None):
        comm = self._mccl(output, input)
        if comm is None:
            return self._delegated("all_gather_into_tensor", [input], lambda b: torch_private.all_gather_base(b, output, input))
        return self._result(comm.all_gather_into_tensor(output, input, async_op=_is_async(opts)), [output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.communicator.all_gather_into_tensor(o, i, async_op=True, op="all_gather_into_tensor_coalesced")
                 if self._mccl(o, i) else self._delegated("all_gather_into_tensor_coalesced", [i],
                                                         lambda b, o=o, i=i: torch_private.all_gather_base(b, o, i))
                 for o, i in zip(outputs, inputs, strict=True)]
        return self._all(works, list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # the name before torch 2.13

    def allgather(self, output_tensors, input_tensors, opts=None):
        """List form: into one flat tensor through the schedule, then copied out to the list."""
        outputs = output_tensors[0] if len(output_tensors) == 1 else None
        source = input_tensors[0] if len(input_tensors) == 1 else None
        same = (outputs is not None and source is not None and len(outputs) == self.size()
                and all(o.dtype == source.dtype and o.numel() == source.numel() for o in outputs))
        comm = self._mccl(source, *outputs) if same else None
        if comm is None:
            return self._delegated("all_gather", input_tensors,
                                   lambda b: b.allgather(output_tensors, input_tensors, opts or
                                                         torch_private.AllgatherOptions()))
        flat = source.new_empty(self.size() * source.numel())

        def copy_out() -> None:
            for rank, out in enumerate(outputs):
                out.copy_(flat[rank * source.numel():(rank + 1) * source.numel()].view_as(out))

        work = comm.all_gather_into_tensor(flat, source, async_op=_is_async(opts), op="all_gather", then=copy_out)
        return self._result(work, list(outputs))

    # ---- ReduceScatter --------------------------------------------------------------
    def reduce_scatter_single(self, output, input, opts=None):
        comm = self._mccl(output, input)
        if comm is None:
            return self._delegated("reduce_scatter_tensor", [input],
                                   lambda b: torch_private.reduce_scatter_base(b, output, input,
                                                                              opts or dist.ReduceScatterOptions()))
        return self._result(comm.reduce_scatter_tensor(output, input, _reduce_op(opts), async_op=_is_async(opts)),
                            [output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = _reduce_op(opts)
        works = []
        for o, i in zip(outputs, inputs, strict=True):
            if self._mccl(o, i):
                works.append(self.communicator.reduce_scatter_tensor(o, i, op, async_op=True,
                                                                     name="reduce_scatter_tensor_coalesced"))
            else:
                works.append(self._delegated("reduce_scatter_tensor_coalesced", [i],
                                             lambda b, o=o, i=i: torch_private.reduce_scatter_base(
                                                 b, o, i, opts or dist.ReduceScatterOptions())))
        return self._all(works, list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # the name before torch 2.13

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """List form: the inputs concatenated into one tensor, reduced through the schedule."""
        output = output_tensors[0] if len(output_tensors) == 1 else None
        inputs = input_tensors[0] if len(input_tensors) == 1 else None
        same = (output is not None and inputs is not None and len(inputs) == self.size()
                and all(i.dtype == output.dtype and i.numel() == output.numel() for i in inputs))
        comm = self._mccl(output, *inputs) if same else None
        if comm is None:
            return self._delegated("reduce_scatter", [output] if output is not None else [],
                                   lambda b: b.reduce_scatter(output_tensors, input_tensors,
                                                              opts or dist.ReduceScatterOptions()))
        flat = torch.cat([i.reshape(-1) for i in inputs])
        work = comm.reduce_scatter_tensor(output, flat, _reduce_op(opts), async_op=_is_async(opts),
                                          name="reduce_scatter", per_block_buffers=True)
        return self._result(work, [output])

    # ---- AllReduce ------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        comm = self._mccl(*tensors) if len(tensors) == 1 else None
        if comm is None:
            options = opts if isinstance(opts, dist.AllreduceOptions) else dist.AllreduceOptions()
            if opts is not None and not isinstance(opts, dist.AllreduceOptions):
                options.reduceOp = opts
            return self._delegated("all_reduce", tensors, lambda b: b.allreduce(tensors, options))
        return self._result(comm.all_reduce(tensors[0], _reduce_op(opts), async_op=_is_async(opts)), list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        op = _reduce_op(opts)
        works = [self.communicator.all_reduce(t, op, async_op=True, name="all_reduce_coalesced") if self._mccl(t)
                 else self._delegated("all_reduce_coalesced", [t], lambda b, t=t: b.allreduce([t]))
                 for t in tensors]
        return self._all(works, list(tensors))

    # ---- AllToAll -------------------------------------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        comm = self._mccl(output, input)
        if comm is None:
            return self._delegated("all_to_all_single", [input], lambda b: b.alltoall_base(
                output, input, list(output_split_sizes), list(input_split_sizes), opts or dist.AllToAllOptions()))
        work = comm.all_to_all_single(output, input, list(output_split_sizes) or None,
                                      list(input_split_sizes) or None, async_op=_is_async(opts))
        return self._result(work, [output])

    alltoall_base = all_to_all_single  # the name before torch 2.13

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """List form: one flat AllToAll with the tensors' sizes as splits, then copied out."""
        dtype = input_tensors[0].dtype if input_tensors else None
        same = (len(input_tensors) == len(output_tensors) == self.size()  # gloo's rule: one dtype, one size
                and all(t.dtype == dtype and t.numel() == input_tensors[0].numel()
                        for t in [*input_tensors, *output_tensors]))
        comm = self._mccl(*input_tensors, *output_tensors) if same else None
        if comm is None:
            return self._delegated("all_to_all", input_tensors, lambda b: b.alltoall(
                output_tensors, input_tensors, opts or dist.AllToAllOptions()))
        source = torch.cat([t.reshape(-1) for t in input_tensors])
        counts = [t.numel() for t in output_tensors]
        flat = source.new_empty(sum(counts))

        def copy_out() -> None:
            start = 0
            for out, count in zip(output_tensors, counts, strict=True):
                out.copy_(flat[start:start + count].view_as(out))
                start += count

        work = comm.all_to_all_single(flat, source, counts, [t.numel() for t in input_tensors],
                                      async_op=_is_async(opts), op="all_to_all", then=copy_out)
        return self._result(work, list(output_tensors))

    # ---- in sequence, no data -------------------------------------------------------
    def barrier(self, opts=None):
        """In the communicator's sequence: after every collective issued before it on this group."""
        return self._result(self.communicator.barrier(async_op=_is_async(opts)), [])

    # ---- delegated: the wrapped backend's own operations ----------------------------
    def broadcast(self, tensors, opts=None):
        return self._delegated("broadcast", tensors, lambda b: b.broadcast(tensors, opts or dist.BroadcastOptions()))

    def reduce(self, tensors, opts=None):
        return self._delegated("reduce", tensors, lambda b: b.reduce(tensors, opts or dist.ReduceOptions()))

    def gather(self, output_tensors, input_tensors, opts=None):
        return self._delegated("gather", input_tensors,
                               lambda b: b.gather(output_tensors, input_tensors, opts or dist.GatherOptions()))

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._delegated("scatter", output_tensors,
                               lambda b: b.scatter(output_tensors, input_tensors, opts or dist.ScatterOptions()))

    def send(self, tensors, dst, tag=0):
        return self._delegated("send", tensors, lambda b: b.send(tensors, dst, tag))

    def recv(self, tensors, src, tag=0):
        return self._delegated("recv", tensors, lambda b: b.recv(tensors, src, tag))

    def recv_anysource(self, tensors, tag=0):
        return self._delegated("recv_anysource", tensors, lambda b: b.recv_anysource(tensors, tag))

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self._delegated("all_gather_coalesced", input_list, lambda b: b.allgather_coalesced(
            output_lists, input_list, opts or torch_private.AllgatherOptions()))

    def shutdown(self) -> None:
        """``dist.destroy_process_group``: stop the communicator's threads (after its queued
        collectives), then shut the delegate backends down as torch does for any group."""
        self.communicator.close()
        dist.ProcessGroup.shutdown(self)

    # ---- coalescing (dist._coalescing_manager with a device) ------------------------
    def start_coalescing(self, device=None):
        """Open a coalescing window: every call until :meth:`end_coalescing` joins one Work."""
        self._coalesced = []

    def end_coalescing(self, device=None):
        works, self._coalesced = self._coalesced or [], None
        return self._all(works, [])


class _Creator:
    """What torch calls to build an "mccl" group (registered with torch's extended backend API, which
    hands over the group's name). It holds the ``setup`` every new group installs: the registration
    lives in torch's table of backends, not in a global of this module."""

    def __init__(self, setup: Setup | None) -> None:
        self.setup = setup

    def __call__(self, options: object, _backend_options: object = None) -> MCCLProcessGroup:
        return MCCLProcessGroup(options.store, options.group_rank, options.group_size, options.timeout,
                                group_name=options.group_id, setup=self.setup)


def register(setup: Setup | None = None) -> None:
    """Register backend ``"mccl"`` with torch.distributed for cpu and cuda (once per process; later calls
    only replace ``setup``). ``setup(rank, size) -> (topology, schedules)`` runs in every new "mccl"
    group, on every rank, and installs those schedules; without it a group runs every collective on
    its transport until ``communicator(group).configure(...)`` installs some."""
    creator = torch_private.backend_creator(BACKEND)
    if isinstance(creator, _Creator):
        creator.setup = setup
        return
    if creator is not None:
        raise MCCLError(f"a backend named {BACKEND!r} is already registered with torch.distributed, not mccl's")
    dist.Backend.register_backend(BACKEND, _Creator(setup), extended_api=True, devices=["cpu", "cuda"])


def communicator(group: dist.ProcessGroup | None = None) -> Communicator:
    """The communicator behind a process group created with backend ``"mccl"`` (default: the world)."""
    group = group if group is not None else (dist.group.WORLD if dist.is_initialized() else None)
    found = getattr(group, "communicator", None)
    if not isinstance(found, Communicator):
        raise MCCLError("this process group was not created with backend 'mccl'")
    return found
