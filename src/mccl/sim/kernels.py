"""Compiled (numba) kernels of the flow table: membership, incremental max-min fair rates, finish heap.

Why compiled. An asymmetric schedule (tree packing on 128 GPUs: 146 k transfers)
finishes almost every transfer at its own time, so the engine handles ~140 k
event batches, each changing a few flows among ~10 k active ones. Re-solving all
of them with vectorized progressive filling (:mod:`mccl.sim.fairshare`) cost
~1 ms a batch; these kernels re-solve only the flows an event can reach, in
compiled loops over per-link lists of flows.

Named state. The table is a few groups of arrays, each a ``NamedTuple`` defined
here: :class:`FlowState` (per slot, what the rates need), :class:`SlotBook` (per
slot, the rest), :class:`LinkState` (per link), :class:`HopState` (per hop of a
collective), two :class:`WorkList` s (what the next rate update must look at),
:class:`FinishHeap` and :class:`Scratch` (the solver's working arrays). Counters are
named one-element arrays of their group (``book.n_free``, ``dirty.count``,
``heap.size``...), so a kernel moves them in place; kernels take the groups, plus
the few values of the call.

One compile unit. numba's file cache (``cache=True``) checks only the source file
of the function it compiled: not callees, globals or ``NamedTuple`` fields defined in
another file (a type is keyed by its class and field types, not its field names, so
two fields swapped in another file would leave a stale kernel reading the wrong
arrays). So the groups and every kernel that reads them are in this one file, and no
kernel calls a jitted function of another module.

Groups travel as plain tuples. numba types a plain tuple of arrays in C but a
``NamedTuple`` in Python (~0.4 µs per array, a few kernel calls per event batch), so
:class:`mccl.sim.flows.FlowTable` passes each group as a plain tuple (kept when the
group is assigned) and each entry point names the groups again (``f =
FlowState(*flows)``: free once compiled). It then takes the arrays it uses out of
them by name, once, into locals (``f_rate = f.rate``) that the loops and helpers
use: reading arrays from the groups inside the loops (or passing whole groups to
helpers) made the kernels 20-80% slower — numba's reference counting of tuples.

Membership. Flows live in slots; slot s has up to R route links in ``route[s]``;
incidence (s, k) has id ``s * R + k``. Each link keeps the slots of its flows in a
row of ``LinkState.flows`` (``deg`` of them; removal swaps the last one in,
``SlotBook.i_pos`` says where each incidence sits), so walking a link's flows reads
one contiguous row. Flows of one hop of a collective form a list per hop
(``HopState.head``, ``SlotBook.hnext``/``hprev``) whose oldest step sets their weights.
Starting or finishing a flow costs nothing per other flow; it marks what the next
rate update must look at: new flows, flows whose hop's oldest step moved (their
weights change), links whose load changed.

Incremental exact max-min (weighted; Bertsekas & Gallager, *Data Networks* §6.5.2).
An allocation is *the* max-min fair one iff it is feasible and every flow has a
bottleneck: a saturated link on its route where its level (rate / weight) is the
largest. After an event :func:`recompute`

1. takes a set S of flows to re-solve: the new flows, the flows whose weight
   changed, and the flows whose bottleneck is a link whose load or capacity changed;
2. solves S by exact progressive filling on the capacity the other flows leave
   (their rates stay): the link of lowest share saturates next, found by a scan of
   S's links when they are few (≤ 48) and an indexed binary heap otherwise;
3. checks feasibility and the bottleneck condition on every link where a rate or
   weight changed, that changed, or that now bottlenecks an S flow: the kept flows
   on a link over its capacity (a capacity that fell), a kept flow whose bottleneck
   link is no longer saturated, or on which some flow now has a higher level, and
   a kept flow above an S flow on that S flow's bottleneck, are added to S, and 2
   is repeated. Once S holds a quarter of the live flows it takes all of them
   (a change that spreads over the fabric is cheaper solved in one round).

S only grows, and with S = all flows step 2 is a full solve, so the loop ends; when it
ends every flow meets the bottleneck condition, so the rates are the unique max-min
fair ones, not an approximation. The checks use a relative tolerance ``eps`` (1e-11,
:mod:`mccl.sim.flows`): a kept flow within 1e-11 of its bottleneck condition stays as
it is (measured against a from-scratch solve after every event of whole runs, tree
packing on 16 and 64 GPUs: rates agree within 1e-10 relative). Link loads are
re-summed exactly over the links checked, so no rounding error accumulates from
event to event. Why a flow not reached keeps its rate: in a max-min state the links
around it carry the same rates and levels as before, so its bottleneck still holds.

Weights are ``step_priority ** -d`` with d in 0..4 (:mod:`mccl.sim.flows`), so a
link's total weight is kept as counts per d and never drifts by subtraction.

Predicted finishes sit on a heap with per-slot versions (``FlowState.ver``): a rate
change or a removal moves the version on, so older entries are skipped when they surface.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from mccl.sim.indexheap import heap_pop as _heap_pop
from mccl.sim.indexheap import heap_set as _heap_set

__all__ = ["FinishHeap", "FlowState", "HopState", "LinkState", "Rows", "Scratch", "SlotBook", "WorkList", "add_flows",
           "due", "next_finish", "rebuild_finish_heap", "recompute", "relink", "remove_flows"]

_jit = numba.njit(cache=True, nogil=True)
_MAX_GAP = 4  # weights below step_priority**-4 make no difference
_WHOLE = 0.25  # once S holds this share of the live flows, S becomes all of them (no more rounds)
_SCAN_LINKS = 48  # up to this many links, find the lowest share by a scan instead of a heap
_BIG = np.iinfo(np.int64).max


# -- named state ----------------------------------------------------------------------------------
class FlowState(NamedTuple):
    """The flows, one entry per slot: what the rate solver reads (free slots: ``rate`` 0, ``finish`` inf)."""

    alive: np.ndarray  # bool
    hop: np.ndarray  # global hop id (-1: none, weight 1)
    step: np.ndarray
    length: np.ndarray  # links on the route
    route: np.ndarray  # (slots, R): link ids
    remaining: np.ndarray  # bytes left at t0
    t0: np.ndarray  # time of the last rate change
    rate: np.ndarray  # bytes/s
    finish: np.ndarray  # predicted finish (inf at rate 0)
    bottleneck: np.ndarray  # link that set the rate (-1: none yet)
    wlev: np.ndarray  # weight level d: the flow weighs wtab[d]
    ver: np.ndarray  # version: entries of the finish heap with an older one are stale
    n_live: np.ndarray  # int64[1]: live flows


class SlotBook(NamedTuple):
    """Per slot, what membership keeps and the rate solver never reads (so it is not passed to it)."""

    run: np.ndarray  # run slot of the collective (-1: greedy background, -2: free)
    transfer: np.ndarray  # the run's transfer (row), or the background flow's index
    path: np.ndarray  # meter path (-1: none)
    hnext: np.ndarray  # next / previous flow of the same hop (-1: none)
    hprev: np.ndarray
    i_pos: np.ndarray  # (slots * R): position of incidence s * R + k in its link's row
    free: np.ndarray  # stack of free slots, the lowest on top
    n_free: np.ndarray  # int64[1]: free slots on the stack


class LinkState(NamedTuple):
    """Per link: its flows' load and the rows of their slots (``deg`` used of each row)."""

    rate: np.ndarray  # bytes/s of the table's flows
    deg: np.ndarray  # flows on the link (incidences)
    flows: np.ndarray  # (links, width): their slots
    inc: np.ndarray  # (links, width): their incidence ids


