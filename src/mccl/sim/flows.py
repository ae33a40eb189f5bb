"""The engine's table of active flows, with max-min rates re-solved only where an event reaches.

Flows live in slots of preallocated arrays (struct of arrays, grown by doubling), so
starting or finishing flows costs nothing per other flow; compiled kernels keep
per-link rows and per-hop lists of flows (:mod:`mccl.sim.tablekernels`) and re-solve,
after each batch of events, only the flows whose rates can change — the incremental
exact max-min of :mod:`mccl.sim.kernels`. Free slots hold ``run == -2``, ``rate == 0``,
``finish == inf`` and ``path == -1``, so masks over all slots select live flows.

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

import numpy as np

from mccl.sim import kernels, tablekernels

__all__ = ["FlowTable"]

_EPS = 1e-11  # relative tolerance of the bottleneck check (mccl.sim.kernels)
_MIN_SLOTS = 64
_MIN_ROUTE = 8
_MIN_DEGREE = 16


class FlowTable:
    """Active flows by slot: run slot (-1: greedy background, -2: free), transfer or background
    index, route, step, hop, bytes left at ``t0``, rate (bytes/s), predicted finish, bottleneck."""

    def __init__(self, n_links: int, step_priority: float) -> None:
        self.n_links = n_links
        self.wtab = float(step_priority) ** -np.arange(5, dtype=float)
        self.solves = self.rounds = 0
        self.link_rate = np.zeros(n_links)  # bytes/s of these flows on each link
        self.l_deg = np.zeros(n_links, dtype=np.int64)  # flows on each link (incidences)
        self.l_flows = np.zeros((n_links, _MIN_DEGREE), dtype=np.int64)  # their slots
        self.l_inc = np.zeros((n_links, _MIN_DEGREE), dtype=np.int64)  # their incidence ids
        self.l_changed = np.zeros(n_links, dtype=bool)
        self.clist = np.zeros(n_links, dtype=np.int64)
        self.l_mark = np.zeros(n_links, dtype=bool)
        self.resid = np.zeros(n_links)
        self.cnt = np.zeros(n_links, dtype=np.int64)
        self.cnt_lev = np.zeros((n_links, 5), dtype=np.int64)
        self.hp = np.zeros(n_links, dtype=np.int64)  # indexed heap of link shares (mccl.sim.kernels)
        self.hpos = np.full(n_links, -1, dtype=np.int64)
        self.hkey = np.zeros(n_links)
        self.h_head = np.zeros(0, dtype=np.int64)
        self.h_oldest = np.zeros(0, dtype=np.int64)
        # free slots, dirty flows, changed links, live flows; totals of flows re-solved and links checked;
        # entries on the finish-time heap
        self.meta = np.zeros(7, dtype=np.int64)
        self.q_key = np.zeros(_MIN_SLOTS)  # heap of (predicted finish, slot, version): mccl.sim.kernels.due
        self.q_slot = np.zeros(_MIN_SLOTS, dtype=np.int64)
        self.q_ver = np.zeros(_MIN_SLOTS, dtype=np.int64)
        self.big_r = _MIN_ROUTE
        self._allocate(_MIN_SLOTS)

    def __len__(self) -> int:
        return int(self.meta[3])

    # -- storage -------------------------------------------------------------------------
    def _allocate(self, size: int) -> None:
        """(Re)allocate the slot arrays for ``size`` slots, keeping live flows in their slots."""
        old = getattr(self, "run", None)
        n_old = 0 if old is None else len(old)
        fresh = {
            "alive": np.zeros(size, dtype=bool), "run": np.full(size, -2, dtype=np.int64),
            "transfer": np.zeros(size, dtype=np.int64), "hop": np.full(size, -1, dtype=np.int64),
            "step": np.zeros(size, dtype=np.int64), "path": np.full(size, -1, dtype=np.int64),
            "length": np.zeros(size, dtype=np.int64), "remaining": np.zeros(size), "t0": np.zeros(size),
            "rate": np.zeros(size), "finish": np.full(size, np.inf), "bottleneck": np.full(size, -1, dtype=np.int64),
            "wlev": np.zeros(size, dtype=np.int64), "f_hnext": np.full(size, -1, dtype=np.int64),
            "f_hprev": np.full(size, -1, dtype=np.int64), "f_dirty": np.zeros(size, dtype=bool),
            "dlist": np.zeros(size, dtype=np.int64), "s_in": np.zeros(size, dtype=bool),
            "s_frozen": np.zeros(size, dtype=bool), "s_rate": np.zeros(size),
            "s_bneck": np.full(size, -1, dtype=np.int64), "s_wold": np.zeros(size, dtype=np.int64),
            "dlist_out": np.zeros(size, dtype=np.int64), "f_ver": np.zeros(size, dtype=np.int64),
        }
        for name, array in fresh.items():
            if old is not None:
                array[:n_old] = getattr(self, name)
            setattr(self, name, array)
        route = np.zeros((size, self.big_r), dtype=np.int64)
        if old is not None:
            route[:n_old, :self.route.shape[1]] = self.route
        self.route = route
        self.i_pos = np.zeros(size * self.big_r, dtype=np.int64)  # position of each incidence in its link's array
        stack = np.zeros(size, dtype=np.int64)
        kept = int(self.meta[0])
        if old is not None:
            stack[:kept] = self.free[:kept]
        stack[kept:kept + size - n_old] = np.arange(size - 1, n_old - 1, -1, dtype=np.int64)  # lowest on top
        self.free = stack
        self.meta[0] = kept + size - n_old
        tablekernels.relink(self.big_r, self.alive, self.length, self.route, self.i_pos, self.l_flows, self.l_inc,
                            self.l_deg)

    def _reserve(self, count: int, longest: int, top_hop: int) -> None:
        if longest > self.big_r:
            self.big_r = max(longest, 2 * self.big_r)
            self._allocate(len(self.run))
        if self.meta[0] < count:
            self._allocate(max(2 * len(self.run), len(self.run) + count - int(self.meta[0])))
        if top_hop >= len(self.h_head):
            size = max(2 * len(self.h_head), top_hop + 1, 64)
            self.h_head = np.concatenate([self.h_head, np.full(size - len(self.h_head), -1, dtype=np.int64)])
            self.h_oldest = np.concatenate([self.h_oldest, np.full(size - len(self.h_oldest),
                                                                   np.iinfo(np.int64).max, dtype=np.int64)])

    def _widen(self) -> None:
        """Twice the room per link for flows (a link ran out of it)."""
        old = self.l_flows.shape[1]
        for name in ("l_flows", "l_inc"):
            grown = np.zeros((self.n_links, 2 * old), dtype=np.int64)
            grown[:, :old] = getattr(self, name)
            setattr(self, name, grown)

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
        :func:`mccl.sim.tablekernels.add_flows`; ``transfer`` is the row. Return their slots."""
        count = len(rows)
        self._reserve(count, longest, hop_base + n_hops - 1)
        slots = np.empty(count, dtype=np.int64)
        done = 0
        while True:
            done += tablekernels.add_flows(
                slots[done:], run, rows[done:], route_offsets, route_links, size_of, size_scale, step_of, hop_of,
                hop_base, path_of, path_by, now, self.big_r, self.alive, self.run, self.transfer, self.hop, self.step,
                self.path, self.length, self.route, self.remaining, self.t0, self.rate, self.finish, self.bottleneck,
                self.wlev, self.f_hnext, self.f_hprev, self.f_dirty, self.i_pos, self.l_flows, self.l_inc, self.l_deg,
                self.h_head, self.h_oldest, self.free, self.dlist, self.l_changed, self.clist, self.meta)
            if done == count:
                return slots
            self._widen()

    def due(self, limit: float) -> np.ndarray:
        """Slots of the flows whose last byte leaves by ``limit`` (each returned once), ascending."""
        count = kernels.due(limit, self.dlist_out, self.f_ver, self.q_key, self.q_slot, self.q_ver, self.meta)
        return np.sort(self.dlist_out[:count])  # in slot order, as a scan would find them

    def next_finish(self) -> float:
        """The earliest predicted finish of a flow (inf if none)."""
        return float(kernels.next_finish(self.f_ver, self.q_key, self.q_slot, self.q_ver, self.meta))

    def _heap_room(self) -> None:
        """Room for one push per live flow; stale entries dropped once they outnumber live ones."""
        live = int(self.meta[3])
        if self.meta[6] > 2 * live + 1024:
            kernels.rebuild_finish_heap(self.alive, self.finish, self.f_ver, self.q_key, self.q_slot, self.q_ver,
                                        self.meta)
        need = int(self.meta[6]) + live
        if need > len(self.q_key):
            size = max(need, 2 * len(self.q_key))
            for name in ("q_key", "q_slot", "q_ver"):
                old = getattr(self, name)
                grown = np.zeros(size, dtype=old.dtype)
                grown[:len(old)] = old
                setattr(self, name, grown)

    def remove(self, slots: np.ndarray) -> None:
        """Drop the flows in ``slots``; the rates around them are re-solved at the next recompute."""
        tablekernels.remove_flows(
            np.asarray(slots, dtype=np.int64), self.big_r, self.alive, self.run, self.f_ver, self.hop, self.step, self.path,
            self.length, self.route, self.rate, self.finish, self.f_hnext, self.f_hprev, self.f_dirty, self.i_pos,
            self.l_flows, self.l_inc, self.l_deg, self.h_head, self.h_oldest, self.link_rate, self.free, self.dlist,
            self.l_changed, self.clist, self.meta)

    def touch_links(self, links: np.ndarray | tuple[int, ...]) -> None:
        """These links' capacities changed: re-solve the flows they bottleneck."""
        for link in np.unique(np.asarray(links, dtype=np.int64)):
            if not self.l_changed[link]:
                self.l_changed[link] = True
                self.clist[self.meta[2]] = link
                self.meta[2] += 1

    # -- rates ---------------------------------------------------------------------------
    def recompute(self, capacity: np.ndarray, now: float) -> None:
        """Max-min rates after the changes since the last call, given the capacity left to flows."""
        if not (self.meta[1] or self.meta[2]):
            return
        self._heap_room()
        solves = kernels.recompute(
            np.ascontiguousarray(capacity, dtype=float), now, self.wtab, _EPS, self.big_r, self.alive, self.hop,
            self.step, self.length, self.route, self.remaining, self.t0, self.rate, self.finish, self.bottleneck,
            self.wlev, self.f_dirty, self.l_flows, self.l_deg, self.h_oldest, self.link_rate, self.dlist,
            self.l_changed, self.clist, self.meta, self.s_in, self.s_frozen, self.s_rate, self.s_bneck, self.s_wold,
            self.l_mark,
            self.resid, self.cnt, self.cnt_lev, self.hp, self.hpos, self.hkey, self.f_ver, self.q_key, self.q_slot,
            self.q_ver)
        self.solves += 1
        self.rounds += int(solves)

    def live(self) -> np.ndarray:
        """Slots of the live flows, ascending."""
        return np.flatnonzero(self.alive)

    def bytes_left(self, now: float) -> np.ndarray:
        """Per slot (0 for free ones)."""
        return np.where(self.alive, self.remaining - self.rate * (now - self.t0), 0.0)
