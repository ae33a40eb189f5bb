"""The warm tree repair of :mod:`.regrow`, compiled (numba): one tree per call, route searches included.

The same rule as :class:`mccl.synth.treepack.regrow.Regrower` (kept as the reference the tests
compare against, tree for tree): the seed's rows that fit stay (contested ones re-tried parents
first, further entries into a tight cut dropped), orphans are attached best route first from a
lazy heap, one- and two-hop routes before a reverse BFS through switches, stuck orphans' in-host
subtrees dissolved once. Priorities, tie-breaks (the last candidate of a node, the first node of
a layer, the heap's order on (key, rank)) and the multiset of heap entries are the Python ones,
so the trees are identical. The route search and the orphans' heap are :mod:`.regrowkernel_route`.

Why compiled: at 512 GPUs under Fail2 the warm path repairs ~450 trees with ~12,000 route
searches; each search in numpy was a dozen array calls of ~10 µs overhead on a few dozen
elements (0.5–0.9 s of the warm re-synthesis, the controller's budget is 1 s for everything).
Here a search is a scan of the orphan's in-arcs and their tails' in-arcs.
"""

from __future__ import annotations

import numpy as np

from mccl.jitcache import cached_njit
from mccl.synth.treepack import regrowkernel_route
from mccl.synth.treepack.regrowkernel_route import _above, _evaluate, _heap_pop, _heap_push, _push_list, _route

__all__ = ["repair_tree"]

_jit = cached_njit((regrowkernel_route,), nogil=True)  # its helpers live in another file: mccl.jitcache


@_jit
def _tops(parent: np.ndarray, root: int, top: np.ndarray, dist: np.ndarray, seen: np.ndarray,
          chain: np.ndarray) -> None:
    """Per rank, the top of its subtree (root, or an orphan: parent -1) and its distance to it."""
    n = len(parent)
    seen[:] = False
    for start in range(n):
        if seen[start]:
            continue
        length = 0
        node = start
        while not seen[node] and node != root and parent[node] >= 0:
            chain[length] = node
            length += 1
            node = parent[node]
        if not seen[node]:  # the root or an orphan: its own top
            top[node] = node
            dist[node] = 0
            seen[node] = True
        for i in range(length - 1, -1, -1):
            w = chain[i]
            above = parent[w]
            top[w] = top[above]
            dist[w] = dist[above] + 1
            seen[w] = True


@_jit
def _egress(n: int, arc_tail: np.ndarray, residual: np.ndarray, egress: np.ndarray) -> None:
    egress[:] = 0
    for arc in range(len(arc_tail)):
        if arc_tail[arc] < n:
            egress[arc_tail[arc]] += residual[arc]


