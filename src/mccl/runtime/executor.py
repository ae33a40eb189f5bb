"""The executor: one collective of a :class:`RankPlan` on a :class:`Transport` (mccl-paper §3.3).

Buffers (see :mod:`buffers`): every chunk a rank touches lives in one region of one
tensor; senders read, receivers write these regions; a relay forwards from where it
received. Reducing receives land in a private buffer and are added in canonical
order, so a sum is the same on every run. The per-size work is cached
(:mod:`binding`); how operations are issued and waited for is a driver's job
(:mod:`drivers`: eager and exchange on gloo, stepwise on NCCL and gloo), behind one
protocol: ``prepare`` once per block sizes, ``run`` per call.

Pipelining (what the simulator's executor model, ``SimOptions.executor()``, models).
A call cuts every chunk into ``k`` slices, ``k`` = :func:`mccl.schedule.slicing.slice_count`
of its largest chunk (slices of about 64 KiB, at most 128), and runs the sliced plan
(:func:`mccl.runtime.plan.slice_plan`): every (chunk, peer) is a stream that posts its
slices in order, a relay forwarding slice ``j`` as soon as it has arrived; streams do not
wait for each other (the eager driver queues per stream, and its waiter threads report a
relay's arrival while it waits on another stream: :mod:`mccl.runtime.completions`),
so two trees that use one link each get their share of it. No stream is paced or
weighted: the tree packing cuts a source's data into equal trees, so equal shares are
the planned ones. The exchange driver (one gloo alltoallv per step; the default on gloo for
AllToAll and one-step plans) is not sliced: a bulk exchange has nothing to pipeline. What the model does not see: gloo sends all
messages between two ranks over one socket, in posting order; on the loopback test
transport there is no fabric to share.
"""

from __future__ import annotations

from mccl.errors import MCCLError
from mccl.runtime.binding import Bound, allocate, bind, regions
from mccl.runtime.buffers import (
    REDUCERS,
    Buffers,
    all_gather_buffers,
    all_reduce_buffers,
    all_to_all_buffers,
    even_blocks,
    reduce_scatter_buffers,
)
from mccl.runtime.drivers import DRIVERS, ExchangeStep
from mccl.runtime.plan import RankPlan, slice_plan, slice_spans
from mccl.runtime.sendgate import SendGate
from mccl.runtime.telemetry import Meters
from mccl.runtime.transport import Transport
from mccl.schedule import Collective
from mccl.schedule.slicing import MAX_SLICES, SLICE_BYTES, slice_count

__all__ = ["Buffers", "Bound", "ExchangeStep", "bind", "regions", "execute", "default_driver", "call_slices",
           "all_gather_buffers",
           "all_to_all_buffers", "reduce_scatter_buffers", "all_reduce_buffers", "even_blocks", "REDUCERS"]


def execute(transport: Transport, plan: RankPlan, buffers: Buffers, *, seq: int = 0,
            meters: Meters | None = None, layout_cache: dict | None = None, driver: str | None = None,
            slice_bytes: float = SLICE_BYTES, max_slices: int = MAX_SLICES, gate: SendGate | None = None) -> None:
    """Run ``plan`` once over ``buffers``; blocks until this rank's part is done.

    ``driver``: ``"eager"``, ``"exchange"`` (gloo only) or ``"stepwise"``; default:
    :func:`default_driver`. ``layout_cache``: a dict kept with the plan, where the
    per-size work (:class:`Bound`, the sliced plan) is cached. ``slice_bytes``,
    ``max_slices``: the pipelining rule (module docstring); every rank must use the same.
    ``gate``: a time-shared job's send gate (:mod:`mccl.runtime.sendgate`), asked before any send is posted.
    """
    if plan.n_ranks != transport.size:
        raise MCCLError(f"the schedule has {plan.n_ranks} ranks, the transport group {transport.size}")
    chosen = driver or default_driver(transport, plan, metered=meters is not None)
    runner = DRIVERS.get(chosen)
    if runner is None:
        raise MCCLError(f"unknown driver {chosen!r}: eager, exchange (gloo) or stepwise")
    if runner.gloo_only and not transport.dependency_driven:
        raise MCCLError(f"the {chosen} driver needs a gloo transport")
    bound = bind(plan, buffers, layout_cache)
    if chosen != "exchange":
        slices = call_slices(bound, buffers, slice_bytes, max_slices)
        if slices > 1:
            plan, bound = _sliced(plan, bound, slices, buffers, layout_cache)
    program = bound.programs.get(chosen)
    if program is None:
        program = bound.programs[chosen] = runner.prepare(plan, bound, buffers)
    if gate is not None:
        gate.wait(seq)
    transport.arrivals = meters.arrivals if meters is not None else None  # this call's receives timed
    try:
        runner.run(program, transport, allocate(buffers, bound), buffers, seq=seq, meters=meters)
    finally:
        transport.arrivals = None  # receives posted outside a metered call (hot swap, liveness) are not
    if buffers.finish is not None:
        buffers.finish()


