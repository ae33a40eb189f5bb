"""The flow table's finish-time heap (numba): predicted finish times of live flows, earliest first.

An entry is (predicted finish, flow slot, version); a flow's version moves on whenever its
rate changes or it leaves, so an entry whose version is stale is skipped, not removed
(lazy deletion): :func:`next_finish` and :func:`due` drop stale entries as they meet them,
and :func:`rebuild_finish_heap` rebuilds the heap from the live flows when it fills up.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["finish_push", "finish_pop", "next_finish", "due", "rebuild_finish_heap"]

_jit = numba.njit(cache=True, nogil=True)


@_jit
def finish_push(key, slot, ver, q_key, q_slot, q_ver, meta):
    """Push (predicted finish, slot, version) on the finish-time heap (a binary min-heap)."""
    at = meta[6]
    meta[6] += 1
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
def finish_pop(q_key, q_slot, q_ver, meta):
    size = meta[6] - 1
    meta[6] = size
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
def next_finish(f_ver, q_key, q_slot, q_ver, meta):
    """The earliest predicted finish of a live flow (inf if none); drops stale heap entries.

    An entry is stale once its flow's rate changed again or the flow left (``f_ver`` moved on)."""
    while meta[6] > 0:
        if q_ver[0] == f_ver[q_slot[0]]:
            return q_key[0]
        finish_pop(q_key, q_slot, q_ver, meta)
    return np.inf


@_jit
def due(limit, out, f_ver, q_key, q_slot, q_ver, meta):
    """Slots of flows whose last byte leaves by ``limit`` (popped off the heap); how many."""
    count = 0
    while meta[6] > 0 and q_key[0] <= limit:
        s = q_slot[0]
        if q_ver[0] == f_ver[s]:
            out[count] = s
            count += 1
            f_ver[s] += 1  # consumed
        finish_pop(q_key, q_slot, q_ver, meta)
    return count


@_jit
def rebuild_finish_heap(f_alive, f_finish, f_ver, q_key, q_slot, q_ver, meta):
    """Drop every stale entry: one entry per live flow with a finite predicted finish."""
    meta[6] = 0
    for s in range(len(f_alive)):
        if f_alive[s] and f_finish[s] < np.inf:
            f_ver[s] += 1
            finish_push(f_finish[s], s, f_ver[s], q_key, q_slot, q_ver, meta)
