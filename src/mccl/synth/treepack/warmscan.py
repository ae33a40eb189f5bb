"""One-pass compiled scans (numba) over a previous schedule's routes for the warm start.

At 512 GPUs a tree-packing AllGather has ~2.1 million transfers and ~5 million route links.
The warm start reads them several times — does each route still fit the fabric (:mod:`.warm`),
the depth of every rank in every tree (:mod:`.forest`), which previous trees still fit the new
capacities (:mod:`.keep`), how many of the new tree edges the old trees had (the
``kept_fraction`` statistic). In numpy each of those was a handful of passes with a temporary
array per pass (a mask, a gather, a bincount), 0.1–0.5 s apiece under load; here each is one
loop over the arrays, with the same result as the numpy expression it replaces (named per function).
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["arcs_of_links", "route_misfit", "depths_from_steps", "chunk_load", "chunk_touching", "chunks_without_gaps",
           "fit_chunks", "edges_seen_before"]

_jit = numba.njit(cache=True, nogil=True)

# route_misfit's answers, in the order the reference (numpy) checks reported them
MISFIT_REASONS = (
    None,
    "its routes use links that this topology does not have",
    "a route does not start at its sender's GPU",
    "a route does not end at its receiver's GPU",
    "a route is not contiguous on this topology",
    "a route passes through a GPU of this topology",
)


@_jit
def arcs_of_links(links: np.ndarray, arc_of_link: np.ndarray) -> np.ndarray:
    """``arc_of_link[links]`` as int32, -1 for a link id outside the table (a link this fabric lacks)."""
    arcs = np.empty(len(links), dtype=np.int32)
    for p in range(len(links)):
        link = links[p]
        arcs[p] = arc_of_link[link] if 0 <= link < len(arc_of_link) else -1
    return arcs


@_jit
def route_misfit(links: np.ndarray, offsets: np.ndarray, sender: np.ndarray, receiver: np.ndarray,
                 link_src: np.ndarray, link_dst: np.ndarray, n_ranks: int, n_nodes: int) -> int:
    """Index into :data:`MISFIT_REASONS` of the first check some route fails (0: every route fits).

    Checks: link ids exist; each route starts at its sender and ends at its receiver (ranks are
    positions 0…n-1); consecutive links meet; no inner node is a GPU (a rank or a position ≥ n_nodes).
    """
    n_links = len(link_src)
    if len(links) == 0:
        return 1
    for p in range(len(links)):
        if links[p] < 0 or links[p] >= n_links:
            return 1
    bad = np.zeros(6, dtype=np.bool_)
    for i in range(len(sender)):
        a, b = offsets[i], offsets[i + 1]
        if b <= a:
            bad[2] = True
            continue
        if link_src[links[a]] != sender[i]:
            bad[2] = True
        if link_dst[links[b - 1]] != receiver[i]:
            bad[3] = True
        for p in range(a, b - 1):
            middle = link_dst[links[p]]
            if middle != link_src[links[p + 1]]:
                bad[4] = True
            if middle < n_ranks or middle >= n_nodes:
                bad[5] = True
    for reason in range(2, 6):
        if bad[reason]:
            return reason
    return 0


@_jit
def depths_from_steps(n: int, root: np.ndarray, chunk: np.ndarray, tail: np.ndarray, head: np.ndarray,
                      step: np.ndarray, reduce: bool) -> tuple[bool, np.ndarray]:
    """:func:`.forest._depths_from_steps`: (True, chunks × n depths) if every chunk is a spanning out-tree
    whose steps are the lowering's (depth(v) = step + 1, ReduceScatter: D - step), else (False, empty)."""
    n_chunks = len(root)
    depth = np.zeros((n_chunks, n), dtype=np.int32)
    empty = np.zeros((0, n), dtype=np.int32)
    if n_chunks == 0 or len(chunk) == 0:
        return False, empty
    for c in range(n_chunks):
        if root[c] < 0 or root[c] >= n:
            return False, empty
    top = 0
    for i in range(len(step)):
        top = max(top, step[i])
    seen = np.zeros((n_chunks, n), dtype=np.bool_)
    for c in range(n_chunks):
        seen[c, root[c]] = True  # the root has no in-edge: a row into it fails below
    for i in range(len(chunk)):
        c, v = chunk[i], head[i]
        if c < 0 or c >= n_chunks or v < 0 or v >= n or tail[i] < 0 or tail[i] >= n:
            return False, empty
        if seen[c, v]:
            return False, empty
        seen[c, v] = True
        depth[c, v] = (top + 1 - step[i]) if reduce else step[i] + 1
    for c in range(n_chunks):
        for v in range(n):
            if not seen[c, v]:
                return False, empty
    for i in range(len(chunk)):
        if depth[chunk[i], tail[i]] + 1 != depth[chunk[i], head[i]]:
            return False, empty
    return True, depth


@_jit
def chunk_load(mask: np.ndarray, chunk_links: np.ndarray, route_arcs: np.ndarray, n_arcs: int) -> np.ndarray:
    """Units per arc the routes of the chunks in ``mask`` use (``bincount(route_arcs[mask per link])``)."""
    load = np.zeros(n_arcs, dtype=np.int64)
    for c in range(len(mask)):
        if mask[c]:
            for p in range(chunk_links[c], chunk_links[c + 1]):
                load[route_arcs[p]] += 1
    return load