class HopState(NamedTuple):
    """Per hop of a collective: its list of flows and its oldest step in flight."""

    head: np.ndarray  # first flow of the list (-1: none)
    oldest: np.ndarray  # (int64 max: none)


class WorkList(NamedTuple):
    """Items (slots or links) to look at, each listed once: ``items[:count[0]]``, ``marked`` per item."""

    marked: np.ndarray
    items: np.ndarray
    count: np.ndarray  # int64[1]


class FinishHeap(NamedTuple):
    """Binary min-heap of (predicted finish, slot, version) in ``[:size[0]]``."""

    key: np.ndarray
    slot: np.ndarray
    ver: np.ndarray
    size: np.ndarray  # int64[1]


class Scratch(NamedTuple):
    """:func:`recompute`'s working arrays (contents meaningless between calls) and its totals."""

    s_in: np.ndarray  # per slot: in the set S being re-solved
    s_frozen: np.ndarray  # its rate is fixed in this round
    s_rate: np.ndarray  # its new rate
    s_bneck: np.ndarray  # its new bottleneck
    s_wold: np.ndarray  # its weight level before it joined S
    l_mark: np.ndarray  # per link: on a route of S
    resid: np.ndarray  # capacity left to S's unfrozen flows
    cnt: np.ndarray  # S's unfrozen flows on it
    cnt_lev: np.ndarray  # (links, 5): those per weight level
    hp: np.ndarray  # indexed heap of link shares: links in heap order
    hpos: np.ndarray  # each link's place in it (-1: not in it)
    hkey: np.ndarray  # its share
    flows_solved: np.ndarray  # int64[1]: flows re-solved, summed over calls
    links_solved: np.ndarray  # int64[1]: links of S, summed over calls


