"""Incremental exact max-min over classes (hops) with multiplicities: the grouped engine's rate solver.

See :mod:`mccl.sim.classkernels` for the model (every flow of a class has the class's rate; a class
weighs as many flows as it carries) and :mod:`mccl.sim.maxmin` for the method (Bertsekas &
Gallager §6.5.2): re-solve the set S of classes whose multiplicity changed and those
bottlenecked on a link whose load changed, by exact progressive filling on what the other classes
leave; then check feasibility and the bottleneck condition on every link whose rates changed and
add violators to S; repeat (S becomes every live class once it holds a quarter of them).

Live classes. Only classes that carry flows take part; :func:`activate` / :func:`deactivate`
keep a list of them and, per link, the live classes on it (at 512 GPUs most of a link's hops
are idle at any time, and the solver walks a link's classes several times per round).
"""

from __future__ import annotations

import numpy as np

from mccl.jitcache import cached_njit
from mccl.sim import classheaps, indexheap
from mccl.sim.classheaps import mark as _mark
from mccl.sim.indexheap import heap_pop as _heap_pop
from mccl.sim.indexheap import heap_set as _heap_set

__all__ = ["activate", "deactivate", "recompute"]

_jit = cached_njit((classheaps, indexheap), nogil=True)  # helpers in other files: mccl.jitcache
_inline = cached_njit((classheaps, indexheap), nogil=True, inline="always")  # see mccl.sim.classkernels: why inlined
_WHOLE = 0.25  # once S holds this share of the live classes, S becomes all of them
_SCAN_LINKS = 48  # up to this many links, find the lowest share by a scan instead of a heap


# -- live classes: a list of them, and per link the live classes on it -----------------------------
@_inline
def activate(k, c_lo, c_links, l_lo, a_cnt, a_cls, a_back, a_pos, live, live_pos, n_live):
    """Class k got its first flow: append it to every link's live list and to ``live``; return the live count.

    A link's live classes sit in ``a_cls[l_lo[link] : l_lo[link] + a_cnt[link]]`` (the link's segment of
    the static CSR), so the solver walks only classes that carry flows (at 512 GPUs most of a link's
    hops are idle at any time). ``a_back``: the entry of ``c_links`` each slot stands for; ``a_pos``:
    the slot of each ``c_links`` entry (removal by swapping with the segment's last slot)."""
    for p in range(c_lo[k], c_lo[k + 1]):
        link = c_links[p]
        slot = l_lo[link] + a_cnt[link]
        a_cls[slot] = k
        a_back[slot] = p
        a_pos[p] = slot
        a_cnt[link] += 1
    live[n_live] = k
    live_pos[k] = n_live
    return n_live + 1


@_inline
def deactivate(k, c_lo, c_links, l_lo, a_cnt, a_cls, a_back, a_pos, live, live_pos, n_live):
    """Class k lost its last flow: the reverse of :func:`activate`; return the live count."""
    for p in range(c_lo[k], c_lo[k + 1]):
        link = c_links[p]
        slot = a_pos[p]
        last = l_lo[link] + a_cnt[link] - 1
        a_cls[slot] = a_cls[last]
        a_back[slot] = a_back[last]
        a_pos[a_back[slot]] = slot
        a_cnt[link] -= 1
    n_live -= 1
    at = live_pos[k]
    live[at] = live[n_live]
    live_pos[live[at]] = at
    return n_live


# -- max-min over classes ---------------------------------------------------------------------------
@_inline
def _share(resid, cnt, link):
    if cnt[link] <= 0:
        return np.inf
    return max(resid[link], 0.0) / cnt[link]


