"""``validate(schedule, topology)``: a proof that a schedule carries out its collective.

It replays the schedule step by step over the state "which contributions of which
chunk does each rank hold" and raises :class:`InvalidSchedule` naming the first
rule broken. The rules, in the order they are checked:

1. ranks: distinct GPUs of the topology;
2. chunks: each belongs to a block of the collective, fractions are positive and
   every block's fractions sum to 1;
3. transfers: chunk, sender and receiver exist, sender != receiver, step >= 0, the
   steps used are 0, 1, ..., n-1 with none empty (an executor and the simulator walk
   the steps in order: a gap of two billion empty steps would hang them, so their work
   stays bounded by the number of transfers; reading a file renumbers steps compactly),
   the operation fits the collective (copies for AllGather/AllToAll, reductions for
   ReduceScatter, both for AllReduce);
4. routes: every hop is an existing link, the route starts at the sender's GPU,
   each link starts where the previous ended, it ends at the receiver's GPU and
   passes through switches only (forwarding through a GPU is a relay, i.e. a
   transfer of its own) and visits no node twice (a route is a path: a loop
   only adds hops, i.e. latency, and load on links it crosses twice);
5. causality: a rank sends a chunk at step s only if it held it at the end of
   step s - 1; no contribution is counted twice; a copy never overwrites data the
   incoming copy lacks; nothing is delivered twice;
6. completion: every rank ends with exactly the data it must hold.

State is a bit mask of contributing ranks per (rank, chunk): for AllGather and
AllToAll a single bit (held or not), for reductions the set of ranks whose input
the partial sum contains.

Rules 1–4 (the schedule is well formed: :mod:`.validate_structure`) are checked first; this
file replays rules 5–6 over what they established.
"""

from __future__ import annotations

import numpy as np

from mccl.errors import InvalidSchedule
from mccl.schedule.ir import Collective, Schedule, TransferOp
from mccl.schedule.validate_structure import (
    _check_chunks,
    _check_ranks,
    _check_routes,
    _check_transfers,
    _chunk_name,
    _rank_name,
    _transfer_name,
)
from mccl.topology import Topology

__all__ = ["validate"]


def validate(schedule: Schedule, topology: Topology) -> None:
    """Raise :class:`InvalidSchedule` naming the first violation; return None if correct."""
    _check_ranks(schedule, topology)
    _check_chunks(schedule)
    _check_transfers(schedule)
    _check_routes(schedule, topology)
    if schedule.collective in (Collective.ALLGATHER, Collective.ALLTOALL):
        if not _copies_hold(schedule):  # the step-by-step replay names the first violation
            _replay_copies(schedule)
    else:
        _replay_reductions(schedule)


def _steps(schedule: Schedule) -> list[np.ndarray]:
    """Transfer indices grouped by step, in step order."""
    order = np.argsort(schedule.transfers.step, kind="stable")
    steps = schedule.transfers.step[order]
    bounds = np.flatnonzero(np.diff(steps)) + 1
    return np.split(order, bounds)


_DENSE_HELD = 1 << 24  # ranks × chunks above which the replay keeps a sorted key set, not a matrix


