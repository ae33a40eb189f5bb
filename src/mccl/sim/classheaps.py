"""Compiled helpers of the grouped engine's event loop (:mod:`mccl.sim.classkernels`): plain binary heaps, work lists.

* a heap of tags per class (its flows' finish tags in the class's virtual time, with their
  transfers), each in its own segment of two shared arrays (``base``: the segment's start);
* the arrival heap: (time, push sequence, slice id), earliest first, ties in push order (the
  general engine's order, so both engines batch arrivals alike);
* ``mark``: append an item to a work list once.

All inlined into the loop (``inline="always"``): see :mod:`mccl.sim.classkernels` for why, and for
what that means for numba's file cache.
"""

from __future__ import annotations

import numba

__all__ = ["arr_pop", "arr_push", "mark", "tag_pop", "tag_push"]

_inline = numba.njit(cache=True, nogil=True, inline="always")


@_inline
def tag_push(tags, items, base, size, tag, item):
    at = size
    while at > 0:
        parent = (at - 1) >> 1
        if tags[base + parent] <= tag:
            break
        tags[base + at] = tags[base + parent]
        items[base + at] = items[base + parent]
        at = parent
    tags[base + at] = tag
    items[base + at] = item


@_inline
def tag_pop(tags, items, base, size):
    """Drop the top of a heap of ``size`` entries at ``base`` (the caller read it)."""
    size -= 1
    if size == 0:
        return
    tag = tags[base + size]
    item = items[base + size]
    at = 0
    while True:
        child = 2 * at + 1
        if child >= size:
            break
        if child + 1 < size and tags[base + child + 1] < tags[base + child]:
            child += 1
        if tags[base + child] >= tag:
            break
        tags[base + at] = tags[base + child]
        items[base + at] = items[base + child]
        at = child
    tags[base + at] = tag
    items[base + at] = item


@_inline
def _arr_less(a_time, a_seq, i, j):
    return a_time[i] < a_time[j] or (a_time[i] == a_time[j] and a_seq[i] < a_seq[j])


@_inline
def arr_push(a_time, a_seq, a_id, size, when, seq, item):
    at = size
    a_time[at] = when
    a_seq[at] = seq
    a_id[at] = item
    while at > 0:
        parent = (at - 1) >> 1
        if not _arr_less(a_time, a_seq, at, parent):
            break
        a_time[at], a_time[parent] = a_time[parent], a_time[at]
        a_seq[at], a_seq[parent] = a_seq[parent], a_seq[at]
        a_id[at], a_id[parent] = a_id[parent], a_id[at]
        at = parent


@_inline
def arr_pop(a_time, a_seq, a_id, size):
    size -= 1
    a_time[0], a_seq[0], a_id[0] = a_time[size], a_seq[size], a_id[size]
    at = 0
    while True:
        child = 2 * at + 1
        if child >= size:
            break
        if child + 1 < size and _arr_less(a_time, a_seq, child + 1, child):
            child += 1
        if not _arr_less(a_time, a_seq, child, at):
            break
        a_time[at], a_time[child] = a_time[child], a_time[at]
        a_seq[at], a_seq[child] = a_seq[child], a_seq[at]
        a_id[at], a_id[child] = a_id[child], a_id[at]
        at = child


@_inline
def mark(item, marked, items, count):
    if not marked[item]:
        marked[item] = True
        items[count] = item
        return count + 1
    return count