class Rows(NamedTuple):
    """Per-row arrays that :func:`add_flows` starts flows from (a compiled schedule's transfers)."""

    route_offsets: np.ndarray  # CSR of the routes: links route_links[route_offsets[t]:route_offsets[t + 1]]
    route_links: np.ndarray
    size: np.ndarray  # bytes, times add_flows' size_scale
    step: np.ndarray
    hop: np.ndarray  # (< 0: none) plus add_flows' hop_base
    path_by: np.ndarray  # index into add_flows' path_of


# -- membership -----------------------------------------------------------------------------------
@_jit
def _link_insert(s, big_r, f_len, f_route, i_pos, l_flows, l_inc, l_deg):
    """Append slot s to the rows of the links on its route."""
    for k in range(f_len[s]):
        link = f_route[s, k]
        q = l_deg[link]
        l_flows[link, q] = s
        l_inc[link, q] = s * big_r + k
        i_pos[s * big_r + k] = q
        l_deg[link] = q + 1


@_jit
def _link_unlink(s, big_r, f_len, f_route, i_pos, l_flows, l_inc, l_deg):
    """Take slot s out of the rows of the links on its route (each row's last entry fills the gap)."""
    for k in range(f_len[s]):
        link = f_route[s, k]
        q = i_pos[s * big_r + k]
        last = l_deg[link] - 1
        l_flows[link, q] = l_flows[link, last]
        l_inc[link, q] = l_inc[link, last]
        i_pos[l_inc[link, q]] = q
        l_deg[link] = last


@_jit
def relink(flows, book, links):
    """Rebuild every link's row of flows (after the slot arrays or the rows were reallocated)."""
    f, bk, lk = FlowState(*flows), SlotBook(*book), LinkState(*links)
    big_r = f.route.shape[1]
    f_alive, f_len, f_route, i_pos = f.alive, f.length, f.route, bk.i_pos
    l_flows, l_inc, l_deg = lk.flows, lk.inc, lk.deg
    l_deg[:] = 0
    for s in range(len(f_alive)):
        if f_alive[s]:
            _link_insert(s, big_r, f_len, f_route, i_pos, l_flows, l_inc, l_deg)


@_jit
def _append_once(item, marked, items, count):
    """Append ``item`` to a work list (``items[:count[0]]``) unless it is ``marked`` already."""
    if not marked[item]:
        marked[item] = True
        items[count[0]] = item
        count[0] += 1


@_jit
def _hop_refresh(h, h_head, h_oldest, f_hnext, f_step, f_dirty, dlist, n_dirty):
    """Recompute hop h's oldest step; if it moved, every flow of the hop changes weight."""
    best = _BIG
    s = h_head[h]
    while s >= 0:
        if f_step[s] < best:
            best = f_step[s]
        s = f_hnext[s]
    if best != h_oldest[h]:
        h_oldest[h] = best
        s = h_head[h]
        while s >= 0:
            _append_once(s, f_dirty, dlist, n_dirty)
            s = f_hnext[s]


