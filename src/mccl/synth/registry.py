"""Every synthesizer, optimal and baseline, under one name and one calling convention.

A :class:`Method` is ``run(topology, collective, ranks, options, previous) -> SynthesisResult``
with its own frozen options class (:mod:`mccl.synth.options`). The table is a constant:
a method is added by adding a row here, and the CLI, the controller, the experiments and
the contract tests (``tests/test_synth_contract.py``) pick it up. :func:`mccl.synth.optimize`
is the entry point over it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mccl.errors import InvalidOptions, SynthesisUnavailable
from mccl.schedule import Collective, Schedule
from mccl.synth.compose import compose_allreduce
from mccl.synth.direct import direct_alltoall
from mccl.synth.options import (
    AllToAllOptions,
    ComposedOptions,
    DepthOptions,
    DirectOptions,
    RingOptions,
    TreePackOptions,
    resolve_options,
)
from mccl.synth.result import SynthesisResult
from mccl.synth.ring import locality_ring, naive_ring, nccl_ring
from mccl.topology import Topology

__all__ = ["Method", "METHODS", "DEFAULT_METHODS", "method_for", "methods_for", "run_method"]

Previous = SynthesisResult | Schedule | None
Runner = Callable[[Topology, Collective, "Sequence[str] | None", Any, Previous], SynthesisResult]


@dataclass(frozen=True)
class Method:
    """One registered synthesizer. ``optimal``: it proves a bound (LP / fractional optimum)
    and emits a schedule within its reported gap; a baseline proves nothing. ``warm``: it
    starts from ``previous`` when given one (others ignore it)."""

    name: str
    collectives: tuple[Collective, ...]
    options: type
    run: Runner
    summary: str
    optimal: bool
    warm: bool


def _treepack(topology: Topology, collective: Collective, ranks: Sequence[str] | None, options: TreePackOptions,
              previous: Previous) -> SynthesisResult:
    from mccl.synth.treepack import synthesize, synthesize_reducescatter

    run = synthesize if collective is Collective.ALLGATHER else synthesize_reducescatter
    return run(topology, ranks, previous=previous, options=options)


def _depth(topology: Topology, collective: Collective, ranks: Sequence[str] | None, options: DepthOptions,
           previous: Previous) -> SynthesisResult:
    from mccl.synth.treepack.depth import choose_by_time

    return choose_by_time(topology, ranks, options)


def _column_generation(topology: Topology, collective: Collective, ranks: Sequence[str] | None,
                       options: AllToAllOptions, previous: Previous) -> SynthesisResult:
    from mccl.synth.alltoall import synthesize

    return synthesize(topology, ranks, previous=previous, options=options)


def _baseline(name: str, build: Callable[[], Schedule]) -> SynthesisResult:
    started = time.perf_counter()
    schedule = build()
    return SynthesisResult.of_baseline(schedule, name, time.perf_counter() - started)


def _ring(name: str, builder: Callable[..., Schedule], channels: bool) -> Runner:
    def run(topology: Topology, collective: Collective, ranks: Sequence[str] | None, options: RingOptions,
            previous: Previous) -> SynthesisResult:
        extra = {"channels": options.channels} if channels else {}
        if not channels and options.channels not in (None, 1):
            raise InvalidOptions(name, "channels", "the naive ring has one channel")
        return _baseline(name, lambda: builder(topology, collective, ranks, chunks=options.chunks, **extra))

    return run


def _direct(topology: Topology, collective: Collective, ranks: Sequence[str] | None, options: DirectOptions,
            previous: Previous) -> SynthesisResult:
    return _baseline("alltoall.direct", lambda: direct_alltoall(topology, ranks, chunks=options.chunks, pxn=options.pxn))


def _composed(topology: Topology, collective: Collective, ranks: Sequence[str] | None, options: ComposedOptions,
              previous: Previous) -> SynthesisResult:
    return compose_allreduce(topology, ranks, options, previous, run_method)


_RING_KINDS = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)

METHODS: Mapping[str, Method] = MappingProxyType({method.name: method for method in (
    Method("treepack", (Collective.ALLGATHER, Collective.REDUCESCATTER), TreePackOptions, _treepack,
           "optimal spanning-tree packing (ForestColl; mccl-paper §4.1, §4.3)", optimal=True, warm=True),
    Method("treepack.depth", (Collective.ALLGATHER,), DepthOptions, _depth,
           "the packing, its shallow variant or depth-2/3 host-rail trees, whichever is estimated fastest "
           "at the job's size (issue 17)", optimal=False, warm=False),
    Method("alltoall.cg", (Collective.ALLTOALL,), AllToAllOptions, _column_generation,
           "column generation with rounding (HiGHS; mccl-paper §4.2)", optimal=True, warm=True),
    Method("allreduce.composed", (Collective.ALLREDUCE,), ComposedOptions, _composed,
           "ReduceScatter then AllGather, each by its registered method", optimal=False, warm=True),
    Method("ring.naive", _RING_KINDS, RingOptions, _ring("ring.naive", naive_ring, channels=False),
           "one ring in rank order", optimal=False, warm=False),
    Method("ring.nccl", _RING_KINDS, RingOptions, _ring("ring.nccl", nccl_ring, channels=True),
           "NCCL-style rail rings, hosts in rank order", optimal=False, warm=False),
    Method("ring.locality", _RING_KINDS, RingOptions, _ring("ring.locality", locality_ring, channels=True),
           "MCCS's locality-aware ring (pod, then rack)", optimal=False, warm=False),
    Method("alltoall.direct", (Collective.ALLTOALL,), DirectOptions, _direct,
           "NCCL-style direct AllToAll, PXN relays", optimal=False, warm=False),
)})

DEFAULT_METHODS: Mapping[Collective, str] = MappingProxyType({
    Collective.ALLGATHER: "treepack",
    Collective.REDUCESCATTER: "treepack",
    Collective.ALLTOALL: "alltoall.cg",
    Collective.ALLREDUCE: "allreduce.composed",
})


def methods_for(collective: Collective | str) -> tuple[str, ...]:
    """The registered methods that make ``collective``."""
    kind = Collective(collective)
    return tuple(name for name, method in METHODS.items() if kind in method.collectives)


def method_for(collective: Collective | str, method: str | None = None) -> Method:
    """The method ``method`` (default: the collective's optimal one), checked to make ``collective``."""
    kind = Collective(collective)
    name = DEFAULT_METHODS.get(kind) if method is None else method
    chosen = METHODS.get(name) if name is not None else None
    if chosen is None or kind not in chosen.collectives:
        raise SynthesisUnavailable(kind.value, method, methods_for(kind))
    return chosen


def run_method(topology: Topology, collective: Collective | str, ranks: Sequence[str] | None = None, *,
               method: str | None = None, previous: Previous = None, options: object | None = None,
               **overrides: object) -> SynthesisResult:
    """Look ``method`` up, resolve its options and run it: :func:`mccl.synth.optimize`'s body (kept here so
    that composed methods call back into the table without an import cycle)."""
    kind = Collective(collective)
    chosen = method_for(kind, method)
    return chosen.run(topology, kind, ranks, resolve_options(chosen.name, chosen.options, options, overrides), previous)