def default_driver(transport: Transport, plan: RankPlan, *, metered: bool = False) -> str:
    """NCCL: stepwise. gloo: exchange for AllToAll and for one-step plans (direct AllGather and
    ReduceScatter): a step is one gloo alltoallv, all waits in C++; individual gloo sends measured
    1.5–2× slower than gloo's own alltoall, and a plan that forwards nothing has nothing to pipeline.
    Eager otherwise (forwarding chunk by chunk pipelines rings and trees), and always while a peer is
    paced or a send gate holds sends (:attr:`Transport.sends_one_by_one`): one alltoallv would bypass them.
    ``metered`` (telemetry on): eager, sliced, for every collective, AllToAll included. The receive-side
    windows (:mod:`mccl.runtime.telemetry`) need arrival times, and an alltoallv has none: it completes
    every receive of a step at once, so a window can only run from the post to the completion and takes
    in the ranks' skew (the AllToAll of the 8-rank loop on the emulated fabric read −49 % of the shaped
    rate that way; eager and sliced, within a few % — BENCHMARKS.md, 2026-12-01 fourth session). What it
    costs: on a NIC-bound fabric nothing — eager forwards a relayed chunk as soon as it arrives, where the
    exchange holds it to the next step's alltoallv (the loop's AllToAll measured faster eager); where the
    CPU is the bottleneck (loopback), gloo's individual sends are slower than its alltoallv."""
    if not transport.dependency_driven:
        return "stepwise"
    if transport.sends_one_by_one or metered:
        return "eager"
    if plan.collective is Collective.ALLTOALL:
        return "exchange"
    return "exchange" if plan.n_steps == 1 else "eager"


def call_slices(bound: Bound, buffers: Buffers, slice_bytes: float = SLICE_BYTES,
                max_slices: int = MAX_SLICES) -> int:
    """Slices per chunk for this call: :func:`~mccl.schedule.slicing.slice_count` of its largest chunk."""
    lengths = bound.layout.length
    if not len(lengths):
        return 1
    template = buffers.template if buffers.template is not None else next(t for t in buffers.tensors if t is not None)
    return slice_count(float(lengths.max()) * template.element_size(), slice_bytes, max_slices)


def _sliced(plan: RankPlan, bound: Bound, slices: int, buffers: Buffers,
            cache: dict | None) -> tuple[RankPlan, Bound]:
    """The sliced plan and its :class:`Bound` (cached beside the unsliced one: same sizes, same cut)."""
    key = ("sliced", slices, buffers.kind, buffers.block_elems.tobytes())
    cached = cache.get(key) if cache is not None else None
    if cached is None or cached[2] is not bound:
        sliced = slice_plan(plan, slices)
        cached = (sliced, Bound(bound.layout, slice_spans(sliced, bound.spans), bound.extent, bound.scratch), bound)
        if cache is not None:
            cache[key] = cached
    return cached[0], cached[1]
