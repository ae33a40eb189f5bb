"""Binding a plan to one call's tensors: the per-size work, computed once and cached.

A training step repeats the same message sizes, so everything that depends only on
the plan, the buffer kind and the block sizes — every operation's (tensor, start,
length), the scratch a relay needs, each driver's program — is computed on the first
call with those sizes (:class:`Bound`) and kept with the installed schedule; a call
then checks its tensors' sizes and slices them.

This module knows no driver: :attr:`Bound.programs` holds whatever a driver's
``prepare`` returned, by driver name (see :mod:`mccl.runtime.drivers`), so drivers
depend on the binding and never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mccl.errors import MCCLError
from mccl.runtime.buffers import Buffers
from mccl.runtime.plan import Layout, RankPlan

__all__ = ["Bound", "bind", "regions", "allocate", "operation_views", "copy_own_block"]


@dataclass(eq=False)
class Bound:
    """What one call needs that depends only on the plan, the buffer kind and the block sizes.

    Computed on the first call with given sizes and cached with the installed schedule:
    a training step repeats the same sizes, so a call then only slices its tensors.
    ``spans[i]``: operation i's (tensor index, start, length), None for an empty chunk;
    ``extent``: elements every tensor must hold (the end of its last span);
    ``scratch``: the same for the scratch tensors the call allocates;
    ``programs``: each driver's program for these sizes, by driver name, built by the
    executor on the driver's first call (a hot swap installs a new plan, so a new cache).
    """

    layout: Layout
    spans: list[tuple[int, int, int] | None]
    extent: dict[int, int]
    scratch: dict[int, int]
    programs: dict[str, object] = field(default_factory=dict)


def bind(plan: RankPlan, buffers: Buffers, cache: dict | None = None) -> Bound:
    """The call's :class:`Bound`, from ``cache`` when these block sizes ran before.

    This, with building the :class:`Buffers` and slicing the tensors, is the executor's
    Python work per call before the first operation is issued (benchmarks/runtime.py
    measures it). Sizes are checked against the tensors on every call."""
    key = (buffers.kind, buffers.block_elems.tobytes())
    bound = cache.get(key) if cache is not None else None
    if bound is None:
        layout = plan.layout(buffers.block_elems)
        spans: list[tuple[int, int, int] | None] = []
        extent: dict[int, int] = {}
        for op in plan.ops:
            length = int(layout.length[op.chunk])
            if length == 0:
                spans.append(None)
                continue
            index, base = buffers.region(op.chunk, layout)
            start = base + int(layout.offset[op.chunk])
            spans.append((index, start, length))
            extent[index] = max(extent.get(index, 0), start + length)
        scratch = {index: end for index, end in extent.items() if buffers.tensors[index] is None}
        bound = Bound(layout, spans, extent, scratch)
        if cache is not None:
            if len(cache) > 64:
                cache.clear()
            cache[key] = bound
    for index, end in bound.extent.items():
        tensor = buffers.tensors[index]
        if tensor is not None and end > tensor.numel():
            raise MCCLError(f"a chunk ends at element {end}, beyond the {tensor.numel()} elements of its buffer")
    return bound


def copy_own_block(buffers: Buffers, tensors: list[torch.Tensor]) -> None:
    """AllToAll: copy this rank's own block from the input to the output (no transfer moves it)."""
    if buffers.self_segments is not None and buffers.self_segments[0][2]:
        (in_index, in_start, length), (out_index, out_start, _) = buffers.self_segments
        tensors[out_index][out_start:out_start + length].copy_(tensors[in_index][in_start:in_start + length])


def allocate(buffers: Buffers, bound: Bound) -> list[torch.Tensor]:
    """The call's tensors, with the scratch ones (relays) allocated at the size the layout needs."""
    tensors = list(buffers.tensors)
    for index, elems in bound.scratch.items():
        tensors[index] = buffers.template.new_empty(elems)
    return tensors


def operation_views(bound: Bound, tensors: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """Every operation's slice of the call's tensors; None for an empty chunk."""
    return [None if span is None else tensors[span[0]][span[1]:span[1] + span[2]] for span in bound.spans]


def regions(plan: RankPlan, buffers: Buffers, layout_cache: dict | None = None) -> tuple[list, list]:
    """Every operation's tensor view and (tensor, start, length) span; None for empty chunks."""
    bound = bind(plan, buffers, layout_cache)
    tensors = allocate(buffers, bound)
    spans = [None if span is None else (tensors[span[0]], span[1], span[2]) for span in bound.spans]
    return operation_views(bound, tensors), spans
