"""Validating a schedule that copies most of its transfers from one validated before.

Why. A warm re-synthesis (mccl-paper §4.3) keeps most of the previous schedule: under
Fail2 at 512 GPUs the AllToAll repair re-rounds a few thousand of 680 k chunks and the
tree packing repairs 512 of 5,120 trees. Validating the whole result again took 0.5–0.9 s
of the controller's ≤ 1 s budget per flagged collective (issue 11), and the overlay map of
its routes another 0.5–1 s, although only the new part can be wrong or cover a new link.

What the synthesizer says (:class:`TransferOrigin`): for every transfer of the new
schedule, the index of the previous transfer it copies (same sender, receiver, step,
operation and route; its chunk renumbered), or -1. What :func:`validate_update` checks:

* that each claimed copy really is one — its fields and route equal the previous
  transfer's, no previous transfer copied twice (one compiled pass, :mod:`.copykernel`,
  claims in any order; the numpy compares stay as the reference);
* every rule of :func:`~mccl.schedule.validate.validate` that spans chunks, on the whole
  schedule: ranks (rule 1), chunks and block fractions (2), chunk indices and compact steps
  (3); rule 3's per-transfer checks (sender, receiver, step, operation) on the transfers
  that copy nothing — a copy's fields are those of a transfer that passed them — so its
  first violation, and its message, is the full check's;
* a new chunk all of whose transfers copy all the transfers of one previous chunk, with
  the same source and destination, is that previous chunk: for AllGather and AllToAll
  (copies) rules 4–6 are per chunk — a route is checked alone, and holding is per (rank,
  chunk) — so it passed them when the previous schedule was validated;
* every other chunk (the new ones) gets rules 4–6 in full, on its own transfers.

So every rule holds on the result exactly when :func:`validate` would pass it, provided
``previous`` passed :func:`validate` on the same topology (the caller vouches for that: the
controller validated the active schedule when it activated it). A violation is named by
running the full :func:`validate`, so the message is the same. Reductions (ReduceScatter,
AllReduce), a schedule without an origin and one whose transfers are mostly new are
validated in full.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.errors import InvalidSchedule
from mccl.schedule.ir import Chunks, Collective, Schedule, Transfers
from mccl.schedule.validate import (
    _check_chunks,
    _check_ranks,
    _check_routes,
    _check_transfers,
    _copies_hold,
    validate,
)
from mccl.topology import Topology

__all__ = ["TransferOrigin", "validate_update", "restricted"]


@dataclass(frozen=True, eq=False)
class TransferOrigin:
    """Which transfers of a schedule copy which of a previous schedule's (see the module docstring).

    ``previous``: the previous schedule's transfers (the validator checks it is handed the
    schedule these belong to, by identity); ``source``: per transfer of the new schedule, the
    index of the previous transfer it copies, or -1 for a new one."""

    previous: Transfers
    source: np.ndarray

    @property
    def new_transfers(self) -> np.ndarray:
        """Mask of the transfers that copy none of the previous schedule's (their routes may be new)."""
        return self.source < 0


def restricted(schedule: Schedule, transfers: np.ndarray, chunks: np.ndarray | None = None) -> Schedule:
    """The schedule with only the transfers in the mask ``transfers``; with ``chunks`` (a mask) also only
    those chunks, renumbered in order (the transfers must all belong to them). Not a valid schedule of
    its collective: a view for the per-transfer and per-chunk computations (rules 4–6, overlay maps)."""
    old = schedule.transfers
    keep = np.flatnonzero(transfers)
    starts = old.route_offsets[:-1][keep]
    lengths = old.route_offsets[1:][keep] - starts
    offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    links = old.route_links[_hops_of(starts, lengths)]  # the kept routes' hops only (a few % of them)
    chunk = old.chunk[keep]
    table = schedule.chunks
    if chunks is not None:
        renumber = np.cumsum(chunks) - 1
        chunk = renumber[chunk]
        table = Chunks(table.source[chunks], table.destination[chunks], table.fraction[chunks])
    part = Transfers(chunk, old.sender[keep], old.receiver[keep], old.step[keep], old.op[keep], offsets, links)
    return Schedule(schedule.collective, schedule.ranks, table, part, schedule.meta)


