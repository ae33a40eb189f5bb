"""Compiled (numba) kernels of the flow table: membership (here), incremental max-min fair rates
(:mod:`mccl.sim.maxmin`), the finish heap (:mod:`mccl.sim.finishheap`), over the named state of
:mod:`mccl.sim.flowstate`. This module re-exports them all: :mod:`mccl.sim.flows` reads only it.

Why compiled. An asymmetric schedule (tree packing on 128 GPUs: 146 k transfers)
finishes almost every transfer at its own time, so the engine handles ~140 k
event batches, each changing a few flows among ~10 k active ones. Re-solving all
of them with vectorized progressive filling (:mod:`mccl.sim.fairshare`) cost
~1 ms a batch; these kernels re-solve only the flows an event can reach, in
compiled loops over per-link lists of flows.

Several files, one cache rule. numba's file cache (``cache=True``) checks only the source file
of the function it compiled: not callees, globals or ``NamedTuple`` fields defined in another file.
These kernels were one 721-line file for that reason; now each kernel module compiles with
:func:`mccl.jitcache.cached_njit`, naming the files it depends on, and a change to one of them
drops the dependent kernels' cache index, so they compile afresh once.

Membership. Flows live in slots; slot s has up to R route links in ``route[s]``;
incidence (s, k) has id ``s * R + k``. Each link keeps the slots of its flows in a
row of ``LinkState.flows`` (``deg`` of them; removal swaps the last one in,
``SlotBook.i_pos`` says where each incidence sits), so walking a link's flows reads
one contiguous row. Flows of one hop of a collective form a list per hop
(``HopState.head``, ``SlotBook.hnext``/``hprev``) whose oldest step sets their weights.
Starting or finishing a flow costs nothing per other flow; it marks what the next
rate update must look at: new flows, flows whose hop's oldest step moved (their
weights change), links whose load changed.
"""

from __future__ import annotations

import numpy as np

from mccl.jitcache import cached_njit
from mccl.sim import flowstate
from mccl.sim.finishheap import due, next_finish, rebuild_finish_heap
from mccl.sim.flowstate import FinishHeap, FlowState, HopState, LinkState, Rows, Scratch, SlotBook, WorkList
from mccl.sim.maxmin import recompute

__all__ = ["FinishHeap", "FlowState", "HopState", "LinkState", "Rows", "Scratch", "SlotBook", "WorkList", "add_flows",
           "due", "next_finish", "rebuild_finish_heap", "recompute", "relink", "remove_flows"]

_jit = cached_njit((flowstate,), nogil=True)
_BIG = np.iinfo(np.int64).max


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