@_jit
def recompute(now, eps, cap, mult, rate, bneck, vserv, tserv, c_lo, c_links, l_lo, l_cls, load,
               dlist, n_dirty, dmark, clist, n_changed, cmark, live, n_live, a_cnt, a_cls, s_in, s_frozen, s_rate,
               s_bneck, members, touched, l_mark, resid, cnt, hp, hpos, hkey, need, checked, exact, rekey, n_rekey, rmark,
               counters):
    """Re-solve the rates after the marked changes; return the new length of the ``rekey`` list."""
    m = 0
    for j in range(n_dirty):
        k = dlist[j]
        dmark[k] = False
        if mult[k] > 0 and not s_in[k]:
            s_in[k] = True
            members[m] = k
            m += 1
    for j in range(n_changed):
        link = clist[j]
        cmark[link] = False
        for q in range(l_lo[link], l_lo[link] + a_cnt[link]):
            k = a_cls[q]
            if not s_in[k] and (bneck[k] == link or bneck[k] < 0):
                s_in[k] = True
                members[m] = k
                m += 1
    n_checked = 0
    nt = 0
    while True:
        counters[3] += 1
        nt = 0
        for j in range(m):
            k = members[j]
            s_frozen[k] = False
            for q in range(c_lo[k], c_lo[k + 1]):
                link = c_links[q]
                if not l_mark[link]:
                    l_mark[link] = True
                    touched[nt] = link
                    nt += 1
        use_heap = nt > _SCAN_LINKS
        counters[4] += m
        counters[5] += nt
        size = 0
        for j in range(nt):
            link = touched[j]
            r = cap[link] - load[link]
            c = 0
            for q in range(l_lo[link], l_lo[link] + a_cnt[link]):
                k = a_cls[q]
                if s_in[k]:
                    r += rate[k] * mult[k]
                    c += mult[k]
            resid[link] = r
            cnt[link] = c
            if use_heap:
                size = _heap_set(hp, hpos, hkey, link, _share(resid, cnt, link), size)
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
                        value = _share(resid, cnt, other)
                        if link < 0 or value < share:
                            share = value
                            link = other
                if link < 0:
                    break
            for q in range(l_lo[link], l_lo[link] + a_cnt[link]):
                k = a_cls[q]
                if not s_in[k] or s_frozen[k]:
                    continue
                s_frozen[k] = True
                s_rate[k] = share
                s_bneck[k] = link
                for p in range(c_lo[k], c_lo[k + 1]):
                    other = c_links[p]
                    resid[other] -= share * mult[k]
                    cnt[other] -= mult[k]
            if use_heap:
                for q in range(l_lo[link], l_lo[link] + a_cnt[link]):
                    k = a_cls[q]
                    if s_in[k] and s_bneck[k] == link and s_frozen[k]:
                        for p in range(c_lo[k], c_lo[k + 1]):
                            other = c_links[p]
                            if hpos[other] >= 0:
                                size = _heap_set(hp, hpos, hkey, other, _share(resid, cnt, other), size)
        for j in range(n_changed):
            need[clist[j]] = True
        for j in range(m):
            k = members[j]
            if s_bneck[k] >= 0:
                need[s_bneck[k]] = True
            if s_rate[k] != rate[k]:
                for q in range(c_lo[k], c_lo[k + 1]):
                    need[c_links[q]] = True
        grown = m
        n_checked = 0
        for j in range(nt + n_changed):
            link = touched[j] if j < nt else clist[j - nt]
            if not need[link]:
                continue
            need[link] = False
            total = 0.0
            top = 0.0
            low_s = np.inf
            top_kept = 0.0
            low_kept_b = np.inf
            for q in range(l_lo[link], l_lo[link] + a_cnt[link]):
                k = a_cls[q]
                if s_in[k]:
                    level = s_rate[k]
                    if s_bneck[k] == link and level < low_s:
                        low_s = level
                else:
                    level = rate[k]
                    if level > top_kept:
                        top_kept = level
                    if bneck[k] == link and level < low_kept_b:
                        low_kept_b = level
                total += level * mult[k]
                if level > top:
                    top = level
            checked[n_checked] = link
            exact[n_checked] = total
            n_checked += 1
            saturated = total >= cap[link] * (1.0 - eps)
            overloaded = total > cap[link] * (1.0 + eps)
            if not (overloaded or top_kept > low_s * (1.0 + eps)
                    or (low_kept_b < np.inf and (not saturated or low_kept_b < top * (1.0 - eps)))):
                continue
            for q in range(l_lo[link], l_lo[link] + a_cnt[link]):
                k = a_cls[q]
                if s_in[k]:
                    continue
                level = rate[k]
                bad = overloaded or level > low_s * (1.0 + eps)
                if bneck[k] == link and (not saturated or level < top * (1.0 - eps)):
                    bad = True
                if bad:
                    s_in[k] = True
                    members[grown] = k
                    grown += 1
        if grown == m:
            break
        m = grown
        if m > _WHOLE * n_live:
            for j in range(n_live):
                k = live[j]
                if not s_in[k]:
                    s_in[k] = True
                    members[m] = k
                    m += 1
        for j in range(nt):
            l_mark[touched[j]] = False
    for j in range(m):
        k = members[j]
        s_in[k] = False
        bneck[k] = s_bneck[k]
        new = s_rate[k]
        if new != rate[k]:
            vserv[k] += rate[k] * (now - tserv[k])
            tserv[k] = now
            for q in range(c_lo[k], c_lo[k + 1]):
                load[c_links[q]] += (new - rate[k]) * mult[k]
            rate[k] = new
            n_rekey = _mark(k, rmark, rekey, n_rekey)
    for j in range(n_checked):
        load[checked[j]] = exact[j]
    for j in range(nt):
        l_mark[touched[j]] = False
    return n_rekey
