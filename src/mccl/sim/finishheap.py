"""Compiled finish-time heap of the flow table (:mod:`mccl.sim.kernels`).

Predicted finishes sit on a heap with per-slot versions (``FlowState.ver``): a rate
change or a removal moves the version on, so older entries are skipped when they surface.
"""

from __future__ import annotations

import numpy as np

from mccl.jitcache import cached_njit
from mccl.sim import flowstate
from mccl.sim.flowstate import FinishHeap, FlowState

__all__ = ["due", "finish_push", "next_finish", "rebuild_finish_heap"]

_jit = cached_njit((flowstate,), nogil=True)


# -- finish-time heap -----------------------------------------------------------------------------


@_jit
def finish_push(key, slot, ver, q_key, q_slot, q_ver, q_size):
    """Push (predicted finish, slot, version) on the finish-time heap (a binary min-heap)."""
    at = q_size[0]
    q_size[0] += 1
    while at > 0:
        parent = (at - 1) >> 1
        if q_key[parent] <= key:
            break
        q_key[at] = q_key[parent]
        q_slot[at] = q_slot[parent]
        q_ver[at] = q_ver[parent]
        at = parent
    q_key[at] = key
    q_slot[at] = slot
    q_ver[at] = ver


@_jit
def _finish_pop(q_key, q_slot, q_ver, q_size):
    size = q_size[0] - 1
    q_size[0] = size
    if size == 0:
        return
    key = q_key[size]
    slot = q_slot[size]
    ver = q_ver[size]
    at = 0
    while True:
        child = 2 * at + 1
        if child >= size:
            break
        if child + 1 < size and q_key[child + 1] < q_key[child]:
            child += 1
        if q_key[child] >= key:
            break
        q_key[at] = q_key[child]
        q_slot[at] = q_slot[child]
        q_ver[at] = q_ver[child]
        at = child
    q_key[at] = key
    q_slot[at] = slot
    q_ver[at] = ver


@_jit
def next_finish(f_ver, heap):
    """The earliest predicted finish of a live flow (inf if none); drops stale heap entries.

    An entry is stale once its flow's rate changed again or the flow left (``f_ver`` moved on)."""
    heap = FinishHeap(*heap)
    q_key, q_slot, q_ver, q_size = heap.key, heap.slot, heap.ver, heap.size
    while q_size[0] > 0:
        if q_ver[0] == f_ver[q_slot[0]]:
            return q_key[0]
        _finish_pop(q_key, q_slot, q_ver, q_size)
    return np.inf


@_jit
def due(limit, out, f_ver, heap):
    """Slots of flows whose last byte leaves by ``limit`` (popped off the heap) into ``out``; how many."""
    heap = FinishHeap(*heap)
    q_key, q_slot, q_ver, q_size = heap.key, heap.slot, heap.ver, heap.size
    count = 0
    while q_size[0] > 0 and q_key[0] <= limit:
        s = q_slot[0]
        if q_ver[0] == f_ver[s]:
            out[count] = s
            count += 1
            f_ver[s] += 1  # consumed
        _finish_pop(q_key, q_slot, q_ver, q_size)
    return count


@_jit
def rebuild_finish_heap(flows, heap):
    """Drop every stale entry: one entry per live flow with a finite predicted finish."""
    f, heap = FlowState(*flows), FinishHeap(*heap)
    f_alive, f_finish, f_ver = f.alive, f.finish, f.ver
    q_key, q_slot, q_ver, q_size = heap.key, heap.slot, heap.ver, heap.size
    q_size[0] = 0
    for s in range(len(f_alive)):
        if f_alive[s] and f_finish[s] < np.inf:
            f_ver[s] += 1
            finish_push(f_finish[s], s, f_ver[s], q_key, q_slot, q_ver, q_size)
