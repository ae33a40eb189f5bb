"""The engine's table of active flows, with max-min rates re-solved only where an event reaches.

Flows live in slots of preallocated arrays (struct of arrays, grown by doubling), so
starting or finishing flows costs nothing per other flow; compiled kernels keep
per-link rows and per-hop lists of flows and re-solve, after each batch of events,
only the flows whose rates can change — the incremental exact max-min of
:mod:`mccl.sim.kernels`, which also defines the named groups of arrays the table is
made of (:class:`~mccl.sim.kernels.FlowState`, ``LinkState``, ...). Free slots hold
``run == -2``, ``rate == 0``, ``finish == inf`` and ``path == -1``, so masks over all
slots select live flows.

Weights (``SimOptions.step_priority``). On one hop (sender, receiver, route) of a
collective a flow weighs ``step_priority ** -d``, d (at most 4) the steps it is
ahead of the hop's oldest flow in flight, so the older block goes first as on a
FIFO connection; background flows (``hop < 0``) weigh 1.

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
from mccl.sim.kernels import FinishHeap, FlowState, HopState, LinkState, Rows, Scratch, WorkList

__all__ = ["FlowTable"]

_EPS = 1e-11  # relative tolerance of the bottleneck check (mccl.sim.kernels)
_MIN_SLOTS = 64
_MIN_ROUTE = 8
_MIN_DEGREE = 16
# Per-slot arrays: dtype, and the value of a free slot (kept when the table grows).
_FLOW_FIELDS = {
    "alive": (bool, False), "run": (np.int64, -2), "transfer": (np.int64, 0), "hop": (np.int64, -1),
    "step": (np.int64, 0), "path": (np.int64, -1), "length": (np.int64, 0), "remaining": (float, 0.0),
    "t0": (float, 0.0), "rate": (float, 0.0), "finish": (float, np.inf), "bottleneck": (np.int64, -1),
    "wlev": (np.int64, 0), "ver": (np.int64, 0), "hnext": (np.int64, -1), "hprev": (np.int64, -1),
}
_SCRATCH_FIELDS = {"s_in": (bool, False), "s_frozen": (bool, False), "s_rate": (float, 0.0),
                   "s_bneck": (np.int64, -1), "s_wold": (np.int64, 0)}


def _field(group: str, name: str) -> property:
    """Read access to one array of a group (``table.rate``: ``table.flows.rate``), for the engine and tests."""
    return property(lambda self: getattr(getattr(self, group), name), doc=f"``{group}.{name}``")


def _counter() -> np.ndarray:
    return np.zeros(1, dtype=np.int64)


class _Group:
    """A named group of the table (``table.flows``). Assigning one also keeps it as a plain tuple
    (``table.plain["flows"]``), the form the kernels take: converting at each call cost ~0.6 µs a
    group, ~20% of a small event batch, and a group replaced can never leave a stale tuple behind."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, table: FlowTable | None, owner: type | None = None) -> Any:
        return self if table is None else table.groups[self.name]

    def __set__(self, table: FlowTable, group: tuple) -> None:
        table.groups[self.name] = group
        table.plain[self.name] = tuple(group)