def _holds(held: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Which ``keys`` the sorted key set ``held`` contains."""
    position = np.minimum(np.searchsorted(held, keys), max(len(held) - 1, 0))
    return (held[position] == keys) if len(held) else np.zeros(len(keys), dtype=bool)


def _copies_hold(schedule: Schedule) -> bool:
    """Rules 5–6 for AllGather / AllToAll in one pass over all transfers, no replay: True iff the replay
    would pass. Why: the replay walks the steps (one sort of the held set per step); at 512 GPUs it took
    0.8–1.8 s of the controller's budget per issued schedule. Equivalent, because copies make holding
    monotone: a rank holds a chunk at the start of step s iff it is the chunk's source or receives it at
    a step < s. So, with each (chunk, receiver) received at most once and never by the chunk's source
    (no delivery twice, in one step or later), every sender must be its chunk's source or have received
    it at a smaller step, and completion is a count (AllGather) or a lookup (AllToAll). A False answer is
    left to :func:`_replay_copies`, which raises with the message naming the first violation."""
    n, chunks, transfers = schedule.n_ranks, schedule.chunks, schedule.transfers
    count = len(chunks)
    chunk = transfers.chunk.astype(np.int64)
    source = chunks.source.astype(np.int64)
    receiver = transfers.receiver.astype(np.int64)
    received = chunk * n + receiver
    if count * n <= _DENSE_KEYS:
        return _copies_hold_dense(schedule, chunk, source, receiver, received)
    order = np.argsort(received)
    keys = received[order]
    if len(keys) > 1 and np.any(keys[1:] == keys[:-1]):
        return False  # delivered twice
    if np.any(receiver == source[chunk]):
        return False  # the source already holds it
    sender = transfers.sender.astype(np.int64)
    from_source = sender == source[chunk]
    relayed = np.flatnonzero(~from_source)
    if relayed.size:
        wanted = chunk[relayed] * n + sender[relayed]
        position = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
        if np.any(keys[position] != wanted):
            return False  # forwards a chunk it never receives
        if np.any(transfers.step[order[position]] >= transfers.step[relayed]):
            return False  # forwards it before it holds it
    if schedule.collective is Collective.ALLGATHER:
        return len(keys) == count * (n - 1)  # distinct, none to the source, all below count·n: every rank
    owners = chunks.destination.astype(np.int64)
    remote = np.flatnonzero(owners != source)
    if not remote.size:
        return True
    wanted = remote * n + owners[remote]
    position = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
    return bool(len(keys)) and bool(np.all(keys[position] == wanted))


_DENSE_KEYS = 1 << 22  # chunks × ranks up to which _copies_hold indexes arrays by key instead of sorting the keys


def _copies_hold_dense(schedule: Schedule, chunk: np.ndarray, source: np.ndarray, receiver: np.ndarray,
                       received: np.ndarray) -> bool:
    """:func:`_copies_hold` with arrays over every ``chunk·n + rank`` key instead of a sort of the received
    keys (a 512-GPU AllGather: 4,096 chunks × 512 ranks; the sort of its 2·10⁶ keys was most of the check).
    The same verdict: a key received twice, a chunk sent to its source, a sender that never receives the
    chunk or receives it at the same or a later step, a delivery missing."""
    n, transfers = schedule.n_ranks, schedule.transfers
    size = len(schedule.chunks) * n
    seen = np.zeros(size, dtype=bool)
    seen[received] = True
    if int(np.count_nonzero(seen)) != len(received):
        return False  # delivered twice
    if np.any(receiver == source[chunk]):
        return False  # the source already holds it
    sender = transfers.sender.astype(np.int64)
    relayed = np.flatnonzero(sender != source[chunk])
    if relayed.size:
        arrival = np.full(size, -1, dtype=np.int64)
        arrival[received] = transfers.step
        held_since = arrival[chunk[relayed] * n + sender[relayed]]
        if np.any(held_since < 0) or np.any(held_since >= transfers.step[relayed]):
            return False  # forwards a chunk it never receives, or before it holds it
    if schedule.collective is Collective.ALLGATHER:
        return len(received) == len(schedule.chunks) * (n - 1)
    owners = schedule.chunks.destination.astype(np.int64)
    remote = np.flatnonzero(owners != source)
    return bool(np.all(seen[remote * n + owners[remote]]))


def _replay_copies(schedule: Schedule) -> None:
    """AllGather / AllToAll: a chunk is held or not; vectorized per step. The holdings are a ranks ×
    chunks matrix, or, where that is large (a 512-GPU AllToAll has ~10⁶ chunks: a 0.5 GB matrix touched
    at random, seconds), the sorted set of ``rank·chunks + chunk`` keys; the checks and the first
    violation named are the same."""
    n, chunks, transfers = schedule.n_ranks, schedule.chunks, schedule.transfers
    if n * len(chunks) > _DENSE_HELD:
        _replay_copies_sparse(schedule)
        return
    held = np.zeros((n, len(chunks)), dtype=bool)
    held[chunks.source, np.arange(len(chunks))] = True
    for group in _steps(schedule):
        chunk, sender, receiver = transfers.chunk[group], transfers.sender[group], transfers.receiver[group]
        missing = np.flatnonzero(~held[sender, chunk])
        if missing.size:
            i = group[missing[0]]
            raise InvalidSchedule(f"{_transfer_name(schedule, i)}: {_rank_name(schedule, int(transfers.sender[i]))} "
                                  f"forwards {_chunk_name(schedule, int(transfers.chunk[i]))} before it holds it")
        again = np.flatnonzero(held[receiver, chunk])
        if again.size:
            i = group[again[0]]
            raise InvalidSchedule(f"{_transfer_name(schedule, i)}: {_rank_name(schedule, int(transfers.receiver[i]))} "
                                  "already holds that chunk; it would be delivered twice")
        key = receiver.astype(np.int64) * len(chunks) + chunk
        unique, first_index, counts = np.unique(key, return_index=True, return_counts=True)
        if np.any(counts > 1):
            i = group[first_index[np.flatnonzero(counts > 1)[0]]]
            raise InvalidSchedule(f"{_transfer_name(schedule, i)}: the same chunk reaches "
                                  f"{_rank_name(schedule, int(transfers.receiver[i]))} twice in one step")
        held[receiver, chunk] = True
    if schedule.collective is Collective.ALLGATHER:
        missing_rank, missing_chunk = np.nonzero(~held)
    else:
        owners = chunks.destination
        not_delivered = np.flatnonzero(~held[owners, np.arange(len(chunks))])
        missing_chunk = not_delivered
        missing_rank = owners[not_delivered]
    if len(missing_chunk):
        rank, chunk = int(missing_rank[0]), int(missing_chunk[0])
        raise InvalidSchedule(f"{_rank_name(schedule, rank)} never receives {_chunk_name(schedule, chunk)}")


def _replay_copies_sparse(schedule: Schedule) -> None:
    """:func:`_replay_copies` with the holdings as a sorted set of ``chunk·ranks + rank`` keys
    (chunk-major: synthesizers emit a step's transfers mostly in chunk order, so the lookups walk
    the set nearly in order; each step's lookups are sorted first all the same)."""
    n, chunks, transfers = schedule.n_ranks, schedule.chunks, schedule.transfers
    count = len(chunks)
    held = np.arange(count, dtype=np.int64) * n + chunks.source  # sorted: one key per chunk

    def holds(keys: np.ndarray) -> np.ndarray:
        order = np.argsort(keys, kind="stable")
        found = np.empty(len(keys), dtype=bool)
        found[order] = _holds(held, keys[order])
        return found

    for group in _steps(schedule):
        chunk = transfers.chunk[group].astype(np.int64)
        sender, receiver = transfers.sender[group].astype(np.int64), transfers.receiver[group].astype(np.int64)
        missing = np.flatnonzero(~holds(chunk * n + sender))
        if missing.size:
            i = group[missing[0]]
            raise InvalidSchedule(f"{_transfer_name(schedule, i)}: {_rank_name(schedule, int(transfers.sender[i]))} "
                                  f"forwards {_chunk_name(schedule, int(transfers.chunk[i]))} before it holds it")
        key = chunk * n + receiver
        again = np.flatnonzero(holds(key))
        if again.size:
            i = group[again[0]]
            raise InvalidSchedule(f"{_transfer_name(schedule, i)}: {_rank_name(schedule, int(transfers.receiver[i]))} "
                                  "already holds that chunk; it would be delivered twice")
        rank_major = receiver * count + chunk  # the dense replay names the smallest (rank, chunk) first
        order = np.argsort(rank_major, kind="stable")
        twice = np.flatnonzero(rank_major[order][1:] == rank_major[order][:-1])
        if twice.size:
            i = group[order[twice[0]]]
            raise InvalidSchedule(f"{_transfer_name(schedule, i)}: the same chunk reaches "
                                  f"{_rank_name(schedule, int(transfers.receiver[i]))} twice in one step")
        held = np.sort(np.concatenate([held, key]))
    if schedule.collective is Collective.ALLGATHER:
        if len(held) == n * count:  # no key twice (checked above), all below n·chunks: complete
            return
        have = np.zeros(n * count, dtype=bool)  # only to name the first gap, rank-major as the dense replay
        have[(held % n) * count + held // n] = True
        rank, chunk = divmod(int(np.flatnonzero(~have)[0]), count)
    else:
        owners = chunks.destination.astype(np.int64)
        not_delivered = np.flatnonzero(~_holds(held, np.arange(count, dtype=np.int64) * n + owners))
        if not not_delivered.size:
            return
        chunk = int(not_delivered[0])
        rank = int(owners[chunk])
    raise InvalidSchedule(f"{_rank_name(schedule, rank)} never receives {_chunk_name(schedule, chunk)}")


def _replay_reductions(schedule: Schedule) -> None:
    """ReduceScatter / AllReduce: contributor sets as Python int bit masks."""
    n, chunks, transfers = schedule.n_ranks, schedule.chunks, schedule.transfers
    full = (1 << n) - 1
    state = [[1 << rank] * len(chunks) for rank in range(n)]
    chunk_col, sender_col = transfers.chunk.tolist(), transfers.sender.tolist()
    receiver_col, op_col = transfers.receiver.tolist(), transfers.op.tolist()
    for group in _steps(schedule):
        incoming = [(i, state[sender_col[i]][chunk_col[i]]) for i in group.tolist()]
        copied: set[tuple[int, int]] = set()
        for i, data in incoming:
            receiver, chunk = receiver_col[i], chunk_col[i]
            mine = state[receiver][chunk]
            if op_col[i] == TransferOp.REDUCE:
                overlap = data & mine
                if overlap:
                    twice = overlap.bit_length() - 1
                    raise InvalidSchedule(f"{_transfer_name(schedule, i)}: {_rank_name(schedule, receiver)} would add "
                                          f"rank {twice}'s contribution to that chunk twice")
                state[receiver][chunk] = mine | data
            else:
                lost = mine & ~data
                if lost or data == mine or (receiver, chunk) in copied:
                    reason = (f"would overwrite the contribution of rank {lost.bit_length() - 1} that the copy lacks"
                              if lost else "already holds that data; it would be delivered twice")
                    raise InvalidSchedule(f"{_transfer_name(schedule, i)}: {_rank_name(schedule, receiver)} {reason}")
                copied.add((receiver, chunk))
                state[receiver][chunk] = data
    everyone = schedule.collective is Collective.ALLREDUCE
    for chunk in range(len(chunks)):
        owners = range(n) if everyone else (int(chunks.destination[chunk]),)
        for rank in owners:
            missing = full & ~state[rank][chunk]
            if missing:
                raise InvalidSchedule(f"{_rank_name(schedule, rank)} ends without rank {missing.bit_length() - 1}'s "
                                      f"contribution to {_chunk_name(schedule, chunk)}")