@_jit
def add_flows(slots, ids, rows, run, size_scale, hop_base, path_of, now, flows, book, links, hops, dirty, changed):
    """Put flows into free slots (written to ``slots``); mark them and their hops for re-solving.

    Flow j is row ``t = ids[j]`` of :class:`Rows` ``rows``: route ``route_links[route_offsets[t]:
    route_offsets[t+1]]``, ``size_of[t] * size_scale`` bytes, step ``step_of[t]``, hop
    ``hop_of[t] + hop_base`` (none when ``hop_of[t] < 0``), meter path ``path_of[path_by[t]]``
    (-1 when ``path_of`` is empty). Returns how many were added: it stops before a flow
    one of whose links has no room left in ``l_flows`` (the caller widens it and goes on)."""
    r, f, bk, lk, hs = Rows(*rows), FlowState(*flows), SlotBook(*book), LinkState(*links), HopState(*hops)
    dirty, changed = WorkList(*dirty), WorkList(*changed)
    route_offsets, route_links, size_of, step_of, hop_of, path_by = (
        r.route_offsets, r.route_links, r.size, r.step, r.hop, r.path_by)
    big_r = f.route.shape[1]
    f_alive, f_hop, f_step, f_len, f_route, f_remaining = f.alive, f.hop, f.step, f.length, f.route, f.remaining
    f_t0, f_rate, f_finish, f_bneck, f_wlev, n_live = f.t0, f.rate, f.finish, f.bottleneck, f.wlev, f.n_live
    f_run, f_transfer, f_path, f_hnext, f_hprev, i_pos = bk.run, bk.transfer, bk.path, bk.hnext, bk.hprev, bk.i_pos
    free, n_free = bk.free, bk.n_free
    l_flows, l_inc, l_deg, h_head, h_oldest = lk.flows, lk.inc, lk.deg, hs.head, hs.oldest
    f_dirty, dlist, n_dirty = dirty.marked, dirty.items, dirty.count
    l_changed, clist, n_changed = changed.marked, changed.items, changed.count
    width = l_flows.shape[1]
    for j in range(len(ids)):
        t = ids[j]
        first = route_offsets[t]
        length = route_offsets[t + 1] - first
        for k in range(length):
            if l_deg[route_links[first + k]] + length > width:
                return j
        n_free[0] -= 1
        s = free[n_free[0]]
        slots[j] = s
        f_alive[s] = True
        f_run[s] = run
        f_transfer[s] = t
        h = hop_of[t] + hop_base if hop_of[t] >= 0 else -1
        f_hop[s] = h
        f_step[s] = step_of[t]
        f_path[s] = path_of[path_by[t]] if len(path_of) else -1
        f_len[s] = length
        for k in range(f_len[s]):
            f_route[s, k] = route_links[first + k]
            _append_once(route_links[first + k], l_changed, clist, n_changed)
        f_remaining[s] = size_of[t] * size_scale
        f_t0[s] = now
        f_rate[s] = 0.0
        f_finish[s] = np.inf
        f_bneck[s] = -1
        f_wlev[s] = 0
        n_live[0] += 1
        _link_insert(s, big_r, f_len, f_route, i_pos, l_flows, l_inc, l_deg)
        _append_once(s, f_dirty, dlist, n_dirty)
        f_hprev[s] = -1
        f_hnext[s] = -1
        if h >= 0:
            head = h_head[h]
            f_hnext[s] = head
            if head >= 0:
                f_hprev[head] = s
            h_head[h] = s
            if f_step[s] < h_oldest[h]:
                _hop_refresh(h, h_head, h_oldest, f_hnext, f_step, f_dirty, dlist, n_dirty)
    return len(ids)