class FlowTable:
    """Active flows by slot: run slot (-1: greedy background, -2: free), transfer or background
    index, route, step, hop, bytes left at ``t0``, rate (bytes/s), predicted finish, bottleneck.

    The state is the named groups of :mod:`mccl.sim.kernels` (``flows``, ``links``, ``hops``,
    ``dirty``, ``changed``, ``heap``, ``scratch``); a group is replaced, not resized, when it
    grows, and goes to the kernels as a plain tuple (see that module: numba types those in C)."""

    # FlowState, LinkState, HopState, WorkList (flows to re-solve), WorkList (links), FinishHeap, Scratch
    flows, links, hops, dirty, changed, heap, scratch = (_Group() for _ in range(7))
    alive = _field("flows", "alive")
    run = _field("flows", "run")
    transfer = _field("flows", "transfer")
    path = _field("flows", "path")
    hop = _field("flows", "hop")
    step = _field("flows", "step")
    length = _field("flows", "length")
    route = _field("flows", "route")
    remaining = _field("flows", "remaining")
    t0 = _field("flows", "t0")
    rate = _field("flows", "rate")
    bottleneck = _field("flows", "bottleneck")
    link_rate = _field("links", "rate")
    h_oldest = _field("hops", "oldest")

    def __init__(self, n_links: int, step_priority: float) -> None:
        self.groups: dict[str, tuple] = {}
        self.plain: dict[str, tuple] = {}
        self.n_links = n_links
        self.wtab = float(step_priority) ** -np.arange(5, dtype=float)
        self.solves = self.rounds = 0
        self.big_r = _MIN_ROUTE
        none = np.zeros(0, dtype=np.int64)
        # Slot-sized arrays start empty; _allocate grows them to _MIN_SLOTS.
        self.flows = FlowState(**{name: np.zeros(0, dtype=dtype) for name, (dtype, _) in _FLOW_FIELDS.items()},
                               route=np.zeros((0, self.big_r), dtype=np.int64), i_pos=none, free=none,
                               n_free=_counter(), n_live=_counter())
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
        old = self.flows
        n_old = len(old.run)

        def grown(previous: np.ndarray, dtype: type, fill: object) -> np.ndarray:
            array = np.full(size, fill, dtype=dtype)
            array[:n_old] = previous
            return array

        route = np.zeros((size, self.big_r), dtype=np.int64)
        route[:n_old, :old.route.shape[1]] = old.route
        kept = int(old.n_free[0])
        stack = np.zeros(size, dtype=np.int64)
        stack[:kept] = old.free[:kept]
        stack[kept:kept + size - n_old] = np.arange(size - 1, n_old - 1, -1, dtype=np.int64)  # lowest on top
        old.n_free[0] = kept + size - n_old
        self.flows = old._replace(
            **{name: grown(getattr(old, name), *spec) for name, spec in _FLOW_FIELDS.items()},
            route=route, i_pos=np.zeros(size * self.big_r, dtype=np.int64), free=stack)
        self.scratch = self.scratch._replace(
            **{name: grown(getattr(self.scratch, name), *spec) for name, spec in _SCRATCH_FIELDS.items()})
        self.dirty = self.dirty._replace(marked=grown(self.dirty.marked, bool, False),
                                         items=grown(self.dirty.items, np.int64, 0))
        self._due_out = np.zeros(size, dtype=np.int64)  # kernels.due writes the slots due here
        kernels.relink(self.plain["flows"], self.plain["links"])

    def _reserve(self, count: int, longest: int, top_hop: int) -> None:
        if longest > self.big_r:
            self.big_r = max(longest, 2 * self.big_r)
            self._allocate(len(self.run))
        if self.flows.n_free[0] < count:
            self._allocate(max(2 * len(self.run), len(self.run) + count - int(self.flows.n_free[0])))
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
                                      plain["flows"], plain["links"], plain["hops"], plain["dirty"], plain["changed"])
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
        live = len(self)
        if self.heap.size[0] > 2 * live + 1024:
            kernels.rebuild_finish_heap(self.plain["flows"], self.plain["heap"])
        need = int(self.heap.size[0]) + live
        if need > len(self.heap.key):
            size = max(need, 2 * len(self.heap.key))
            arrays = {}
            for name in ("key", "slot", "ver"):
                old = getattr(self.heap, name)
                arrays[name] = np.zeros(size, dtype=old.dtype)
                arrays[name][:len(old)] = old
            self.heap = self.heap._replace(**arrays)

    def remove(self, slots: np.ndarray) -> None:
        """Drop the flows in ``slots``; the rates around them are re-solved at the next recompute."""
        plain = self.plain
        kernels.remove_flows(np.asarray(slots, dtype=np.int64), plain["flows"], plain["links"], plain["hops"],
                             plain["dirty"], plain["changed"])

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

    def bytes_left(self, now: float) -> np.ndarray:
        """Per slot (0 for free ones)."""
        return np.where(self.alive, self.remaining - self.rate * (now - self.t0), 0.0)
