"""The route search of the compiled warm tree repair (:mod:`.regrowkernel`), and its heap of orphans.

:func:`_route` finds the best route into an orphan from a rank already in the tree: one hop, then
two (rank -> switch -> orphan), then a reverse BFS through switches whose first layer that meets a
reached rank decides; :func:`_key` is its priority and the tie-breaks are
:meth:`mccl.synth.treepack.regrow.Regrower._route_into`'s, so the trees stay identical to the Python
reference. :func:`_evaluate` searches a batch of orphans onto the array heap (rows of negated key and
rank: :func:`_heap_push` / :func:`_heap_pop`, Python's ``heapq`` order) or the waiting list.

Why apart from :func:`.regrowkernel.repair_tree`: the search reads the residual graph and the
keeper's state but changes neither; the repair decides what stays and attaches. The repair
compiles with :func:`mccl.jitcache.cached_njit` naming this file, so a change here recompiles it.
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)
_WIDE = np.int64(1) << np.int64(62)


@_jit
def _key(t: int, v: int, narrow: int, root: int, left_root: bool, egress: np.ndarray, need_left: np.ndarray,
         group: np.ndarray, depth: np.ndarray, latency_aware: bool) -> tuple[int, int, int, int]:
    """Priority of a route into v entering from rank t (see :meth:`.regrow.Regrower._keys`)."""
    spare = 1 if (egress[t] - 1 >= need_left[t]) or ((not left_root) and t == root) else 0
    gv = group[v]
    home = 1 if (gv >= 0 and group[t] == gv) else 0
    shallow = -depth[t]
    if latency_aware:
        return (spare, shallow, home, narrow)
    return (spare, home, narrow, shallow)


@_jit
def _above(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """a > b lexicographically."""
    for i in range(4):
        if a[i] != b[i]:
            return a[i] > b[i]
    return False


@_jit
def _route(v: int, n: int, root: int, left_root: bool, residual: np.ndarray, into_start: np.ndarray,
           into_arcs: np.ndarray, arc_tail: np.ndarray, arc_head: np.ndarray, reached: np.ndarray,
           egress: np.ndarray, need_left: np.ndarray, group: np.ndarray, depth: np.ndarray, latency_aware: bool,
           toward: np.ndarray, stamp: np.ndarray, call: int, frontier: np.ndarray, frontier_width: np.ndarray,
           onward: np.ndarray, onward_width: np.ndarray, route: np.ndarray) -> tuple[bool, tuple[int, int, int, int], int]:
    """The best route into orphan v from a reached rank: (found, key, length), arcs in ``route[:length]``
    from the entry rank to v (see :meth:`.regrow.Regrower._route_into` and ``_near_route``)."""
    none = (0, 0, 0, 0)
    # One hop, then two (rank -> switch -> v): among equal keys the last candidate wins.
    found1, found2 = False, False
    key1, key2 = none, none
    first1, first2, second2 = -1, -1, -1
    for position in range(into_start[v], into_start[v + 1]):
        arc = into_arcs[position]
        t = arc_tail[arc]
        if t < n:
            if residual[arc] > 0 and reached[t]:
                key = _key(t, v, residual[arc], root, left_root, egress, need_left, group, depth, latency_aware)
                if not found1 or not _above(key1, key):
                    found1, key1, first1 = True, key, arc
            continue
        for position2 in range(into_start[t], into_start[t + 1]):
            first = into_arcs[position2]
            t2 = arc_tail[first]
            if t2 >= n or t2 == v:
                continue
            room = min(residual[first], residual[arc])
            if room > 0 and reached[t2]:
                key = _key(t2, v, room, root, left_root, egress, need_left, group, depth, latency_aware)
                if not found2 or not _above(key2, key):
                    found2, key2, first2, second2 = True, key, first, arc
    if found1:
        route[0] = first1
        return True, key1, 1
    if found2:
        route[0] = first2
        route[1] = second2
        return True, key2, 2
    # Reverse BFS from v through switches; the first layer that meets a reached rank decides.
    frontier[0] = v
    frontier_width[0] = _WIDE
    size = 1
    found = False
    best = none
    best_arc = -1
    while size > 0:
        pending = 0
        for f in range(size):
            node = frontier[f]
            width = frontier_width[f]
            node_found = False
            node_key = none
            node_arc = -1
            for position in range(into_start[node], into_start[node + 1]):
                arc = into_arcs[position]
                room = residual[arc]
                if room <= 0:
                    continue
                t = arc_tail[arc]
                if t >= n:
                    onward[pending] = arc
                    onward_width[pending] = min(room, width)
                    pending += 1
                elif reached[t]:
                    key = _key(t, v, min(room, width), root, left_root, egress, need_left, group, depth,
                               latency_aware)
                    if not node_found or not _above(node_key, key):
                        node_found, node_key, node_arc = True, key, arc
            if node_found and (not found or _above(node_key, best)):
                found, best, best_arc = True, node_key, node_arc
        if found:
            break
        size = 0
        for i in range(pending):
            arc = onward[i]
            tail = arc_tail[arc]
            if stamp[tail] != call:
                stamp[tail] = call
                toward[tail] = arc
                frontier[size] = tail
                frontier_width[size] = onward_width[i]
                size += 1
    if not found:
        return False, none, 0
    route[0] = best_arc
    length = 1
    node = arc_head[best_arc]
    while node != v:
        arc = toward[node]
        route[length] = arc
        length += 1
        node = arc_head[arc]
    return True, best, length


@_jit
def _heap_push(heap: np.ndarray, size: int, entry: tuple[int, int, int, int, int]) -> np.ndarray:
    """Push (negated key, rank) onto the array heap (rows of 5); the heap (grown if full)."""
    if size == len(heap):
        grown = np.empty((2 * len(heap) + 16, 5), dtype=np.int64)
        grown[:size] = heap[:size]
        heap = grown
    i = size
    while i > 0:
        up = (i - 1) >> 1
        if not _less(entry, heap[up]):
            break
        heap[i] = heap[up]
        i = up
    for c in range(5):
        heap[i, c] = entry[c]
    return heap


@_jit
def _less(entry: tuple[int, int, int, int, int], row: np.ndarray) -> bool:
    for c in range(5):
        if entry[c] != row[c]:
            return entry[c] < row[c]
    return False


@_jit
def _heap_pop(heap: np.ndarray, size: int) -> tuple[int, int, int, int, int]:
    """Remove and return the smallest entry (``size``: entries before the pop)."""
    top = (heap[0, 0], heap[0, 1], heap[0, 2], heap[0, 3], heap[0, 4])
    size -= 1
    last = heap[size].copy()
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _row_less(heap[child + 1], heap[child]):
            child += 1
        if not _row_less(heap[child], last):
            break
        heap[i] = heap[child]
        i = child
    if size > 0:
        heap[i] = last
    return top


@_jit
def _row_less(a: np.ndarray, b: np.ndarray) -> bool:
    for c in range(5):
        if a[c] != b[c]:
            return a[c] < b[c]
    return False


@_jit
def _push_list(values: np.ndarray, size: int, value: int) -> np.ndarray:
    if size == len(values):
        grown = np.empty(2 * len(values) + 16, dtype=values.dtype)
        grown[:size] = values[:size]
        values = grown
    values[size] = value
    return values


@_jit
def _evaluate(batch: np.ndarray, count: int, heap: np.ndarray, heap_size: int, waiting: np.ndarray, waited: int,
              at_home: np.ndarray, n: int, root: int, left_root: bool, residual: np.ndarray, into_start: np.ndarray,
              into_arcs: np.ndarray, arc_tail: np.ndarray, arc_head: np.ndarray, reached: np.ndarray,
              egress: np.ndarray, need_left: np.ndarray, group: np.ndarray, depth: np.ndarray, latency_aware: bool,
              toward: np.ndarray, stamp: np.ndarray, calls: int, frontier: np.ndarray, frontier_width: np.ndarray,
              onward: np.ndarray, onward_width: np.ndarray, route: np.ndarray
              ) -> tuple[np.ndarray, int, np.ndarray, int]:
    """Route search for each orphan in ``batch[:count]``: onto the heap (negated key, rank) or the waiting list."""
    for i in range(count):
        w = batch[i]
        found, key, length = _route(w, n, root, left_root, residual, into_start, into_arcs, arc_tail, arc_head,
                                    reached, egress, need_left, group, depth, latency_aware, toward, stamp,
                                    calls + i, frontier, frontier_width, onward, onward_width, route)
        if not found:
            waiting = _push_list(waiting, waited, w)
            waited += 1
        else:
            heap = _heap_push(heap, heap_size, (-key[0], -key[1], -key[2], -key[3], w))
            heap_size += 1
            if group[w] >= 0 and group[arc_tail[route[0]]] == group[w]:
                at_home[w] = True
    return heap, heap_size, waiting, waited