@_jit
def remove_flows(slots, flows, book, links, hops, dirty, changed):
    """Free the slots; their links' loads changed, and their hops' oldest steps may have."""
    f, bk, lk, hs = FlowState(*flows), SlotBook(*book), LinkState(*links), HopState(*hops)
    dirty, changed = WorkList(*dirty), WorkList(*changed)
    big_r = f.route.shape[1]
    f_alive, f_ver, f_hop, f_step, f_len, f_route = f.alive, f.ver, f.hop, f.step, f.length, f.route
    f_rate, f_finish, n_live = f.rate, f.finish, f.n_live
    f_run, f_path, f_hnext, f_hprev, i_pos, free, n_free = bk.run, bk.path, bk.hnext, bk.hprev, bk.i_pos, bk.free, bk.n_free
    l_flows, l_inc, l_deg, link_rate, h_head, h_oldest = lk.flows, lk.inc, lk.deg, lk.rate, hs.head, hs.oldest
    f_dirty, dlist, n_dirty = dirty.marked, dirty.items, dirty.count
    l_changed, clist, n_changed = changed.marked, changed.items, changed.count
    for j in range(len(slots)):
        s = slots[j]
        if not f_alive[s]:
            continue
        for k in range(f_len[s]):
            link = f_route[s, k]
            link_rate[link] -= f_rate[s]
            _append_once(link, l_changed, clist, n_changed)
        _link_unlink(s, big_r, f_len, f_route, i_pos, l_flows, l_inc, l_deg)
        h = f_hop[s]
        if h >= 0:
            nxt = f_hnext[s]
            prv = f_hprev[s]
            if prv >= 0:
                f_hnext[prv] = nxt
            else:
                h_head[h] = nxt
            if nxt >= 0:
                f_hprev[nxt] = prv
            if f_step[s] == h_oldest[h]:
                _hop_refresh(h, h_head, h_oldest, f_hnext, f_step, f_dirty, dlist, n_dirty)
        f_alive[s] = False
        f_ver[s] += 1  # its finish-heap entry is stale
        f_run[s] = -2
        f_path[s] = -1
        f_rate[s] = 0.0
        f_finish[s] = np.inf
        free[n_free[0]] = s
        n_free[0] += 1
        n_live[0] -= 1


# -- finish-time heap -----------------------------------------------------------------------------


@_jit
def _finish_push(key, slot, ver, q_key, q_slot, q_ver, q_size):
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
            _finish_push(f_finish[s], s, f_ver[s], q_key, q_slot, q_ver, q_size)


# -- max-min rates --------------------------------------------------------------------------------


@_jit
def _share(resid, cnt_lev, link, wtab):
    total = 0.0
    for d in range(_MAX_GAP + 1):
        total += cnt_lev[link, d] * wtab[d]
    if total <= 0.0:
        return np.inf
    return max(resid[link], 0.0) / total


@_jit
def _join(s, members, m, s_in, s_wold, f_wlev, f_hop, f_step, h_oldest):
    """Put flow s into S (at ``members[m]``), with its weight level as of now."""
    s_in[s] = True
    members[m] = s
    s_wold[s] = f_wlev[s]
    h = f_hop[s]
    f_wlev[s] = min(f_step[s] - h_oldest[h], _MAX_GAP) if h >= 0 else 0
    return m + 1


