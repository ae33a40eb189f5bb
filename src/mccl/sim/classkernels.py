"""Compiled (numba) event loop of the grouped engine (:mod:`mccl.sim.grouped`): one collective, equal streams.

Why grouped. Under the executor's model (``SimOptions.executor()``: equal weights) every
flow on one hop (sender, receiver, route) has the same links, so in the unique max-min
fair allocation it has the same rate as every other flow of that hop. The rates are
therefore a function of how many flows each hop carries: the max-min problem is solved
over hops ("classes", a few thousand at 512 GPUs) with multiplicities, not over flows
(millions). A slice that finishes and the next slice that starts on the same hop in one
batch leave the multiplicities, hence every rate, unchanged: no re-solve at all.

Virtual time. A class's flows all progress at the class rate, so each class keeps its
served bytes per flow ``V`` (``V += rate · dt``); a flow started at ``V0`` with ``b``
bytes finishes when ``V`` reaches its tag ``V0 + b``. Its flows sit on a per-class heap
of tags, the classes on an indexed heap of their next finish time: a rate change
re-keys one class, not its flows.

Rates: incremental exact max-min over classes weighted by their multiplicity
(:mod:`mccl.sim.classsolve`); heaps and work lists: :mod:`mccl.sim.classheaps`.

Events are handled in the order and with the batching of :mod:`mccl.sim.engine`:
flows whose last byte leaves by ``now + tolerance``, then arrivals by then, then every
free connection with a ready slice starts its first one (in queue order), then rates.
Slices are implicit: transfer t (a schedule transfer) moves slices 0..T-1 in order on
its connection; slice j of t is ready once slice j of every transfer t waits for has
arrived.

Inlined helpers. Every helper of the loop is compiled into it (``inline="always"``): a call
to a compiled function costs an atomic reference count up and down for every array it takes
(``NRT_incref`` / ``NRT_decref``), which perf put at ~45 % of the loop's time at 128 GPUs
on the loaded box (the 128-GPU ring at 1 GiB: 10.8 → 6.4 s CPU at load ~25; 5.6–6.3 → 4.7–5.3 s at
load ~5, where atomics are cheaper; BENCHMARKS.md, 2026-12-01 fourth session). The helpers live in :mod:`mccl.sim.classheaps`,
:mod:`mccl.sim.classsolve` and :mod:`mccl.sim.indexheap`, but numba's file cache keys
:func:`run_grouped` on THIS file only, so this file compiles with :func:`mccl.jitcache.cached_njit`
naming them: editing a helper drops the loop's cache and it compiles afresh once.
"""

from __future__ import annotations

import numpy as np

from mccl.jitcache import cached_njit
from mccl.sim import classheaps, classsolve, indexheap
from mccl.sim.classheaps import arr_pop as _arr_pop
from mccl.sim.classheaps import arr_push as _arr_push
from mccl.sim.classheaps import mark as _mark
from mccl.sim.classheaps import tag_pop as _tag_pop
from mccl.sim.classheaps import tag_push as _tag_push
from mccl.sim.classsolve import activate as _activate
from mccl.sim.classsolve import deactivate as _deactivate
from mccl.sim.classsolve import recompute as _recompute
from mccl.sim.indexheap import heap_set as _heap_set

__all__ = ["run_grouped"]

_HELPERS = (classheaps, classsolve, indexheap)  # a change there recompiles run_grouped (mccl.jitcache)
_jit = cached_njit(_HELPERS, nogil=True)
_inline = cached_njit(_HELPERS, nogil=True, inline="always")  # module docstring: inlined helpers
_LAUNCH, _CHUNK, _QUEUE = 0, 1, 2  # mccl.sim.results.Cause
# run_grouped's status codes
OK, STALLED, TOO_LONG = 0, 1, 2


# -- the event loop -----------------------------------------------------------------------------
@_inline
def _start_slice(t, now, c, cls_of, size, nxt, busy, mult, rate, vserv, tserv, c_lo, c_links, load, f_tag, f_item,
                 f_base, f_size):
    """Start slice ``nxt[t]`` of transfer t on its (free) connection c: one more flow of t's class."""
    k = cls_of[t]
    nxt[t] += 1
    busy[c] = True
    vserv[k] += rate[k] * (now - tserv[k])
    tserv[k] = now
    _tag_push(f_tag, f_item, f_base[k], f_size[k], vserv[k] + size[t], t)
    f_size[k] += 1
    mult[k] += 1
    for q in range(c_lo[k], c_lo[k + 1]):
        load[c_links[q]] += rate[k]


@_inline
def _next_finish(k, mult, rate, vserv, tserv, f_tag, f_base):
    if mult[k] == 0 or rate[k] <= 0.0:
        return np.inf
    return tserv[k] + (f_tag[f_base[k]] - vserv[k]) / rate[k]


