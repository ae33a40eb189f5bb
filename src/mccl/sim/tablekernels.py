"""Compiled (numba) kernels that keep the flow table's membership: slots, link rows, hop lists.

Starting or finishing a flow must cost nothing per other flow (tree packing on 128
GPUs starts and finishes ~146 k flows among up to 12 k live ones), and the max-min
kernels (:mod:`mccl.sim.kernels`) must walk a link's flows cheaply. These kernels
put flows into free slots, take them out, and mark what the next rate update must
look at: the new flows, the flows whose hop's oldest step moved (their weights
change), and the links whose load changed.

Data layout. Flows live in slots; slot s has up to R route links in ``route[s]``;
incidence (s, k) has id ``s * R + k``. Each link keeps the slots of its flows in a
row of ``l_flows`` (``l_deg`` of them; removal swaps the last one in, ``i_pos``
says where each incidence sits), so walking a link's flows reads one contiguous
row. Flows of one hop of a collective form a list per hop (``h_head``, ``f_hnext``,
``f_hprev``) whose oldest step sets their weights.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["add_flows", "relink", "remove_flows"]

_jit = numba.njit(cache=True, nogil=True)
# No kernel calls a jitted function of another module: numba's file cache does not notice when a
# callee in another file changes, so such a call could run stale code. Small helpers are repeated
# per module (e.g. the "append to a work list once" helpers) rather than shared.
_BIG = np.iinfo(np.int64).max


@_jit
def _link_insert(s, big_r, f_len, f_route, i_pos, l_flows, l_inc, l_deg):
    for k in range(f_len[s]):
        link = f_route[s, k]
        q = l_deg[link]
        l_flows[link, q] = s
        l_inc[link, q] = s * big_r + k
        i_pos[s * big_r + k] = q
        l_deg[link] = q + 1


@_jit
def _link_unlink(s, big_r, f_len, f_route, i_pos, l_flows, l_inc, l_deg):
    for k in range(f_len[s]):
        link = f_route[s, k]
        q = i_pos[s * big_r + k]
        last = l_deg[link] - 1
        l_flows[link, q] = l_flows[link, last]
        l_inc[link, q] = l_inc[link, last]
        i_pos[l_inc[link, q]] = q
        l_deg[link] = last


@_jit
def relink(big_r, f_alive, f_len, f_route, i_pos, l_flows, l_inc, l_deg):
    """Rebuild every link's array of flows (after the slot arrays were reallocated)."""
    l_deg[:] = 0
    for s in range(len(f_alive)):
        if f_alive[s]:
            _link_insert(s, big_r, f_len, f_route, i_pos, l_flows, l_inc, l_deg)


@_jit
def _append_once(item, marked, items, counters, slot):
    """Append ``item`` to the work list ``items`` (its length in ``counters[slot]``) unless ``marked``."""
    if not marked[item]:
        marked[item] = True
        items[counters[slot]] = item
        counters[slot] += 1


@_jit
def _hop_refresh(h, h_head, h_oldest, f_hnext, f_step, f_dirty, dlist, meta):
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
            _append_once(s, f_dirty, dlist, meta, 1)
            s = f_hnext[s]


@_jit
def add_flows(slots, run, ids, route_offsets, route_links, size_of, size_scale, step_of, hop_of, hop_base, path_of,
              path_by, now,
              big_r, f_alive, f_run, f_transfer, f_hop, f_step, f_path, f_len, f_route, f_remaining, f_t0, f_rate,
              f_finish, f_bneck, f_wlev, f_hnext, f_hprev, f_dirty, i_pos, l_flows, l_inc, l_deg, h_head, h_oldest,
              free, dlist, l_changed, clist, meta):
    """Put flows into free slots (written to ``slots``); mark them and their hops for re-solving.

    Flow j is row ``t = ids[j]`` of per-row arrays: route ``route_links[route_offsets[t]:
    route_offsets[t+1]]``, ``size_of[t] * size_scale`` bytes, step ``step_of[t]``, hop
    ``hop_of[t] + hop_base`` (none when ``hop_of[t] < 0``), meter path ``path_of[path_by[t]]``
    (-1 when ``path_of`` is empty). Returns how many were added: it stops before a flow
    one of whose links has no room left in ``l_flows`` (the caller widens it and goes on)."""
    width = l_flows.shape[1]
    for j in range(len(ids)):
        t = ids[j]
        first = route_offsets[t]
        length = route_offsets[t + 1] - first
        for k in range(length):
            if l_deg[route_links[first + k]] + length > width:
                return j
        meta[0] -= 1
        s = free[meta[0]]
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
            _append_once(route_links[first + k], l_changed, clist, meta, 2)
        f_remaining[s] = size_of[t] * size_scale
        f_t0[s] = now
        f_rate[s] = 0.0
        f_finish[s] = np.inf
        f_bneck[s] = -1
        f_wlev[s] = 0
        meta[3] += 1
        _link_insert(s, big_r, f_len, f_route, i_pos, l_flows, l_inc, l_deg)
        _append_once(s, f_dirty, dlist, meta, 1)
        f_hprev[s] = -1
        f_hnext[s] = -1
        if h >= 0:
            head = h_head[h]
            f_hnext[s] = head
            if head >= 0:
                f_hprev[head] = s
            h_head[h] = s
            if f_step[s] < h_oldest[h]:
                _hop_refresh(h, h_head, h_oldest, f_hnext, f_step, f_dirty, dlist, meta)
    return len(ids)


@_jit
def remove_flows(slots, big_r, f_alive, f_run, f_ver, f_hop, f_step, f_path, f_len, f_route, f_rate, f_finish,
                 f_hnext, f_hprev, f_dirty, i_pos, l_flows, l_inc, l_deg, h_head, h_oldest, link_rate,
                 free, dlist, l_changed, clist, meta):
    """Free the slots; their links' loads changed, and their hops' oldest steps may have."""
    for j in range(len(slots)):
        s = slots[j]
        if not f_alive[s]:
            continue
        for k in range(f_len[s]):
            link = f_route[s, k]
            link_rate[link] -= f_rate[s]
            _append_once(link, l_changed, clist, meta, 2)
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
                _hop_refresh(h, h_head, h_oldest, f_hnext, f_step, f_dirty, dlist, meta)
        f_alive[s] = False
        f_ver[s] += 1  # its finish-heap entry is stale
        f_run[s] = -2
        f_path[s] = -1
        f_rate[s] = 0.0
        f_finish[s] = np.inf
        free[meta[0]] = s
        meta[0] += 1
        meta[3] -= 1