@_jit
def recompute(capacity, now, wtab, eps, flows, links, hops, dirty, changed, heap, scratch):
    """Incremental exact max-min rates after the marked changes (see the module docstring).

    ``capacity``: what each link leaves to the table's flows. Returns the number of
    sub-solves (1 when the first set S was enough)."""
    f, lk, hs, sc = FlowState(*flows), LinkState(*links), HopState(*hops), Scratch(*scratch)
    dirty, changed, heap = WorkList(*dirty), WorkList(*changed), FinishHeap(*heap)
    f_alive, f_hop, f_step, f_len, f_route, f_remaining = f.alive, f.hop, f.step, f.length, f.route, f.remaining
    f_t0, f_rate, f_finish, f_bneck, f_wlev, f_ver = f.t0, f.rate, f.finish, f.bottleneck, f.wlev, f.ver
    l_flows, l_deg, link_rate, h_oldest = lk.flows, lk.deg, lk.rate, hs.oldest
    f_dirty, dlist, l_changed, clist = dirty.marked, dirty.items, changed.marked, changed.items
    s_in, s_frozen, s_rate, s_bneck, s_wold = sc.s_in, sc.s_frozen, sc.s_rate, sc.s_bneck, sc.s_wold
    l_mark, resid, cnt, cnt_lev, hp, hpos, hkey = sc.l_mark, sc.resid, sc.cnt, sc.cnt_lev, sc.hp, sc.hpos, sc.hkey
    q_key, q_slot, q_ver, q_size = heap.key, heap.slot, heap.ver, heap.size
    n_live = f.n_live[0]
    n_dirty = dirty.count[0]
    n_changed = changed.count[0]
    if n_dirty == 0 and n_changed == 0:
        return 0
    n_links = len(l_deg)
    members = np.empty(n_live, dtype=np.int64)
    m = 0
    for j in range(n_dirty):
        s = dlist[j]
        f_dirty[s] = False
        if f_alive[s] and not s_in[s]:
            m = _join(s, members, m, s_in, s_wold, f_wlev, f_hop, f_step, h_oldest)
    changed_links = clist[:n_changed].copy()
    for link in changed_links:
        l_changed[link] = False
        for q in range(l_deg[link]):
            s = l_flows[link, q]
            if not s_in[s] and (f_bneck[s] == link or f_bneck[s] < 0):
                m = _join(s, members, m, s_in, s_wold, f_wlev, f_hop, f_step, h_oldest)
    dirty.count[0] = 0
    changed.count[0] = 0
    touched = np.empty(n_links, dtype=np.int64)
    local = np.empty(n_links, dtype=np.int64)  # link -> its index in touched
    need = np.zeros(n_links, dtype=np.bool_)  # links whose bottleneck condition must be checked
    l_moved = np.zeros(n_links, dtype=np.bool_)  # links whose heap key is to be updated
    moved = np.empty(n_links, dtype=np.int64)
    n_moved = 0
    checked = np.empty(n_links, dtype=np.int64)
    exact = np.empty(n_links)  # their loads, summed afresh
    n_checked = 0
    solves = 0
    nt = 0
    while True:
        solves += 1
        # -- the links of S, and the S flows on each (CSR, local link ids) -------------------
        nt = 0
        n_inc = 0
        for j in range(m):
            s = members[j]
            s_frozen[s] = False
            n_inc += f_len[s]
            for k in range(f_len[s]):
                link = f_route[s, k]
                if not l_mark[link]:
                    l_mark[link] = True
                    local[link] = nt
                    touched[nt] = link
                    nt += 1
        offsets = np.zeros(nt + 1, dtype=np.int64)
        for j in range(m):
            s = members[j]
            for k in range(f_len[s]):
                offsets[local[f_route[s, k]] + 1] += 1
        for j in range(nt):
            offsets[j + 1] += offsets[j]
        fill = offsets[:-1].copy()
        on_link = np.empty(n_inc, dtype=np.int64)
        for j in range(m):
            s = members[j]
            for k in range(f_len[s]):
                q = local[f_route[s, k]]
                on_link[fill[q]] = s
                fill[q] += 1
        # -- residual capacity (what kept flows leave) and weight counts per link -------------
        use_heap = nt > _SCAN_LINKS
        size = 0
        for j in range(nt):
            link = touched[j]
            r = capacity[link] - link_rate[link]
            for d in range(_MAX_GAP + 1):
                cnt_lev[link, d] = 0
            for q in range(offsets[j], offsets[j + 1]):
                s = on_link[q]
                r += f_rate[s]
                cnt_lev[link, f_wlev[s]] += 1
            resid[link] = r
            cnt[link] = offsets[j + 1] - offsets[j]
            if use_heap:
                size = _heap_set(hp, hpos, hkey, link, _share(resid, cnt_lev, link, wtab), size)
        for j in range(m):
            s = members[j]
            if f_len[s] == 0:  # no link limits it (not made by the engine; as max_min_rates does)
                s_frozen[s] = True
                s_rate[s] = np.inf
                s_bneck[s] = -1
        # -- exact progressive filling of S: the link of lowest share saturates next --------
        # (a heap of shares on many links, a scan of them on few)
        while True:
            if use_heap:
                if size == 0:
                    break
                link = hp[0]
                share = hkey[link]
                size = _heap_pop(hp, hpos, hkey, size)
                if cnt[link] == 0:
                    continue
            else:
                link = -1
                share = np.inf
                for j in range(nt):
                    other = touched[j]
                    if cnt[other] > 0:
                        value = _share(resid, cnt_lev, other, wtab)
                        if link < 0 or value < share:
                            share = value
                            link = other
                if link < 0:
                    break
            j = local[link]
            for q in range(offsets[j], offsets[j + 1]):
                s = on_link[q]
                if s_frozen[s]:
                    continue
                s_frozen[s] = True
                rate = share * wtab[f_wlev[s]]
                s_rate[s] = rate
                s_bneck[s] = link
                for k in range(f_len[s]):
                    other = f_route[s, k]
                    resid[other] -= rate
                    cnt[other] -= 1
                    cnt_lev[other, f_wlev[s]] -= 1
                    if use_heap and hpos[other] >= 0 and not l_moved[other]:
                        l_moved[other] = True  # re-keyed once, after all flows of this link froze
                        moved[n_moved] = other
                        n_moved += 1
            for j in range(n_moved):
                other = moved[j]
                l_moved[other] = False
                size = _heap_set(hp, hpos, hkey, other, _share(resid, cnt_lev, other, wtab), size)
            n_moved = 0
        # -- which links to check: rates or weights changed on them, an S flow's bottleneck ----
        for link in changed_links:
            need[link] = True
        for j in range(m):
            s = members[j]
            if s_bneck[s] >= 0:
                need[s_bneck[s]] = True
            if s_rate[s] != f_rate[s] or f_wlev[s] != s_wold[s]:
                for k in range(f_len[s]):
                    need[f_route[s, k]] = True
        # -- the bottleneck condition (and feasibility) on those links ------------------------
        grown = m
        n_checked = 0
        for j in range(nt + n_changed):
            link = touched[j] if j < nt else changed_links[j - nt]
            if not need[link]:
                continue
            need[link] = False
            load = 0.0
            top = 0.0  # highest level of any flow on the link
            low_s = np.inf  # lowest level of an S flow bottlenecked here
            top_kept = 0.0  # highest level of a kept flow
            low_kept_b = np.inf  # lowest level of a kept flow bottlenecked here
            for q in range(l_deg[link]):
                s = l_flows[link, q]
                if s_in[s]:
                    rate = s_rate[s]
                    level = rate / wtab[f_wlev[s]]
                    if s_bneck[s] == link and level < low_s:
                        low_s = level
                else:
                    rate = f_rate[s]
                    level = rate / wtab[f_wlev[s]]
                    if level > top_kept:
                        top_kept = level
                    if f_bneck[s] == link and level < low_kept_b:
                        low_kept_b = level
                load += rate
                if level > top:
                    top = level
            checked[n_checked] = link
            exact[n_checked] = load
            n_checked += 1
            saturated = load >= capacity[link] * (1.0 - eps)
            overloaded = load > capacity[link] * (1.0 + eps)  # its capacity fell under kept flows
            if not (overloaded or top_kept > low_s * (1.0 + eps)
                    or (low_kept_b < np.inf and (not saturated or low_kept_b < top * (1.0 - eps)))):
                continue
            for q in range(l_deg[link]):
                s = l_flows[link, q]
                if not s_in[s]:
                    level = f_rate[s] / wtab[f_wlev[s]]
                    bad = overloaded or level > low_s * (1.0 + eps)
                    if f_bneck[s] == link and (not saturated or level < top * (1.0 - eps)):
                        bad = True
                    if bad:  # (its weight level stays: had its hop changed, it would be in S)
                        grown = _join(s, members, grown, s_in, s_wold, f_wlev, f_hop, f_step, h_oldest)
        if grown == m:
            break
        m = grown
        if m > _WHOLE * n_live:  # the change spreads over much of the fabric: solve every flow at once
            for s in range(len(f_alive)):
                if f_alive[s] and not s_in[s]:
                    m = _join(s, members, m, s_in, s_wold, f_wlev, f_hop, f_step, h_oldest)
        for j in range(nt):
            l_mark[touched[j]] = False
    sc.flows_solved[0] += m
    sc.links_solved[0] += nt
    # -- commit ----------------------------------------------------------------------------------
    for j in range(m):
        s = members[j]
        s_in[s] = False
        rate = s_rate[s]
        f_bneck[s] = s_bneck[s]
        if rate != f_rate[s]:
            for k in range(f_len[s]):
                link_rate[f_route[s, k]] += rate - f_rate[s]
            left = f_remaining[s] - f_rate[s] * (now - f_t0[s])
            f_remaining[s] = left
            f_t0[s] = now
            f_rate[s] = rate
            f_finish[s] = now + left / rate if rate > 0 else np.inf
            f_ver[s] += 1
            if f_finish[s] < np.inf:
                _finish_push(f_finish[s], s, f_ver[s], q_key, q_slot, q_ver, q_size)
    for j in range(n_checked):
        link_rate[checked[j]] = exact[j]  # no rounding drift accumulates on the links checked
    for j in range(nt):
        l_mark[touched[j]] = False
    return solves

