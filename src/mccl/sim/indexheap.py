"""An indexed binary min-heap over small integers (items, classes), compiled: the event loops of
:mod:`mccl.sim.kernels` and :mod:`mccl.sim.classkernels` keep their items by fair share (and classes by
next finish) in one.

``hp[:size]``: the heap of items; ``hpos[item]``: the item's place in it, -1 when absent; ``hkey[item]``:
its key. Plain arrays, so numba compiles the callers' loops with them.
"""

from __future__ import annotations

import numba

__all__ = ["sift_up", "sift_down", "heap_set", "heap_pop"]

_jit = numba.njit(cache=True, nogil=True, inline="always")  # inlined: see mccl.sim.classkernels


@_jit
def sift_up(hp, hpos, hkey, at):
    item = hp[at]
    key = hkey[item]
    while at > 0:
        parent = (at - 1) >> 1
        up = hp[parent]
        if hkey[up] <= key:
            break
        hp[at] = up
        hpos[up] = at
        at = parent
    hp[at] = item
    hpos[item] = at


@_jit
def sift_down(hp, hpos, hkey, at, size):
    item = hp[at]
    key = hkey[item]
    while True:
        child = 2 * at + 1
        if child >= size:
            break
        if child + 1 < size and hkey[hp[child + 1]] < hkey[hp[child]]:
            child += 1
        down = hp[child]
        if hkey[down] >= key:
            break
        hp[at] = down
        hpos[down] = at
        at = child
    hp[at] = item
    hpos[item] = at


@_jit
def heap_set(hp, hpos, hkey, item, key, size):
    """Insert ``item`` with ``key`` or move it to ``key``; return the new size."""
    at = hpos[item]
    if at < 0:
        hkey[item] = key
        hp[size] = item
        hpos[item] = size
        sift_up(hp, hpos, hkey, size)
        return size + 1
    old = hkey[item]
    hkey[item] = key
    if key < old:
        sift_up(hp, hpos, hkey, at)
    elif key > old:
        sift_down(hp, hpos, hkey, at, size)
    return size


@_jit
def heap_pop(hp, hpos, hkey, size):
    """Remove the item of lowest key (``hp[0]``); return the new size."""
    top = hp[0]
    hpos[top] = -1
    size -= 1
    if size > 0:
        hp[0] = hp[size]
        hpos[hp[0]] = 0
        sift_down(hp, hpos, hkey, 0, size)
    return size
