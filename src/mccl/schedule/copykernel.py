"""The copy checks of :mod:`.incremental`, compiled (numba): one pass each instead of masked gathers.

Why: at 512 GPUs a warm tree-packing AllGather copies ~1.99 M of its 2.09 M transfers from the
previous schedule, interleaved with the new ones (a repaired tree's chunk sits between kept
ones). :func:`~.incremental._copies_hold_up` checks the claims with boolean gathers of every
column, a hop mask over both schedules' 6 M route links and their compares — ~180 ms of the
controller's ≤ 1 s per flagged collective — and :func:`~.incremental._copied_chunks` another
~70 ms of bincounts and fancy assignments (measured 2026-12-01 on the first Fail2 step of
``benchmarks/control.py --controller-cpu``). Here each is one loop over the transfers.

Same verdicts as the numpy functions, which stay as the reference (the tests compare them on
damaged claims): a claim holds iff it names a previous transfer that no other claim names
and whose sender, receiver, step, operation and route are the new transfer's; a new chunk is
a copied one iff all its transfers are claims of one previous chunk, every transfer of that
chunk is claimed, and the source and destination agree.

Imported lazily by :mod:`.incremental` (numba costs ~0.3 s to import; the runtime imports the
schedule package but never validates an update).
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["claims_hold", "copied_chunks"]

_jit = numba.njit(cache=True, nogil=True)


@_jit
def claims_hold(source: np.ndarray, new_sender: np.ndarray, new_receiver: np.ndarray, new_step: np.ndarray,
                new_op: np.ndarray, new_offsets: np.ndarray, new_links: np.ndarray, old_sender: np.ndarray,
                old_receiver: np.ndarray, old_step: np.ndarray, old_op: np.ndarray, old_offsets: np.ndarray,
                old_links: np.ndarray) -> bool:
    """True iff every claim ``source[p] >= 0`` is a distinct previous transfer equal to transfer p
    (sender, receiver, step, operation, route link by link)."""
    claimed = np.zeros(len(old_sender), dtype=np.bool_)
    for p in range(len(source)):
        q = source[p]
        if q < 0:
            continue
        if q >= len(old_sender) or claimed[q]:
            return False
        claimed[q] = True
        if (new_sender[p] != old_sender[q] or new_receiver[p] != old_receiver[q] or new_step[p] != old_step[q]
                or new_op[p] != old_op[q]):
            return False
        start, stop = new_offsets[p], new_offsets[p + 1]
        old_start = old_offsets[q]
        if stop - start != old_offsets[q + 1] - old_start:
            return False
        for h in range(stop - start):
            if new_links[start + h] != old_links[old_start + h]:
                return False
    return True


@_jit
def copied_chunks(source: np.ndarray, new_chunk: np.ndarray, old_chunk: np.ndarray, new_src: np.ndarray,
                  new_dst: np.ndarray, old_src: np.ndarray, old_dst: np.ndarray) -> np.ndarray:
    """Mask of the new chunks that are whole previous chunks, given claims that hold (:func:`claims_hold`)
    and chunk indices in range (rule 3)."""
    n_new, n_old = len(new_src), len(old_src)
    mapped = np.full(n_new, -1, dtype=np.int64)
    agrees = np.ones(n_new, dtype=np.bool_)
    copies = np.zeros(n_new, dtype=np.int64)
    count = np.zeros(n_new, dtype=np.int64)
    for p in range(len(source)):
        c = new_chunk[p]
        count[c] += 1
        q = source[p]
        if q < 0:
            continue
        copies[c] += 1
        m = old_chunk[q]
        if mapped[c] < 0:
            mapped[c] = m
        elif mapped[c] != m:
            agrees[c] = False  # copies of two previous chunks
    old_count = np.zeros(n_old, dtype=np.int64)
    for q in range(len(old_chunk)):
        old_count[old_chunk[q]] += 1
    whole = np.zeros(n_new, dtype=np.bool_)
    for c in range(n_new):
        m = mapped[c]
        whole[c] = (count[c] > 0 and copies[c] == count[c] and m >= 0 and agrees[c] and old_count[m] == count[c]
                    and new_src[c] == old_src[m] and new_dst[c] == old_dst[m])
    return whole
