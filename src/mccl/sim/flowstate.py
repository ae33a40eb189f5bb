"""The flow table's named state: the groups of arrays its compiled kernels take
(:mod:`mccl.sim.kernels` membership, :mod:`mccl.sim.maxmin` rates, :mod:`mccl.sim.finishheap`).

Named state. The table is a few groups of arrays, each a ``NamedTuple`` defined
here: :class:`FlowState` (per slot, what the rates need), :class:`SlotBook` (per
slot, the rest), :class:`LinkState` (per link), :class:`HopState` (per hop of a
collective), two :class:`WorkList` s (what the next rate update must look at),
:class:`FinishHeap` and :class:`Scratch` (the solver's working arrays). Counters are
named one-element arrays of their group (``book.n_free``, ``dirty.count``,
``heap.size``...), so a kernel moves them in place; kernels take the groups, plus
the few values of the call.

Groups travel as plain tuples. numba types a plain tuple of arrays in C but a
``NamedTuple`` in Python (~0.4 µs per array, a few kernel calls per event batch), so
:class:`mccl.sim.flows.FlowTable` passes each group as a plain tuple (kept when the
group is assigned) and each entry point names the groups again (``f =
FlowState(*flows)``: free once compiled). It then takes the arrays it uses out of
them by name, once, into locals (``f_rate = f.rate``) that the loops and helpers
use: reading arrays from the groups inside the loops (or passing whole groups to
helpers) made the kernels 20-80% slower — numba's reference counting of tuples.

A kernel compiled against these classes is cached by numba in its own file's cache; every kernel
module names this one as a dependency (:func:`mccl.jitcache.cached_njit`), so a change here
recompiles them all.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["FinishHeap", "FlowState", "HopState", "LinkState", "Rows", "Scratch", "SlotBook", "WorkList"]


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