@_jit
def run_grouped(n_slices, conn_lo, conn_of, cls_of, size, lat, dep_lo, dep_tg, in_lo, in_src, c_lo, c_links, l_lo,
                l_cls, f_base, cap, tol_rel, max_time, eps, keep_chain, t_ready, t_start, t_sent, t_arrive, last_dep,
                enabler, cause, t_bneck, counters):
    """Run one collective launched at time 0 to its last arrival; return (status, end time).

    Transfers are in connection order (``conn_lo`` CSR); slice j of transfer t is ``t * n_slices + j``
    in the chain arrays (written only when ``keep_chain``). ``counters``: batches, re-solves, flows, solver rounds, classes and links solved."""
    n = len(cls_of)
    n_conn = len(conn_lo) - 1
    n_classes = len(c_lo) - 1
    n_links = len(cap)
    total = n * n_slices
    # per transfer
    nxt = np.zeros(n, dtype=np.int64)  # slices started
    arrived = np.zeros(n, dtype=np.int64)  # slices arrived
    avail = np.zeros(n, dtype=np.int64)  # slices ready (held by the sender)
    # per connection
    busy = np.zeros(n_conn, dtype=np.bool_)
    scan = conn_lo[:-1].copy()  # first transfer with slices left to start
    last_sent = np.full(n_conn, -1, dtype=np.int64)
    cand = np.zeros(n_conn, dtype=np.int64)
    cand_mark = np.zeros(n_conn, dtype=np.bool_)
    n_cand = 0
    # per class
    mult = np.zeros(n_classes, dtype=np.int64)
    rate = np.zeros(n_classes)
    bneck = np.full(n_classes, -1, dtype=np.int64)
    vserv = np.zeros(n_classes)
    tserv = np.zeros(n_classes)
    f_size = np.zeros(n_classes, dtype=np.int64)
    f_tag = np.zeros(n)
    f_item = np.zeros(n, dtype=np.int64)
    c_hp = np.arange(n_classes)
    c_hpos = np.arange(n_classes)
    c_hkey = np.full(n_classes, np.inf)
    live = np.zeros(n_classes, dtype=np.int64)
    live_pos = np.zeros(n_classes, dtype=np.int64)
    a_cnt = np.zeros(n_links, dtype=np.int64)
    a_cls = np.zeros(len(l_cls), dtype=np.int64)
    a_back = np.zeros(len(l_cls), dtype=np.int64)
    a_pos = np.zeros(len(c_links), dtype=np.int64)
    # rates: work lists and scratch
    load = np.zeros(n_links)
    dlist = np.zeros(n_classes, dtype=np.int64)
    dmark = np.zeros(n_classes, dtype=np.bool_)
    clist = np.zeros(n_links, dtype=np.int64)
    cmark = np.zeros(n_links, dtype=np.bool_)
    rekey = np.zeros(n_classes, dtype=np.int64)
    rmark = np.zeros(n_classes, dtype=np.bool_)
    s_in = np.zeros(n_classes, dtype=np.bool_)
    s_frozen = np.zeros(n_classes, dtype=np.bool_)
    s_rate = np.zeros(n_classes)
    s_bneck = np.full(n_classes, -1, dtype=np.int64)
    members = np.zeros(n_classes, dtype=np.int64)
    touched = np.zeros(n_links, dtype=np.int64)
    l_mark = np.zeros(n_links, dtype=np.bool_)
    resid = np.zeros(n_links)
    cnt = np.zeros(n_links, dtype=np.int64)
    hp = np.zeros(n_links, dtype=np.int64)
    hpos = np.full(n_links, -1, dtype=np.int64)
    hkey = np.zeros(n_links)
    need = np.zeros(n_links, dtype=np.bool_)
    checked = np.zeros(n_links, dtype=np.int64)
    exact = np.zeros(n_links)
    # arrivals
    # every slice is pushed once, so ``total`` never overflows; the heap is not grown in the loop because
    # an array variable re-bound in a loop costs reference counting on every pass (perf: ~25 % of the time)
    a_cap = max(1, total)
    a_time = np.zeros(a_cap)
    a_seq = np.zeros(a_cap, dtype=np.int64)
    a_id = np.zeros(a_cap, dtype=np.int64)
    a_size = 0
    seq = 0
    n_live = 0
    n_arrived = 0
    # launch: transfers that wait for nothing hold every slice
    for t in range(n):
        if in_lo[t + 1] == in_lo[t]:
            avail[t] = n_slices
            if keep_chain:
                for j in range(n_slices):
                    t_ready[t * n_slices + j] = 0.0
            n_cand = _mark(conn_of[t], cand_mark, cand, n_cand)
    now = 0.0
    tol = tol_rel * 1e-6
    n_dirty = 0
    n_changed = 0
    n_rekey = 0
    while True:
        # -- start: every free candidate connection starts its first ready slice ------------------
        for j in range(n_cand):
            c = cand[j]
            cand_mark[c] = False
            if busy[c]:
                continue
            t = scan[c]
            end = conn_lo[c + 1]
            while t < end and nxt[t] == n_slices:
                t += 1
            scan[c] = t
            while t < end and nxt[t] >= avail[t]:
                t += 1
            if t == end:
                continue
            sid = t * n_slices + nxt[t]
            if keep_chain:
                t_start[sid] = now
                if t_ready[sid] < now - tol:
                    enabler[sid] = last_sent[c]
                    cause[sid] = _QUEUE
                else:
                    enabler[sid] = last_dep[sid]
                    cause[sid] = _CHUNK if last_dep[sid] >= 0 else _LAUNCH
            k = cls_of[t]
            if mult[k] == 0:
                n_live = _activate(k, c_lo, c_links, l_lo, a_cnt, a_cls, a_back, a_pos, live, live_pos, n_live)
            _start_slice(t, now, c, cls_of, size, nxt, busy, mult, rate, vserv, tserv, c_lo, c_links, load, f_tag,
                         f_item, f_base, f_size)
            counters[2] += 1
            n_dirty = _mark(k, dmark, dlist, n_dirty)
            for q in range(c_lo[k], c_lo[k + 1]):
                n_changed = _mark(c_links[q], cmark, clist, n_changed)
            n_rekey = _mark(k, rmark, rekey, n_rekey)
        n_cand = 0
        # -- rates ------------------------------------------------------------------------------------
        if n_dirty or n_changed:
            n_rekey = _recompute(now, eps, cap, mult, rate, bneck, vserv, tserv, c_lo, c_links, l_lo, l_cls, load,
                                 dlist, n_dirty, dmark, clist, n_changed, cmark, live, n_live, a_cnt, a_cls, s_in, s_frozen, s_rate,
                                 s_bneck, members, touched, l_mark, resid, cnt, hp, hpos, hkey, need, checked, exact,
                                 rekey, n_rekey, rmark, counters)
            counters[1] += 1
            n_dirty = 0
            n_changed = 0
        for j in range(n_rekey):
            k = rekey[j]
            rmark[k] = False
            _heap_set(c_hp, c_hpos, c_hkey, k, _next_finish(k, mult, rate, vserv, tserv, f_tag, f_base), n_classes)
        n_rekey = 0
        if n_arrived == total:
            return OK, now
        # -- the next time --------------------------------------------------------------------------
        upcoming = c_hkey[c_hp[0]]
        if a_size and a_time[0] < upcoming:
            upcoming = a_time[0]
        if upcoming == np.inf:
            return STALLED, now
        if upcoming > max_time:
            return TOO_LONG, now
        if upcoming > now:
            now = upcoming
        tol = tol_rel * max(now, 1e-6)
        limit = now + tol
        counters[0] += 1
        # -- flows whose last byte leaves by the limit ------------------------------------------------
        while c_hkey[c_hp[0]] <= limit:
            k = c_hp[0]
            base = f_base[k]
            while f_size[k] > 0 and tserv[k] + (f_tag[base] - vserv[k]) / rate[k] <= limit:
                t = f_item[base]
                _tag_pop(f_tag, f_item, base, f_size[k])
                f_size[k] -= 1
                c = conn_of[t]
                busy[c] = False
                sid = t * n_slices + nxt[t] - 1
                last_sent[c] = sid
                if keep_chain:
                    t_sent[sid] = now
                    t_bneck[sid] = bneck[k]
                seq += 1
                _arr_push(a_time, a_seq, a_id, a_size, now + lat[t], seq, sid)
                a_size += 1
                n_cand = _mark(c, cand_mark, cand, n_cand)
                vserv[k] += rate[k] * (now - tserv[k])
                tserv[k] = now
                mult[k] -= 1
                for q in range(c_lo[k], c_lo[k + 1]):
                    load[c_links[q]] -= rate[k]
                    n_changed = _mark(c_links[q], cmark, clist, n_changed)
                if mult[k] == 0:
                    rate[k] = 0.0
                    bneck[k] = -1
                    n_live = _deactivate(k, c_lo, c_links, l_lo, a_cnt, a_cls, a_back, a_pos, live, live_pos,
                                         n_live)
                else:
                    n_dirty = _mark(k, dmark, dlist, n_dirty)
            _heap_set(c_hp, c_hpos, c_hkey, k, _next_finish(k, mult, rate, vserv, tserv, f_tag, f_base), n_classes)
        # -- arrivals by the limit --------------------------------------------------------------------
        while a_size and a_time[0] <= limit:
            sid = a_id[0]
            _arr_pop(a_time, a_seq, a_id, a_size)
            a_size -= 1
            t = sid // n_slices
            j = sid - t * n_slices
            arrived[t] = j + 1
            n_arrived += 1
            if keep_chain:
                t_arrive[sid] = now
            for q in range(dep_lo[t], dep_lo[t + 1]):
                d = dep_tg[q]
                low = n_slices
                for p in range(in_lo[d], in_lo[d + 1]):
                    if arrived[in_src[p]] < low:
                        low = arrived[in_src[p]]
                if low > avail[d]:
                    if keep_chain:
                        for r in range(avail[d], low):
                            t_ready[d * n_slices + r] = now
                            last_dep[d * n_slices + r] = sid
                    avail[d] = low
                    n_cand = _mark(conn_of[d], cand_mark, cand, n_cand)
