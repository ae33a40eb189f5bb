"""The engine's table of active flows, with max-min rates re-solved only where an event reaches.

Flows live in slots of preallocated arrays (struct of arrays, grown by doubling), so
starting or finishing flows costs nothing per other flow; compiled kernels keep
per-link rows and per-hop lists of flows and re-solve, after each batch of events,
only the flows whose rates can change — the incremental exact max-min of
:mod:`mccl.sim.kernels` (:mod:`mccl.sim.maxmin`), which also re-exports the named groups of arrays
the table is made of (:class:`~mccl.sim.flowstate.FlowState`, ``LinkState``, ...). Free slots hold
``run == -2``, ``rate == 0``, ``finish == inf`` and ``path == -1``, so masks over all
slots select live flows.

Weights (``SimOptions.step_priority``). On one hop (sender, receiver, route) of a
collective a flow weighs ``step_priority ** -d``, d (at most 4) the steps it is
ahead of the hop's oldest flow in flight; background flows (``hop < 0``) weigh 1.
1 weighs every flow alike, as the executor's streams share links
(``SimOptions.executor``, :mod:`mccl.sim.compiled`).

Remaining bytes are stored as of the flow's last rate change (``t0``), with the
predicted finish time, so advancing the clock costs nothing per flow. Predicted
finishes also go on a heap (with a per-slot version that a rate change or removal
moves on, so older entries are skipped): the next finish and the flows due are
found without scanning every slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mccl.sim import kernels
from mccl.sim.kernels import FinishHeap, FlowState, HopState, LinkState, Rows, Scratch, SlotBook, WorkList

__all__ = ["FlowTable"]

_EPS = 1e-11  # relative tolerance of the bottleneck check (mccl.sim.kernels)
_MIN_SLOTS = 64
_MIN_ROUTE = 8
_MIN_DEGREE = 16
# Per-slot arrays: dtype, and the value of a free slot (kept when the table grows).
_FLOW_FIELDS = {
    "alive": (bool, False), "hop": (np.int64, -1), "step": (np.int64, 0), "length": (np.int64, 0),
    "remaining": (float, 0.0), "t0": (float, 0.0), "rate": (float, 0.0), "finish": (float, np.inf),
    "bottleneck": (np.int64, -1), "wlev": (np.int64, 0), "ver": (np.int64, 0),
}
_BOOK_FIELDS = {"run": (np.int64, -2), "transfer": (np.int64, 0), "path": (np.int64, -1), "hnext": (np.int64, -1),
                "hprev": (np.int64, -1)}
_SCRATCH_FIELDS = {"s_in": (bool, False), "s_frozen": (bool, False), "s_rate": (float, 0.0),
                   "s_bneck": (np.int64, -1), "s_wold": (np.int64, 0)}


def _counter() -> np.ndarray:
    return np.zeros(1, dtype=np.int64)


# The groups of a table (mccl.sim.kernels), and the arrays of each that the engine and tests read by a
# name of the table (``table.rate`` is ``table.flows.rate``).
_GROUPS: dict[str, dict[str, str]] = {
    "flows": {name: name for name in ("alive", "hop", "step", "length", "route", "remaining", "t0", "rate",
                                      "bottleneck")},
    "book": {"run": "run", "transfer": "transfer", "path": "path"},
    "links": {"link_rate": "rate"},
    "hops": {"h_oldest": "oldest"},
    "dirty": {}, "changed": {}, "heap": {}, "scratch": {},
}


class FlowTable:
    """Active flows by slot: run slot (-1: greedy background, -2: free), transfer or background
    index, route, step, hop, bytes left at ``t0``, rate (bytes/s), predicted finish, bottleneck.

    The state is the named groups of :mod:`mccl.sim.kernels`: ``flows`` (FlowState), ``book``
    (SlotBook), ``links``, ``hops``, ``dirty`` (flows to re-solve), ``changed`` (links), ``heap``
    and ``scratch``. A group is replaced, not resized, when it grows; assigning one also keeps it
    as a plain tuple in ``plain``, the form the kernels take (see that module: numba types those in
    C; converting at every call cost ~0.6 µs a group, ~20% of a small event batch), and the arrays
    of it read by a name of the table (``_GROUPS``), so neither can be left stale."""

    flows: FlowState
    book: SlotBook
    links: LinkState
    hops: HopState
    dirty: WorkList
    changed: WorkList
    heap: FinishHeap
    scratch: Scratch
    alive: np.ndarray  # the aliases of _GROUPS
    run: np.ndarray
    transfer: np.ndarray
    path: np.ndarray
    hop: np.ndarray
    step: np.ndarray
    length: np.ndarray
    route: np.ndarray
    remaining: np.ndarray
    t0: np.ndarray
    rate: np.ndarray
    bottleneck: np.ndarray
    link_rate: np.ndarray
    h_oldest: np.ndarray

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        aliases = _GROUPS.get(name)
        if aliases is not None:
            self.plain[name] = tuple(value)
            for alias, field in aliases.items():
                super().__setattr__(alias, getattr(value, field))

    def __init__(self, n_links: int, step_priority: float) -> None:
        self.plain: dict[str, tuple] = {}
        self.n_links = n_links
        self.wtab = float(step_priority) ** -np.arange(5, dtype=float)
        self.solves = self.rounds = 0
        self.big_r = _MIN_ROUTE
        none = np.zeros(0, dtype=np.int64)
        # Slot-sized arrays start empty; _allocate grows them to _MIN_SLOTS.
        self.flows = FlowState(**{name: np.zeros(0, dtype=dtype) for name, (dtype, _) in _FLOW_FIELDS.items()},
                               route=np.zeros((0, self.big_r), dtype=np.int64), n_live=_counter())
        self.book = SlotBook(**{name: np.zeros(0, dtype=dtype) for name, (dtype, _) in _BOOK_FIELDS.items()},
                             i_pos=none, free=none, n_free=_counter())
        self.links = LinkState(rate=np.zeros(n_links), deg=np.zeros(n_links, dtype=np.int64),
                               flows=np.zeros((n_links, _MIN_DEGREE), dtype=np.int64),
                               inc=np.zeros((n_links, _MIN_DEGREE), dtype=np.int64))
        self.hops = HopState(head=none, oldest=none)
        self.dirty = WorkList(np.zeros(0, dtype=bool), none, _counter())
        self.changed = WorkList(np.zeros(n_links, dtype=bool), np.zeros(n_links, dtype=np.int64), _counter())
        self.heap = FinishHeap(np.zeros(_MIN_SLOTS), np.zeros(_MIN_SLOTS, dtype=np.int64),
                               np.zeros(_MIN_SLOTS, dtype=np.int64), _counter())
        self.scratch = Scratch(
            **{name: np.zeros(0, dtype=dtype) for name, (dtype, _) in _SCRATCH_FIELDS.items()},
            l_mark=np.zeros(n_links, dtype=bool), resid=np.zeros(n_links), cnt=np.zeros(n_links, dtype=np.int64),
            cnt_lev=np.zeros((n_links, 5), dtype=np.int64), hp=np.zeros(n_links, dtype=np.int64),
            hpos=np.full(n_links, -1, dtype=np.int64), hkey=np.zeros(n_links), flows_solved=_counter(),
            links_solved=_counter())
        self._allocate(_MIN_SLOTS)

    def __len__(self) -> int:
        return int(self.flows.n_live[0])

    # -- storage -------------------------------------------------------------------------
    def _allocate(self, size: int) -> None:
        """(Re)allocate the slot arrays for ``size`` slots, keeping live flows in their slots."""
        old, book = self.flows, self.book
        n_old = len(old.alive)

        def grown(previous: np.ndarray, dtype: type, fill: object) -> np.ndarray:
            array = np.full(size, fill, dtype=dtype)
            array[:n_old] = previous
            return array

        route = np.zeros((size, self.big_r), dtype=np.int64)
        route[:n_old, :old.route.shape[1]] = old.route
        kept = int(book.n_free[0])
        stack = np.zeros(size, dtype=np.int64)
        stack[:kept] = book.free[:kept]
        stack[kept:kept + size - n_old] = np.arange(size - 1, n_old - 1, -1, dtype=np.int64)  # lowest on top
        book.n_free[0] = kept + size - n_old
        self.flows = old._replace(**{name: grown(getattr(old, name), *spec) for name, spec in _FLOW_FIELDS.items()},
                                  route=route)
        self.book = book._replace(**{name: grown(getattr(book, name), *spec) for name, spec in _BOOK_FIELDS.items()},
                                  i_pos=np.zeros(size * self.big_r, dtype=np.int64), free=stack)
        self.scratch = self.scratch._replace(
            **{name: grown(getattr(self.scratch, name), *spec) for name, spec in _SCRATCH_FIELDS.items()})
        self.dirty = self.dirty._replace(marked=grown(self.dirty.marked, bool, False),
                                         items=grown(self.dirty.items, np.int64, 0))
        self._due_out = np.zeros(size, dtype=np.int64)  # kernels.due writes the slots due here
        kernels.relink(self.plain["flows"], self.plain["book"], self.plain["links"])

    def _reserve(self, count: int, longest: int, top_hop: int) -> None:
        if longest > self.big_r:
            self.big_r = max(longest, 2 * self.big_r)
            self._allocate(len(self.run))
        free = int(self.book.n_free[0])
        if free < count:
            self._allocate(max(2 * len(self.run), len(self.run) + count - free))
        if top_hop >= len(self.hops.head):
            size = max(2 * len(self.hops.head), top_hop + 1, 64)
            head, oldest = self.hops
            self.hops = HopState(
                head=np.concatenate([head, np.full(size - len(head), -1, dtype=np.int64)]),
                oldest=np.concatenate([oldest, np.full(size - len(oldest), np.iinfo(np.int64).max, dtype=np.int64)]))

    def _widen(self) -> None:
        """Twice the room per link for flows (a link ran out of it)."""
        old = self.links.flows.shape[1]
        rows = {}
        for name in ("flows", "inc"):
            rows[name] = np.zeros((self.n_links, 2 * old), dtype=np.int64)
            rows[name][:, :old] = getattr(self.links, name)
        self.links = self.links._replace(**rows)

    # -- membership ------------------------------------------------------------------
    def add(self, run: int, transfers: np.ndarray, size: np.ndarray, lengths: np.ndarray, links: np.ndarray,
            paths: np.ndarray, steps: np.ndarray, hops: np.ndarray, now: float) -> np.ndarray:
        """Start flows (``hops``: global hop ids, < 0 for none); return their slots."""
        count = len(transfers)
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        rows = np.arange(count)
        hops = np.asarray(hops, dtype=np.int64)
        slots = self.add_rows(run, rows, offsets, np.asarray(links, dtype=np.int64), np.asarray(size, dtype=float),
                              1.0, np.asarray(steps, dtype=np.int64), hops, 0, int(hops.max(initial=-1)) + 1,
                              np.asarray(paths, dtype=np.int64), rows, int(lengths.max(initial=0)), now)
        self.transfer[slots] = transfers
        return slots

    def add_rows(self, run: int, rows: np.ndarray, route_offsets: np.ndarray, route_links: np.ndarray,
                 size_of: np.ndarray, size_scale: float, step_of: np.ndarray, hop_of: np.ndarray, hop_base: int,
                 n_hops: int, path_of: np.ndarray, path_by: np.ndarray, longest: int, now: float) -> np.ndarray:
        """Start one flow per row of per-row arrays (a compiled schedule's transfers): see
        :func:`mccl.sim.kernels.add_flows`; ``transfer`` is the row. Return their slots."""
        count = len(rows)
        self._reserve(count, longest, hop_base + n_hops - 1)
        slots = np.empty(count, dtype=np.int64)
        source = tuple(Rows(route_offsets, route_links, size_of, step_of, hop_of, path_by))
        done = 0
        plain = self.plain
        while True:
            done += kernels.add_flows(slots[done:], rows[done:], source, run, size_scale, hop_base, path_of, now,
                                      plain["flows"], plain["book"], plain["links"], plain["hops"], plain["dirty"],
                                      plain["changed"])
            if done == count:
                return slots
            self._widen()

    def due(self, limit: float) -> np.ndarray:
        """Slots of the flows whose last byte leaves by ``limit`` (each returned once), ascending."""
        count = kernels.due(limit, self._due_out, self.flows.ver, self.plain["heap"])
        return np.sort(self._due_out[:count])  # in slot order, as a scan would find them

    def next_finish(self) -> float:
        """The earliest predicted finish of a flow (inf if none)."""
        return float(kernels.next_finish(self.flows.ver, self.plain["heap"]))

    def _heap_room(self) -> None:
        """Room for one push per live flow; stale entries dropped once they outnumber live ones."""
        heap, live = self.heap, len(self)
        if heap.size[0] > 2 * live + 1024:
            kernels.rebuild_finish_heap(self.plain["flows"], self.plain["heap"])
        need = int(heap.size[0]) + live
        if need > len(heap.key):
            size = max(need, 2 * len(heap.key))
            arrays = {}
            for name in ("key", "slot", "ver"):
                old = getattr(heap, name)
                arrays[name] = np.zeros(size, dtype=old.dtype)
                arrays[name][:len(old)] = old
            self.heap = heap._replace(**arrays)

    def remove(self, slots: np.ndarray) -> None:
        """Drop the flows in ``slots``; the rates around them are re-solved at the next recompute."""
        plain = self.plain
        kernels.remove_flows(np.asarray(slots, dtype=np.int64), plain["flows"], plain["book"], plain["links"],
                             plain["hops"], plain["dirty"], plain["changed"])

    def touch_links(self, links: np.ndarray | tuple[int, ...]) -> None:
        """These links' capacities changed: re-solve the flows they bottleneck."""
        changed = self.changed
        for link in np.unique(np.asarray(links, dtype=np.int64)):
            if not changed.marked[link]:
                changed.marked[link] = True
                changed.items[changed.count[0]] = link
                changed.count[0] += 1

    # -- rates ---------------------------------------------------------------------------
    def recompute(self, capacity: np.ndarray, now: float) -> None:
        """Max-min rates after the changes since the last call, given the capacity left to flows."""
        if not (self.dirty.count[0] or self.changed.count[0]):
            return
        self._heap_room()
        plain = self.plain
        solves = kernels.recompute(np.ascontiguousarray(capacity, dtype=float), now, self.wtab, _EPS, plain["flows"],
                                   plain["links"], plain["hops"], plain["dirty"], plain["changed"], plain["heap"],
                                   plain["scratch"])
        self.solves += 1
        self.rounds += int(solves)

    def live(self) -> np.ndarray:
        """Slots of the live flows, ascending."""
        return np.flatnonzero(self.alive)