def _hops_of(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Positions in ``route_links`` of the routes starting at ``starts`` with ``lengths`` hops, in order."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths) + np.arange(total)


_Claims = tuple[slice | np.ndarray, np.ndarray]  # (which new transfers copy, which previous ones), same order


def _copies_hold_up(new: Transfers, old: Transfers, source: np.ndarray) -> _Claims | None:
    """The claimed copies as (new index, previous index), in the same order, if every one has its previous
    transfer's sender, receiver, step, operation and route and no previous transfer is claimed twice;
    else None."""
    copied = source >= 0
    kept = int(np.count_nonzero(copied))
    first = bool(copied[:kept].all())  # the copies come first (the AllToAll repair's merged schedule)
    origin = source[:kept] if first else source[copied]
    if len(origin) and (int(origin.max()) >= len(old) or int(origin.min()) < 0):
        return None
    if len(origin) > 1 and bool(np.all(origin[1:] > origin[:-1])):
        # Claims in the previous order (a synthesizer that keeps transfers in order): boolean gathers,
        # and the claims are distinct by construction. When the copies come first, the new side is a
        # slice; the previous side drops the hops of the few transfers not copied instead of expanding
        # a mask over every hop.
        mine: slice | np.ndarray = slice(0, kept) if first else copied
        was = np.zeros(len(old), dtype=bool)
        was[origin] = True
        for column in ("sender", "receiver", "step", "op"):
            if not np.array_equal(getattr(new, column)[mine], getattr(old, column)[was]):
                return None
        new_lengths, old_lengths = new.route_lengths, old.route_lengths
        if not np.array_equal(new_lengths[mine], old_lengths[was]):
            return None
        new_hops = new.route_links[:int(new.route_offsets[kept])] if isinstance(mine, slice) else (
            new.route_links[np.repeat(copied, new_lengths)])
        dropped = np.flatnonzero(~was)
        old_hops = np.ones(len(old.route_links), dtype=bool)
        old_hops[_hops_of(old.route_offsets[:-1][dropped], old_lengths[dropped])] = False
        return (mine, was) if np.array_equal(new_hops, old.route_links[old_hops]) else None
    if np.any(np.bincount(origin, minlength=len(old)) > 1):
        return None  # a previous transfer copied twice
    indices = np.flatnonzero(copied)
    for column in ("sender", "receiver", "step", "op"):
        if not np.array_equal(getattr(new, column)[indices], getattr(old, column)[origin]):
            return None
    lengths = new.route_lengths[indices]
    if not np.array_equal(lengths, old.route_lengths[origin]):
        return None
    hops = int(lengths.sum())
    if not hops:
        return indices, origin
    ends = np.cumsum(lengths)
    shift = np.repeat(old.route_offsets[:-1][origin] - new.route_offsets[:-1][indices], lengths)
    mine_hops = np.repeat(new.route_offsets[:-1][indices] - (ends - lengths), lengths) + np.arange(hops)
    return (indices, origin) if np.array_equal(new.route_links[mine_hops], old.route_links[mine_hops + shift]) else None


def _copied_chunks(schedule: Schedule, previous: Schedule, claims: _Claims) -> np.ndarray:
    """Mask of the new chunks that are whole previous chunks, given the checked ``claims``."""
    new, old = schedule.transfers, previous.transfers
    mine, theirs = claims
    n_new, n_old = len(schedule.chunks), len(previous.chunks)
    new_chunk = new.chunk[mine]
    old_chunk = old.chunk[theirs]
    mapped = np.full(n_new, -1, dtype=np.int64)
    mapped[new_chunk] = old_chunk
    agrees = np.ones(n_new, dtype=bool)
    agrees[new_chunk[mapped[new_chunk] != old_chunk]] = False  # copies of two previous chunks
    copies = np.bincount(new_chunk, minlength=n_new)
    if isinstance(mine, slice):  # the copies first: the other transfers are the few after them
        count = copies + np.bincount(new.chunk[mine.stop:], minlength=n_new)
    else:
        count = np.bincount(new.chunk, minlength=n_new)
    whole = (copies == count) & (count > 0) & (mapped >= 0) & agrees
    safe = np.where(whole, mapped, 0)
    whole &= np.bincount(old.chunk, minlength=n_old)[safe] == count  # every transfer of the previous chunk
    whole &= schedule.chunks.source == previous.chunks.source[safe]
    whole &= schedule.chunks.destination == previous.chunks.destination[safe]
    return whole


def _claims_compiled(schedule: Schedule, previous: Schedule, source: np.ndarray) -> _Claims | None:
    """:func:`_copies_hold_up` in one compiled pass (:mod:`.copykernel`): (mask of the copies, None) or None."""
    from mccl.schedule.copykernel import claims_hold  # lazily: numba (module docstring of copykernel)

    new, old = schedule.transfers, previous.transfers
    if not claims_hold(*map(_readonly, (source, new.sender, new.receiver, new.step, new.op, new.route_offsets,
                                        new.route_links, old.sender, old.receiver, old.step, old.op,
                                        old.route_offsets, old.route_links))):
        return None
    return source >= 0, np.zeros(0, dtype=bool)


def _readonly(values: np.ndarray) -> np.ndarray:
    """A read-only view (no copy). Why: numba types a read-only array apart from a writable one, so a
    schedule made in-process (read-only columns) and one unpickled (writable) would each compile the
    kernels — measured: 2.3 s in the first dispatch of an unpickled 512-GPU schedule."""
    view = values.view()
    view.setflags(write=False)
    return view


def _whole_compiled(schedule: Schedule, previous: Schedule, source: np.ndarray) -> np.ndarray:
    """:func:`_copied_chunks` in one compiled pass, given claims that hold and chunk indices in range."""
    from mccl.schedule.copykernel import copied_chunks

    new, old = schedule.chunks, previous.chunks
    return copied_chunks(*map(_readonly, (source, schedule.transfers.chunk, previous.transfers.chunk, new.source,
                                          new.destination, old.source, old.destination)))


def validate_update(schedule: Schedule, topology: Topology, previous: Schedule | None,
                    origin: TransferOrigin | None, *, compiled: bool = True) -> np.ndarray | None:
    """:func:`~mccl.schedule.validate.validate` of ``schedule``, re-checking per-chunk rules only where it
    differs from ``previous`` (which must have passed ``validate`` on ``topology``; module docstring).

    Returns the mask of transfers whose routes the previous schedule does not have (for the overlay map),
    or None when the schedule was validated in full (no usable origin: everything is new). ``compiled``:
    the copy checks in :mod:`.copykernel` (False: the numpy :func:`_copies_hold_up` and
    :func:`_copied_chunks`, the reference; the same verdicts)."""
    usable = (origin is not None and previous is not None and origin.previous is previous.transfers
              and schedule.collective in (Collective.ALLGATHER, Collective.ALLTOALL)
              and previous.collective is schedule.collective and previous.ranks == schedule.ranks
              and len(origin.source) == len(schedule.transfers))
    if not usable or 2 * int(np.count_nonzero(np.asarray(origin.source) < 0)) > len(origin.source):
        # Mostly new (a tree packing that changed its tree count: 73 % of a 512-GPU AllGather's transfers
        # after Fail2), checking the claims and copying out the rest costs more than the full check.
        validate(schedule, topology)
        return None
    assert origin is not None and previous is not None
    _check_ranks(schedule, topology)
    _check_chunks(schedule)
    source = np.asarray(origin.source, dtype=np.int64)
    claims = (_claims_compiled(schedule, previous, source) if compiled
              else _copies_hold_up(schedule.transfers, previous.transfers, source))
    if claims is None:  # a claim that is not true: the origin tells nothing, check everything
        validate(schedule, topology)
        return None
    _check_transfers(schedule, claims[0])  # chunk indices in range from here on
    whole = _whole_compiled(schedule, previous, source) if compiled else _copied_chunks(schedule, previous, claims)
    fresh_chunks = ~whole
    if fresh_chunks.any():
        part = restricted(schedule, fresh_chunks[schedule.transfers.chunk], fresh_chunks)
        try:
            _check_routes(part, topology)
            held = _copies_hold(part)
        except InvalidSchedule:
            held = False
        if not held:
            validate(schedule, topology)  # names the first violation, as the full validation would
            return None
    return origin.new_transfers
