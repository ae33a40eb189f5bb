"""The order in which a reduction adds the ranks' contributions: gloo's, so mccl's sums are gloo's bits.

Floating-point addition is commutative but not associative: ``(a + b) + c`` and
``(a + c) + b`` may differ in the last bit, and a training job that switches backend
sees different losses unless the reduction adds in the same order. This module
states gloo's order (torch 2.13 CPU, ``ProcessGroupGloo``), found in its source and
confirmed bit for bit on 2–8 ranks (``tests/test_backend_order.py``; probe in the
report of the branch that added it):

* ``allreduce`` runs gloo's ring (``gloo/allreduce.cc``, ``ring``): the buffer of
  ``T`` elements of ``s`` bytes is cut into ``nseg = roundUp(max(ceil(T·s / M), 2n), n)``
  segments of ``ceil(T / nseg)`` elements (``M`` = 1 MiB, ``kMaxSegmentSize``), ``nseg / n``
  consecutive segments per chunk, so chunk ``c`` holds elements
  ``[c·E, (c+1)·E)`` with ``E = (nseg / n) · ceil(T / nseg)``. Chunk ``c``'s partial sum starts
  at rank ``c − 1`` and travels down the ring (rank ``r`` sends to ``r − 1``), each rank adding
  its own contribution, and ends at rank ``c``: the fold ``x[c−1], x[c−2], …, x[c+1], x[c]``.
* ``reduce_scatter_tensor`` (``_reduce_scatter_base``) is an ``allreduce`` of a clone of the
  whole input, of which each rank keeps its block: the same fold over ``T = n · block``.
* list-form ``reduce_scatter`` runs one ``allreduce`` per input tensor: the fold over
  ``T = block``, in block-local element positions.

A rank that holds every contribution to an element, unsummed (a ReduceScatter schedule
in which no rank forwards a partial sum: :attr:`mccl.runtime.plan.RankPlan.raw_contributions`),
can add them in this order and get gloo's bits exactly, whatever path the data took.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GLOO_MAX_SEGMENT_BYTES", "ReductionOrder", "gloo_chunk_elements", "gloo_fold_ranges"]

GLOO_MAX_SEGMENT_BYTES = 1024 * 1024  # gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize

FoldRange = tuple[int, int, tuple[int, ...]]  # [start, stop) in elements, and the ranks in fold order


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def gloo_segments(elements: int, n: int, element_size: int) -> int:
    """``numSegments`` of gloo's ring allreduce over ``elements`` elements of ``element_size`` bytes."""
    max_segment = element_size * max(1, GLOO_MAX_SEGMENT_BYTES // element_size)
    total_bytes = elements * element_size
    return _round_up(max(-(-total_bytes // max_segment), 2 * n), n)


def gloo_chunk_elements(elements: int, n: int, element_size: int) -> int:
    """Elements per chunk of gloo's ring allreduce (chunk ``c`` = ``[c·E, (c+1)·E)``; the last may be short)."""
    segments = gloo_segments(elements, n, element_size)
    return segments // n * -(-elements // segments)


def gloo_fold(chunk: int, n: int) -> tuple[int, ...]:
    """The ranks in the order gloo's ring adds their contributions to chunk ``chunk``."""
    return tuple((chunk - 1 - k) % n for k in range(n))


def gloo_fold_ranges(elements: int, n: int, element_size: int, start: int, stop: int) -> list[FoldRange]:
    """Gloo's fold order for the elements ``[start, stop)`` of an allreduce over ``elements`` elements.
    Positions at or past ``elements`` (padding) get the order of the last chunk."""
    if stop <= start:
        return []
    per_chunk = max(gloo_chunk_elements(max(elements, 1), n, element_size), 1)
    ranges: list[FoldRange] = []
    position = start
    while position < stop:
        chunk = min(position // per_chunk, n - 1)
        end = stop if chunk == n - 1 else min(stop, (chunk + 1) * per_chunk)
        ranges.append((position, end, gloo_fold(chunk, n)))
        position = end
    return ranges


@dataclass(frozen=True)
class ReductionOrder:
    """Gloo's order for one reduction call, over element positions of the call's input.

    ``elements``: the size of the buffer gloo would allreduce (``reduce_scatter_tensor``:
    the whole input; an AllReduce padded to ``n`` blocks: the unpadded tensor). ``per_buffer``:
    list-form ``reduce_scatter``, where gloo reduces every block as a buffer of its own.
    """

    elements: int
    per_buffer: int | None = None

    def ranges(self, start: int, stop: int, n: int, element_size: int) -> list[FoldRange]:
        """Fold order of positions ``[start, stop)`` (one block, or a part of one)."""
        if self.per_buffer is None:
            return gloo_fold_ranges(self.elements, n, element_size, start, stop)
        base = start // self.per_buffer * self.per_buffer if self.per_buffer else 0
        return [(lo + base, hi + base, order) for lo, hi, order in
                gloo_fold_ranges(self.per_buffer, n, element_size, start - base, stop - base)]
