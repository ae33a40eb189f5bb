"""Rooted minimum cut: ``min over sinks t of maxflow(s, t)`` in about the time of one max-flow (Hao–Orlin).

Phase 2's packing condition (:func:`~.packcheck.packing_ok`) asks ``maxflow(s*, v) >= need`` for
every rank v: n max-flows on one graph. At 2,048 GPUs that was 2,048 OR-Tools solves of 67 ms on
670 k logical arcs, ≈ 137 s for one check (issue 17). All n questions share the source, so they
are one question: the least cut ``c(δ⁻(X))`` over the sets X that hold a sink and not s.

Hao & Orlin (J. Algorithms 17, 1994, "A faster algorithm for finding the minimum cut in a
directed graph") answer it with one push-relabel run: sinks t₁, t₂, … are taken in turn, each
finished sink joins the source set S (its residual arcs saturated), and the preflow, the
distance labels and the *dormant* sets (nodes cut off from the current sink, which stay put
until the awake set W runs out) carry over from sink to sink. When no node of W but t has
excess, W is a minimum cut between S and t of value ``excess(t)`` (every arc from outside W into
W is saturated, none out of it carries flow), and the least of these over the sinks is the
rooted cut: a set X is counted at the first sink of the order that it holds.

Here only *candidate* nodes (the ranks) are sinks, and the switches a graph may still hold never
join S, so X ranges over exactly the sets that hold a rank (a switch-only set is no constraint).
Sinks are taken least label first among the candidates; when that is not the least label of W, or
after waking a dormant set, or after O(m) work, the labels are recomputed exactly by a reverse
breadth-first search from the sink (the "global relabel" heuristic), which also puts the nodes
that cannot reach the sink to sleep. Relabels use the gap rule. FIFO selection of active nodes.

Complexity O(n² √m) in the worst case like FIFO push-relabel (n nodes, m arcs), plus one O(m)
search per global relabel; measured at 2,048 GPUs in BENCHMARKS.md ("fourth session").
``decide`` stops at the first sink whose cut is below ``need``, as the packing check wants.
If a label ever runs past its bound (not seen; the guard keeps a bug from looping), the result
is flagged and :func:`rooted_min_cut` raises, so a caller can fall back to n max-flows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

__all__ = ["RootedCut", "rooted_min_cut"]

_jit = numba.njit(cache=True, nogil=True)
_AWAKE, _SOURCE = 0, -1
_UNBOUNDED = np.int64(2**62)


@dataclass(frozen=True)
class RootedCut:
    """``value``: the least cut into a set holding a candidate and not the source (or the first below
    ``need`` when deciding); ``sink_side``: that set (bool mask over the nodes); ``sinks``: phases run."""

    value: int
    sink_side: np.ndarray
    sinks: int


@_jit
def _residual_csr(n: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray):
    """Adjacency of the residual graph: every arc and its reverse (capacity 0), paired by ``rev``."""
    degree = np.zeros(n + 1, dtype=np.int64)
    for e in range(len(tails)):
        if caps[e] > 0 and tails[e] != heads[e]:
            degree[tails[e] + 1] += 1
            degree[heads[e] + 1] += 1
    first = np.cumsum(degree)
    size = first[n]
    to = np.empty(size, dtype=np.int64)
    res = np.zeros(size, dtype=np.int64)
    rev = np.empty(size, dtype=np.int64)
    fill = first[:n].copy()
    for e in range(len(tails)):
        u, v = tails[e], heads[e]
        if caps[e] <= 0 or u == v:
            continue
        a, b = fill[u], fill[v]
        fill[u] += 1
        fill[v] += 1
        to[a], res[a], rev[a] = v, caps[e], b
        to[b], res[b], rev[b] = u, 0, a
    return first, to, res, rev


@_jit
def _hao_orlin(n: int, first: np.ndarray, to: np.ndarray, res: np.ndarray, rev: np.ndarray, source: int,
               candidate: np.ndarray, need: int, decide: bool):
    """(value, sink side, sinks run, ok). ``ok`` False: a label ran past its bound (a bug guard)."""
    where = np.zeros(n, dtype=np.int64)  # _AWAKE, _SOURCE, or the dormant set's number (1, 2, …)
    label = np.zeros(n, dtype=np.int64)
    excess = np.zeros(n, dtype=np.int64)
    current = first[:n].copy()
    limit = 2 * n + 2
    count = np.zeros(limit + 2, dtype=np.int64)  # awake nodes per label
    queue = np.empty(n + 1, dtype=np.int64)  # FIFO ring of active awake nodes
    queued = np.zeros(n, dtype=np.bool_)
    head = 0
    tail = 0
    stack = np.empty(n, dtype=np.int64)
    best = _UNBOUNDED
    best_side = np.zeros(n, dtype=np.bool_)
    sinks = 0
    dormant = 0
    awake_candidates = 0
    for v in range(n):
        if candidate[v] and v != source:
            awake_candidates += 1
    where[source] = _SOURCE
    t = source  # the node just moved into S, whose arcs are saturated below
    force = True
    work = 0
    budget = 2 * len(to) + n
    while True:
        # The node t joins S: every residual arc out of it into V \ S is saturated.
        for a in range(first[t], first[t + 1]):
            x = to[a]
            if res[a] > 0 and where[x] != _SOURCE:
                delta = res[a]
                res[a] = 0
                res[rev[a]] += delta
                excess[x] += delta
                if where[x] == _AWAKE and not queued[x] and excess[x] > 0:
                    queued[x] = True
                    queue[tail] = x
                    tail = (tail + 1) % (n + 1)
        # Wake dormant sets (newest first) until W holds a candidate. A set woken into an empty W keeps
        # its labels (valid inside it: nothing there moved while it slept); joining awake nodes, whose
        # arcs into it no label was kept for, it needs the global relabel.
        while awake_candidates == 0 and dormant > 0:
            for v in range(n):
                if where[v] == _AWAKE:
                    force = True
                    break
            for v in range(n):
                if where[v] == dormant:
                    where[v] = _AWAKE
                    count[label[v]] += 1
                    current[v] = first[v]
                    if candidate[v]:
                        awake_candidates += 1
                    if excess[v] > 0 and not queued[v]:
                        queued[v] = True
                        queue[tail] = v
                        tail = (tail + 1) % (n + 1)
            dormant -= 1
        if awake_candidates == 0:
            break
        t = -1
        least = _UNBOUNDED
        for v in range(n):
            if where[v] == _AWAKE:
                least = min(least, label[v])
                if candidate[v] and (t < 0 or label[v] < label[t]):
                    t = v
        sinks += 1
        relabel_now = force or label[t] > least or work > budget
        while True:
            if relabel_now:
                # Global relabel: exact residual distances to t within W; W nodes that cannot reach t sleep.
                for v in range(n):
                    if where[v] == _AWAKE:
                        label[v] = -1
                label[t] = 0
                size = 1
                stack[0] = t
                position = 0
                while position < size:
                    y = stack[position]
                    position += 1
                    for a in range(first[y], first[y + 1]):
                        x = to[a]
                        if where[x] == _AWAKE and label[x] < 0 and res[rev[a]] > 0:
                            label[x] = label[y] + 1
                            stack[size] = x
                            size += 1
                asleep = False
                count[:] = 0
                head = 0
                tail = 0
                queued[:] = False
                for v in range(n):
                    if where[v] != _AWAKE:
                        continue
                    if label[v] < 0:
                        if not asleep:
                            dormant += 1
                            asleep = True
                        where[v] = dormant
                        label[v] = 0
                        if candidate[v]:
                            awake_candidates -= 1
                        continue
                    count[label[v]] += 1
                    current[v] = first[v]
                    if v != t and excess[v] > 0:
                        queued[v] = True
                        queue[tail] = v
                        tail = (tail + 1) % (n + 1)
                force = False
                work = 0
                relabel_now = False
            if head == tail:
                break
            v = queue[head]
            head = (head + 1) % (n + 1)
            queued[v] = False
            if where[v] != _AWAKE or v == t:
                continue
            # Discharge v: push along admissible arcs inside W, relabel when none is left.
            while excess[v] > 0 and where[v] == _AWAKE:
                a = current[v]
                if a < first[v + 1]:
                    x = to[a]
                    if res[a] > 0 and where[x] == _AWAKE and label[v] == label[x] + 1:
                        delta = min(excess[v], res[a])
                        res[a] -= delta
                        res[rev[a]] += delta
                        excess[v] -= delta
                        excess[x] += delta
                        if x != t and not queued[x]:
                            queued[x] = True
                            queue[tail] = x
                            tail = (tail + 1) % (n + 1)
                    else:
                        current[v] = a + 1
                    continue
                d = label[v]
                work += first[v + 1] - first[v] + 1
                if count[d] == 1:  # gap: v alone at d, so W's nodes from d up cannot reach t
                    dormant += 1
                    for x in range(n):
                        if where[x] == _AWAKE and label[x] >= d:
                            where[x] = dormant
                            count[label[x]] -= 1
                            if candidate[x]:
                                awake_candidates -= 1
                    break
                lowest = _UNBOUNDED
                for b in range(first[v], first[v + 1]):
                    if res[b] > 0 and where[to[b]] == _AWAKE and label[to[b]] < lowest:
                        lowest = label[to[b]]
                count[d] -= 1
                if lowest == _UNBOUNDED:  # no residual arc into W: v sleeps alone
                    dormant += 1
                    where[v] = dormant
                    if candidate[v]:
                        awake_candidates -= 1
                    break
                if lowest + 1 > limit:
                    return best, best_side, sinks, False
                label[v] = lowest + 1
                count[label[v]] += 1
                current[v] = first[v]
            if work > budget:
                relabel_now = True
        # No node of W but t holds excess: W is a minimum cut between S and t, of value excess(t).
        if excess[t] < best:
            best = excess[t]
            for v in range(n):
                best_side[v] = where[v] == _AWAKE
            if decide and best < need:
                return best, best_side, sinks, True
        where[t] = _SOURCE
        count[label[t]] -= 1
        awake_candidates -= 1
    return best, best_side, sinks, True


def rooted_min_cut(n_nodes: int, source: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray,
                   candidates: np.ndarray, need: int | None = None) -> RootedCut:
    """The least ``maxflow(source, t)`` over the candidate sinks t, with a minimum cut's sink side.

    ``candidates``: bool mask of the nodes that count as sinks (others may sit on either side of
    a cut). ``need``: decide only — stop at the first sink whose cut is below it (``value`` is then
    that cut, not necessarily the least). No candidate: ``value`` is 2**62.
    """
    tails = np.asarray(tails, dtype=np.int64)
    heads = np.asarray(heads, dtype=np.int64)
    caps = np.asarray(caps, dtype=np.int64)
    if len(caps) and int(caps.min()) < 0:
        raise ValueError("rooted_min_cut: negative arc capacity")
    first, to, res, rev = _residual_csr(n_nodes, tails, heads, caps)
    mask = np.asarray(candidates, dtype=np.bool_)
    value, side, sinks, ok = _hao_orlin(n_nodes, first, to, res, rev, source, mask,
                                        -1 if need is None else int(need), need is not None)
    if not ok:
        raise ArithmeticError("rooted_min_cut: a distance label ran past 2n (a bug); use max-flows instead")
    return RootedCut(int(value), side, int(sinks))
