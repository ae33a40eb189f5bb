"""Compiled (numba) kernels of the flow table: incremental max-min fair rates, finish-time heap.

Why compiled. An asymmetric schedule (tree packing on 128 GPUs: 146 k transfers)
finishes almost every transfer at its own time, so the engine handles ~140 k
event batches, each changing a few flows among ~10 k active ones. Re-solving all
of them with vectorized progressive filling (:mod:`mccl.sim.fairshare`) cost
~1 ms a batch; these kernels re-solve only the flows an event can reach, in
compiled loops over per-link lists of flows.

Incremental exact max-min (weighted; Bertsekas & Gallager, *Data Networks* §6.5.2).
An allocation is *the* max-min fair one iff it is feasible and every flow has a
bottleneck: a saturated link on its route where its level (rate / weight) is the
largest. After an event the kernel

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

The flow table's slots and per-link rows are kept by :mod:`mccl.sim.tablekernels`.
Predicted finishes sit on a heap with per-slot versions (``f_ver``): a rate change or a
removal moves the version on, so older entries are skipped when they surface.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["due", "next_finish", "rebuild_finish_heap", "recompute"]

_jit = numba.njit(cache=True, nogil=True)
# No kernel calls a jitted function of another module: numba's file cache does not notice when a
# callee in another file changes, so such a call could run stale code. Small helpers are repeated
# per module (e.g. the "append to a work list once" helpers) rather than shared.
_MAX_GAP = 4  # weights below step_priority**-4 make no difference
_WHOLE = 0.25  # once S holds this share of the live flows, S becomes all of them (no more rounds)
_SCAN_LINKS = 48  # up to this many links, find the lowest share by a scan instead of a heap


@_jit
def _finish_push(key, slot, ver, q_key, q_slot, q_ver, meta):
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
def _finish_pop(q_key, q_slot, q_ver, meta):
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
        _finish_pop(q_key, q_slot, q_ver, meta)
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
        _finish_pop(q_key, q_slot, q_ver, meta)
    return count


@_jit
def rebuild_finish_heap(f_alive, f_finish, f_ver, q_key, q_slot, q_ver, meta):
    """Drop every stale entry: one entry per live flow with a finite predicted finish."""
    meta[6] = 0
    for s in range(len(f_alive)):
        if f_alive[s] and f_finish[s] < np.inf:
            f_ver[s] += 1
            _finish_push(f_finish[s], s, f_ver[s], q_key, q_slot, q_ver, meta)

@_jit
def _share(resid, cnt_lev, link, wtab):
    total = 0.0
    for d in range(_MAX_GAP + 1):
        total += cnt_lev[link, d] * wtab[d]
    if total <= 0.0:
        return np.inf
    return max(resid[link], 0.0) / total


@_jit
def _sift_up(hp, hpos, hkey, at):
    link = hp[at]
    key = hkey[link]
    while at > 0:
        parent = (at - 1) >> 1
        up = hp[parent]
        if hkey[up] <= key:
            break
        hp[at] = up
        hpos[up] = at
        at = parent
    hp[at] = link
    hpos[link] = at


@_jit
def _sift_down(hp, hpos, hkey, at, size):
    link = hp[at]
    key = hkey[link]
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
    hp[at] = link
    hpos[link] = at


@_jit
def _heap_set(hp, hpos, hkey, link, key, size):
    """Insert ``link`` with ``key`` or move it to ``key``; return the new size (an indexed binary heap)."""
    at = hpos[link]
    if at < 0:
        hkey[link] = key
        hp[size] = link
        hpos[link] = size
        _sift_up(hp, hpos, hkey, size)
        return size + 1
    old = hkey[link]
    hkey[link] = key
    if key < old:
        _sift_up(hp, hpos, hkey, at)
    elif key > old:
        _sift_down(hp, hpos, hkey, at, size)
    return size


@_jit
def _heap_pop(hp, hpos, hkey, size):
    """Remove the link of lowest key (``hp[0]``); return the new size."""
    top = hp[0]
    hpos[top] = -1
    size -= 1
    if size > 0:
        hp[0] = hp[size]
        hpos[hp[0]] = 0
        _sift_down(hp, hpos, hkey, 0, size)
    return size


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
def recompute(capacity, now, wtab, eps, big_r, f_alive, f_hop, f_step, f_len, f_route, f_remaining, f_t0, f_rate,
              f_finish, f_bneck, f_wlev, f_dirty, l_flows, l_deg, h_oldest, link_rate, dlist, l_changed, clist, meta,
              s_in, s_frozen, s_rate, s_bneck, s_wold, l_mark, resid, cnt, cnt_lev, hp, hpos, hkey, f_ver, q_key, q_slot,
              q_ver):
    """Incremental exact max-min rates after the marked changes (see the module docstring).

    Returns the number of sub-solves (1 when the first set S was enough)."""
    n_dirty = meta[1]
    n_changed = meta[2]
    if n_dirty == 0 and n_changed == 0:
        return 0
    n_links = len(l_deg)
    members = np.empty(meta[3], dtype=np.int64)
    m = 0
    for j in range(n_dirty):
        s = dlist[j]
        f_dirty[s] = False
        if f_alive[s] and not s_in[s]:
            m = _join(s, members, m, s_in, s_wold, f_wlev, f_hop, f_step, h_oldest)
    changed = clist[:n_changed].copy()
    for link in changed:
        l_changed[link] = False
        for q in range(l_deg[link]):
            s = l_flows[link, q]
            if not s_in[s] and (f_bneck[s] == link or f_bneck[s] < 0):
                m = _join(s, members, m, s_in, s_wold, f_wlev, f_hop, f_step, h_oldest)
    meta[1] = 0
    meta[2] = 0
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
        for link in changed:
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
            link = touched[j] if j < nt else changed[j - nt]
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
        if m > _WHOLE * meta[3]:  # the change spreads over much of the fabric: solve every flow at once
            for s in range(len(f_alive)):
                if f_alive[s] and not s_in[s]:
                    m = _join(s, members, m, s_in, s_wold, f_wlev, f_hop, f_step, h_oldest)
        for j in range(nt):
            l_mark[touched[j]] = False
    meta[4] += m
    meta[5] += nt
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
                _finish_push(f_finish[s], s, f_ver[s], q_key, q_slot, q_ver, meta)
    for j in range(n_checked):
        link_rate[checked[j]] = exact[j]  # no rounding drift accumulates on the links checked
    for j in range(nt):
        l_mark[touched[j]] = False
    return solves