@_jit
def chunk_touching(mask: np.ndarray, arcs: np.ndarray, chunk_links: np.ndarray, route_arcs: np.ndarray) -> np.ndarray:
    """Per chunk in ``mask``, how many of its route links lie on arcs in ``arcs`` (a missing arc, -1, reads arc 0)."""
    touching = np.zeros(len(mask), dtype=np.int64)
    for c in range(len(mask)):
        if mask[c]:
            count = 0
            for p in range(chunk_links[c], chunk_links[c + 1]):
                if arcs[max(route_arcs[p], 0)]:
                    count += 1
            touching[c] = count
    return touching


@_jit
def chunks_without_gaps(chunk_links: np.ndarray, route_arcs: np.ndarray) -> np.ndarray:
    """Per chunk, whether every link of its routes is an arc of this fabric (no -1)."""
    ok = np.ones(len(chunk_links) - 1, dtype=np.bool_)
    for c in range(len(chunk_links) - 1):
        for p in range(chunk_links[c], chunk_links[c + 1]):
            if route_arcs[p] < 0:
                ok[c] = False
                break
    return ok


@_jit
def fit_chunks(chunks: np.ndarray, root: np.ndarray, need: np.ndarray, residual: np.ndarray,
               chunk_links: np.ndarray, route_arcs: np.ndarray) -> np.ndarray:
    """In order, keep each chunk whose root still needs a tree if its routes fit ``residual`` (taken then).

    Per chunk: 0 skipped (its root needs no more), 1 kept, 2 did not fit. ``need``, ``residual`` updated.
    """
    outcome = np.zeros(len(chunks), dtype=np.int8)
    counts = np.zeros(len(residual), dtype=np.int64)
    for i in range(len(chunks)):
        c = chunks[i]
        if need[root[c]] == 0:
            continue
        a, b = chunk_links[c], chunk_links[c + 1]
        for p in range(a, b):
            counts[route_arcs[p]] += 1
        fits = True
        for p in range(a, b):
            if residual[route_arcs[p]] < counts[route_arcs[p]]:
                fits = False
                break
        if fits:
            for p in range(a, b):
                residual[route_arcs[p]] -= 1
            need[root[c]] -= 1
            outcome[i] = 1
        else:
            outcome[i] = 2
        for p in range(a, b):
            counts[route_arcs[p]] = 0
    return outcome


@_jit
def edges_seen_before(n: int, root_start: np.ndarray, chunks_of_root: np.ndarray, row_start: np.ndarray,
                      tail: np.ndarray, head: np.ndarray, new_root: np.ndarray, new_tail: np.ndarray,
                      new_head: np.ndarray) -> int:
    """How many new edges (root, tail → head) some previous tree of the same root had
    (``isin`` of the (root, tail, head) keys, :func:`.warm.kept_fraction_of_rows`).

    ``chunks_of_root``: previous chunk ids grouped by root, ``root_start`` (n + 1) its CSR offsets.
    Per root with new edges, the parent table of each previous tree is built once; a "tree" with
    two rows into one rank (a previous schedule of another synthesizer) is searched row by row.
    """
    order = np.argsort(new_root, kind="mergesort")
    seen = 0
    parents = np.full((0, n), -1, dtype=np.int64)
    regular = True
    current = -1
    for position in range(len(order)):
        j = order[position]
        r = new_root[j]
        a, b = root_start[r], root_start[r + 1]
        if r != current:
            current = r
            regular = True
            parents = np.full((b - a, n), -1, dtype=np.int64)
            for t in range(b - a):
                c = chunks_of_root[a + t]
                for row in range(row_start[c], row_start[c + 1]):
                    if parents[t, head[row]] >= 0:
                        regular = False
                    parents[t, head[row]] = tail[row]
        found = False
        if regular:
            for t in range(b - a):
                if parents[t, new_head[j]] == new_tail[j]:
                    found = True
                    break
        else:
            for t in range(b - a):
                c = chunks_of_root[a + t]
                for row in range(row_start[c], row_start[c + 1]):
                    if head[row] == new_head[j] and tail[row] == new_tail[j]:
                        found = True
                        break
                if found:
                    break
        if found:
            seen += 1
    return seen


@_jit
def group_by_chunk(chunk: np.ndarray, n_chunks: int) -> np.ndarray:
    """``np.argsort(chunk, kind="stable")`` for chunk ids in ``0..n_chunks-1``: a counting sort (one pass to
    count, one to place). Why: a previous schedule not grouped by chunk (step order: a file, another tool)
    had its 2.6 M transfers sorted by a comparison sort at 512 GPUs."""
    start = np.zeros(n_chunks + 1, dtype=np.int64)
    for c in chunk:
        start[c + 1] += 1
    for c in range(n_chunks):
        start[c + 1] += start[c]
    order = np.empty(len(chunk), dtype=np.int64)
    for i in range(len(chunk)):
        c = chunk[i]
        order[start[c]] = i
        start[c] += 1
    return order


@_jit
def gather_routes(route_offsets: np.ndarray, route_links: np.ndarray, order: np.ndarray,
                  reverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """The routes of transfers ``order`` in that order (each reversed if asked): CSR offsets (int64) and
    links (int32) — :func:`.forest.segments` of the route links plus the offsets' cumulative sum, in one pass
    instead of a repeat, an arange and a gather over every route link."""
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    for i in range(len(order)):
        t = order[i]
        offsets[i + 1] = offsets[i] + route_offsets[t + 1] - route_offsets[t]
    links = np.empty(offsets[len(order)], dtype=np.int32)
    for i in range(len(order)):
        t = order[i]
        start, stop, out = route_offsets[t], route_offsets[t + 1], offsets[i]
        for q in range(stop - start):
            links[out + q] = route_links[stop - 1 - q] if reverse else route_links[start + q]
    return offsets, links