@_jit
def repair_tree(seed: int, root: int, n: int, residual: np.ndarray, need_left: np.ndarray,
                into_start: np.ndarray, into_arcs: np.ndarray, arc_tail: np.ndarray, arc_head: np.ndarray,
                group: np.ndarray, latency_aware: bool, tight_entering: np.ndarray, tight_inside: np.ndarray,
                row_start: np.ndarray, row_tail: np.ndarray, row_head: np.ndarray, route_offsets: np.ndarray,
                route_arcs: np.ndarray, seed_depth: np.ndarray
                ) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One tree of ``root`` from previous chunk ``seed`` (-1: from the root alone), in ``residual`` (updated;
    restored when the tree cannot be completed).

    Returns (ok, kept forest rows, added tails, added heads, added route offsets, added route arcs,
    depth per rank). ``seed_depth``: the forest's depth table (chunks × n); ``tight_*``: the keeper's
    tight cuts (entering arcs, ranks inside), one row each.
    """
    n_arcs = len(residual)
    n_nodes = len(into_start) - 1
    saved = residual.copy()
    parent = np.full(n, -1, dtype=np.int64)
    # The seed's rows: which stay (module docstring of :mod:`.regrow`).
    r0 = seed_row0 = 0
    rows = 0
    if seed >= 0:
        r0, r1 = row_start[seed], row_start[seed + 1]
        seed_row0 = r0
        rows = r1 - r0
    keep = np.zeros(rows, dtype=np.bool_)
    l0 = route_offsets[r0] if rows > 0 else 0
    if rows > 0:
        counts = np.zeros(n_arcs, dtype=np.int64)
        l1 = route_offsets[r0 + rows]
        for p in range(l0, l1):
            counts[route_arcs[p]] += 1
        contested = np.zeros(rows, dtype=np.bool_)
        for i in range(rows):
            for p in range(route_offsets[r0 + i], route_offsets[r0 + i + 1]):
                if residual[route_arcs[p]] < counts[route_arcs[p]]:
                    contested[i] = True
        extra = np.zeros(rows, dtype=np.bool_)
        entered = np.zeros(rows, dtype=np.bool_)
        for cut in range(tight_entering.shape[0]):
            entered[:] = False
            any_entry = False
            for i in range(rows):
                for p in range(route_offsets[r0 + i], route_offsets[r0 + i + 1]):
                    if tight_entering[cut, route_arcs[p]]:
                        entered[i] = True
                        any_entry = True
                        break
            if not any_entry:
                continue
            if not tight_inside[cut, root]:  # the shallowest entry stays (the first row among equals)
                shallowest = -1
                for i in range(rows):
                    if entered[i] and (shallowest < 0 or seed_depth[seed, row_tail[r0 + i]]
                                       < seed_depth[seed, row_tail[r0 + shallowest]]):
                        shallowest = i
                entered[shallowest] = False
            for i in range(rows):
                if entered[i]:
                    extra[i] = True
        for i in range(rows):
            keep[i] = not contested[i] and not extra[i]
            if keep[i]:
                for p in range(route_offsets[r0 + i], route_offsets[r0 + i + 1]):
                    residual[route_arcs[p]] -= 1
        # Contested rows by their tail's depth, stable (an insertion sort: a few rows per tree).
        hard = np.empty(rows, dtype=np.int64)
        n_hard = 0
        for i in range(rows):
            if contested[i]:
                d = seed_depth[seed, row_tail[r0 + i]]
                j = n_hard
                while j > 0 and seed_depth[seed, row_tail[r0 + hard[j - 1]]] > d:
                    hard[j] = hard[j - 1]
                    j -= 1
                hard[j] = i
                n_hard += 1
        for h in range(n_hard):
            i = hard[h]
            p0, p1 = route_offsets[r0 + i], route_offsets[r0 + i + 1]
            fits = True
            for p in range(p0, p1):
                arc = route_arcs[p]
                if residual[arc] < 1:
                    fits = False
                    break
                for q in range(p0, p):
                    if route_arcs[q] == arc:
                        fits = False
                        break
                if not fits:
                    break
            if fits:
                for p in range(p0, p1):
                    residual[route_arcs[p]] -= 1
                keep[i] = True
        for i in range(rows):
            if keep[i]:
                parent[row_head[r0 + i]] = row_tail[r0 + i]
    left_root = False
    for w in range(n):
        if parent[w] == root:
            left_root = True
    top = np.zeros(n, dtype=np.int64)
    dist = np.zeros(n, dtype=np.int64)
    seen = np.zeros(n, dtype=np.bool_)
    chain = np.empty(n, dtype=np.int64)
    _tops(parent, root, top, dist, seen, chain)
    depth = np.zeros(n, dtype=np.int64)
    reached = np.zeros(n, dtype=np.bool_)
    for w in range(n):
        if top[w] == root:
            depth[w] = dist[w]
            reached[w] = True
    # Grow (lazy Prim, :meth:`.regrow.Regrower._grow`).
    egress = np.zeros(n, dtype=np.int64)
    _egress(n, arc_tail, residual, egress)
    toward = np.zeros(n_nodes, dtype=np.int64)
    stamp = np.full(n_nodes, -1, dtype=np.int64)
    frontier = np.empty(n_nodes, dtype=np.int64)
    frontier_width = np.empty(n_nodes, dtype=np.int64)
    onward = np.empty(n_arcs, dtype=np.int64)
    onward_width = np.empty(n_arcs, dtype=np.int64)
    route = np.empty(n_nodes + 1, dtype=np.int64)
    calls = 0
    pending = np.zeros(n, dtype=np.bool_)
    left = 0
    for w in range(n):
        if parent[w] < 0 and w != root:
            pending[w] = True
            left += 1
    heap = np.empty((64, 5), dtype=np.int64)
    heap_size = 0
    waiting = np.empty(64, dtype=np.int64)
    waited = 0
    dissolved = np.zeros(n, dtype=np.bool_)
    at_home = np.zeros(n, dtype=np.bool_)
    n_groups = 1
    for w in range(len(group)):
        n_groups = max(n_groups, group[w] + 1)
    touched = np.zeros(n_groups, dtype=np.bool_)
    added_tail = np.empty(max(n - 1, 1), dtype=np.int64)
    added_head = np.empty(max(n - 1, 1), dtype=np.int64)
    added_offsets = np.zeros(n, dtype=np.int64)
    added_arcs = np.empty(4 * n + 16, dtype=np.int64)
    n_added = 0
    batch = np.empty(n, dtype=np.int64)  # orphans whose routes to (re-)evaluate next
    batched = 0
    retried = False  # the batch is the waiting orphans, retried because the heap ran empty
    evaluate_all = True  # evaluate every pending orphan (in rank order) before the next pop
    ok = True
    while True:
        if evaluate_all:
            evaluate_all = False
            batched = 0
            for w in range(n):
                if pending[w]:
                    batch[batched] = w
                    batched += 1
        if batched > 0:  # one call site for the route search of every orphan to (re-)evaluate
            heap, heap_size, waiting, waited = _evaluate(
                batch, batched, heap, heap_size, waiting, waited, at_home, n, root, left_root, residual, into_start,
                into_arcs, arc_tail, arc_head, reached, egress, need_left, group, depth, latency_aware, toward,
                stamp, calls, frontier, frontier_width, onward, onward_width, route)
            calls += batched
            batched = 0
            if heap_size > 0:
                retried = False
            continue
        if left == 0:
            break
        if heap_size == 0:
            if not retried:  # the heap ran empty: retry the waiting orphans still pending, once
                n_again = 0
                for i in range(waited):
                    if pending[waiting[i]]:
                        batch[n_again] = waiting[i]
                        n_again += 1
                waited = 0
                if n_again > 0:
                    batched = n_again
                    retried = True
                    continue
            retried = False  # nothing came of the retry: dissolve
            stuck_any = False
            for w in range(n):
                if pending[w] and not dissolved[w]:
                    stuck_any = True
            if not stuck_any:
                ok = False
                break
            # Dissolve the in-host part of each stuck orphan's subtree (tops as before the loop).
            freed = np.zeros(n, dtype=np.bool_)
            for w in range(n):
                if not pending[w] or dissolved[w]:
                    continue
                for m in range(n):
                    if top[m] != w or m == w or (group[w] >= 0 and group[m] != group[w]):
                        continue
                    freed[m] = True
            for i in range(rows):
                if keep[i] and freed[row_head[r0 + i]]:
                    keep[i] = False
                    for p in range(route_offsets[r0 + i], route_offsets[r0 + i + 1]):
                        residual[route_arcs[p]] += 1
            for w in range(n):
                if pending[w] and not dissolved[w]:
                    dissolved[w] = True
            for m in range(n):
                if freed[m]:
                    parent[m] = -1
                    dissolved[m] = True
                    if not pending[m]:
                        pending[m] = True
                        left += 1
            _tops(parent, root, top, dist, seen, chain)
            _egress(n, arc_tail, residual, egress)
            waited = 0
            evaluate_all = True
            continue
        entry = _heap_pop(heap, heap_size)
        heap_size -= 1
        v = entry[4]
        if not pending[v]:
            continue
        found, key, length = _route(v, n, root, left_root, residual, into_start, into_arcs, arc_tail, arc_head,
                                    reached, egress, need_left, group, depth, latency_aware, toward, stamp, calls,
                                    frontier, frontier_width, onward, onward_width, route)
        calls += 1
        if not found:
            waiting = _push_list(waiting, waited, v)
            waited += 1
            continue
        negated = (-key[0], -key[1], -key[2], -key[3])
        if heap_size > 0 and _above(negated, (heap[0, 0], heap[0, 1], heap[0, 2], heap[0, 3])):
            heap = _heap_push(heap, heap_size, (negated[0], negated[1], negated[2], negated[3], v))
            heap_size += 1
            continue
        # Attach v by the route: its subtree joins the root's component.
        u = arc_tail[route[0]]
        parent[v] = u
        for i in range(length):
            residual[route[i]] -= 1
        egress[u] -= 1
        if u == root:
            left_root = True
        touched[:] = False
        base = depth[u] + 1
        for m in range(n):
            if top[m] == v:
                depth[m] = base + dist[m]
                top[m] = root
                reached[m] = True
                if group[m] >= 0:
                    touched[group[m]] = True
        added_tail[n_added] = u
        added_head[n_added] = v
        start = added_offsets[n_added]
        while start + length > len(added_arcs):
            grown = np.empty(2 * len(added_arcs), dtype=np.int64)
            grown[:start] = added_arcs[:start]
            added_arcs = grown
        added_arcs[start:start + length] = route[:length]
        added_offsets[n_added + 1] = start + length
        n_added += 1
        pending[v] = False
        left -= 1
        for w in range(n):
            if pending[w] and not at_home[w] and group[w] >= 0 and touched[group[w]]:
                batch[batched] = w
                batched += 1
    if not ok:
        residual[:] = saved
        empty = np.zeros(0, dtype=np.int64)
        return False, empty, empty, empty, np.zeros(1, dtype=np.int64), empty, depth
    n_kept = 0
    for i in range(rows):
        if keep[i]:
            n_kept += 1
    kept_rows = np.empty(n_kept, dtype=np.int64)
    n_kept = 0
    for i in range(rows):
        if keep[i]:
            kept_rows[n_kept] = seed_row0 + i
            n_kept += 1
    return (True, kept_rows, added_tail[:n_added].copy(), added_head[:n_added].copy(),
            added_offsets[:n_added + 1].copy(), added_arcs[:added_offsets[n_added]].copy(), depth)
