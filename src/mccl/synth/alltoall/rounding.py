"""Deep-dive rounding of the LP's path flows to whole chunks (mccl-paper §4.2, App. F).

A block (s, d) is cut into K equal units (K = ``chunks``, at most 10 in the
paper) and every unit follows one path; units of a block on the same path form
one chunk, so a block has at most K chunks. The LP gives each block a
distribution over paths (the trees' weights, normalised per tensor);
``u = K · share`` units per (block, path). Rounding picks integers m with
``Σ_paths m = K`` per block that keep the most loaded link as light as possible:
the rounded schedule's rate is ``min_a cap_a / load_a`` with
``load_a = Σ m / K`` over the paths through a.

First the largest-remainder rounding of every block; it is kept when within
0.1% of the LP (measured: on symmetric HPN fabrics it is not, 5–15% off, since
all blocks round the same way). Otherwise, deep dive (diving heuristic, Huin et
al. 2023): fix the integral parts of u; then repeatedly solve the LP "place each block's remaining units on its paths,
minimising the maximum utilization" (HiGHS), fix every integral part of that
solution, round up the most fractional placements (the largest fractional part
of a block, for the blocks whose parts are largest), and re-solve, until no
unit is left. Each dive fixes at least one unit, and at most ``1/divisor`` of
the fractional blocks, so the LP keeps re-balancing what the earlier fixes
did. Only blocks with units left and the links their paths cross enter the LP:
a vertex solution of the master has at most (tensors + links) positive trees.
After ``max_dives`` LP solves the rest is finished by largest remainders of the
last LP. When more than ``max_lp_entries`` (block, path) entries are open, the
dive LPs get too slow (30–80 s each at 256 GPUs here), and a load-balanced greedy
replaces them: blocks in batches, each unit on the path whose busiest link stays
least utilised, starting from the LP's fractional load (measured gaps ≤ 0.93% on
64–512-GPU HPN fabrics). The better of the candidate roundings is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.errors import SynthesisError
from mccl.synth import highs

__all__ = ["Placement", "deep_dive", "route_load"]

_SNAP = 1e-7  # a share within this many units of an integer counts as that integer


@dataclass(frozen=True, eq=False)
class Placement:
    """Whole units per (block, path): ``units[i]`` of block ``block[i]`` on path ``path[i]``."""

    block: np.ndarray  # s * n + d
    path: np.ndarray  # path id
    units: np.ndarray  # ≥ 1
    chunks: int  # K
    rate: float  # min_a cap_a / load_a, Gbit/s per block
    dives: int  # LP solves of the dive
    load: np.ndarray  # blocks per link: these chunks plus the base they were rounded on


def deep_dive(block: np.ndarray, path: np.ndarray, share: np.ndarray, path_links: np.ndarray,
              capacity: np.ndarray, chunks: int, *, divisor: int = 2, max_dives: int = 6,
              good_enough: float = 1e-3, lp_rate: float | None = None, max_lp_entries: int = 20_000,
              base_load: np.ndarray | None = None) -> Placement:
    """Round the (block, path, share) flow to ``chunks`` units per block.

    ``share`` sums to 1 per block; ``path_links`` is the pool's path table
    (network link ids, -1 padded). First the largest-remainder rounding of each
    block (vectorized); if its gap to ``lp_rate`` is within ``good_enough`` the
    dive is skipped (on large symmetric fabrics thousands of blocks share every
    link and their rounding errors cancel). Otherwise the dive runs for at most
    ``max_dives`` LP solves, then finishes with largest remainders of its last
    LP, and the better of the two roundings is returned.

    ``base_load``: blocks per link already placed by chunks that are not rounded
    here (a warm repair keeps the unaffected pairs' chunks); every load and rate
    below includes it.
    """
    if chunks < 1:
        raise SynthesisError(f"chunks must be >= 1, got {chunks}")
    units = share * chunks
    blocks, block_of = np.unique(block, return_inverse=True)
    n_links = len(capacity)
    base = np.zeros(n_links) if base_load is None else np.asarray(base_load, dtype=float)
    entry_links = path_links[path]  # (entries, H)
    simple = _largest_remainder(block_of, units, chunks, len(blocks))
    best = (_rate(entry_links, simple, chunks, capacity, base), simple, 0)
    target = lp_rate if lp_rate is not None else _rate(entry_links, units.astype(float), chunks, capacity, base)
    if best[0] >= target * (1 - good_enough):
        return _placement(block, path, best, chunks, entry_links, base)
    fixed = np.floor(units + _SNAP).astype(np.int64)
    left = chunks - np.bincount(block_of, weights=fixed, minlength=len(blocks)).astype(np.int64)
    if np.any(left < 0):
        raise SynthesisError("the LP's path shares of a block exceed 1; the master solution is inconsistent")
    if np.count_nonzero(left[block_of] > 0) > max_lp_entries:
        balanced = _balanced_greedy(block_of, units, fixed, left, entry_links, capacity, chunks, base)
        candidate = (_rate(entry_links, balanced, chunks, capacity, base), balanced, 0)
        return _placement(block, path, candidate if candidate[0] > best[0] else best, chunks, entry_links, base)
    dives = 0
    while np.any(left > 0):
        open_entry = np.flatnonzero(left[block_of] > 0)
        load = base + _load(entry_links, fixed, chunks, n_links)
        placed = _balance_lp(block_of[open_entry], left, entry_links[open_entry], load, capacity, chunks)
        dives += 1
        if dives >= max_dives:  # finish: largest remainders of this LP's placement
            extra = np.zeros(len(fixed))
            extra[open_entry] = placed
            fixed = fixed + _largest_remainder(block_of, extra, None, len(blocks), total=left)
            left[:] = 0
            break
        whole = np.floor(placed + _SNAP).astype(np.int64)
        fixed[open_entry] += whole
        left -= np.bincount(block_of[open_entry], weights=whole, minlength=len(blocks)).astype(np.int64)
        fraction = placed - whole
        fraction[left[block_of[open_entry]] <= 0] = 0.0
        candidates = np.flatnonzero(fraction > _SNAP)
        if candidates.size == 0:
            if np.any(left > 0):  # only possible through round-off: place the rest greedily
                _greedy(block_of, left, fixed, entry_links, capacity, chunks, base)
            break
        # The most fractional entry of each open block, then the blocks with the largest such part.
        order = candidates[np.lexsort((-fraction[candidates], block_of[open_entry[candidates]]))]
        first = np.ones(len(order), dtype=bool)
        first[1:] = block_of[open_entry[order]][1:] != block_of[open_entry[order]][:-1]
        top = order[first]
        take = max(1, -(-len(top) // divisor))
        chosen = top[np.argsort(-fraction[top], kind="stable")[:take]]
        fixed[open_entry[chosen]] += 1
        left -= np.bincount(block_of[open_entry[chosen]], minlength=len(blocks)).astype(np.int64)
    dived = (_rate(entry_links, fixed, chunks, capacity, base), fixed, dives)
    return _placement(block, path, dived if dived[0] > best[0] else (best[0], best[1], dives), chunks, entry_links,
                      base)


def _balanced_greedy(block_of: np.ndarray, units: np.ndarray, fixed: np.ndarray, left: np.ndarray,
                     entry_links: np.ndarray, capacity: np.ndarray, chunks: int, base: np.ndarray,
                     batches: int = 64) -> np.ndarray:
    """Rounding for instances too large for LP dives: blocks in batches, each unit of a block to the
    entries whose busiest link would be least utilised, starting from the LP's fractional load and
    replacing each batch's fractional parts by its whole units before the next batch decides."""
    n_links = len(capacity)
    load = base + _load(entry_links, units, chunks, n_links)  # the LP's (fractional) load
    result = fixed.copy()
    open_blocks = np.flatnonzero(left > 0)
    rng = np.random.default_rng(0)
    for batch in np.array_split(rng.permutation(open_blocks), min(batches, max(len(open_blocks), 1))):
        in_batch = np.zeros(len(left), dtype=bool)
        in_batch[batch] = True
        entries = np.flatnonzero(in_batch[block_of])
        fraction = units[entries] - fixed[entries]
        load -= _load(entry_links[entries], fraction, chunks, n_links)
        links = entry_links[entries]
        util = np.where(links >= 0, (load[np.maximum(links, 0)] + 1.0 / chunks) / capacity[np.maximum(links, 0)], 0.0)
        score = util.max(axis=1) - 1e-9 * fraction  # ties: the larger LP share first
        owner = block_of[entries]
        order = np.lexsort((score, owner))
        start = np.searchsorted(owner[order], owner[order], side="left")
        rank = np.arange(len(order)) - start
        bump = np.zeros(len(entries), dtype=np.int64)
        bump[order] = rank < left[owner[order]]
        result[entries] += bump
        load += _load(entry_links[entries], bump.astype(float), chunks, n_links)
    return result


def _placement(block: np.ndarray, path: np.ndarray, best: tuple[float, np.ndarray, int], chunks: int,
               entry_links: np.ndarray, base: np.ndarray) -> Placement:
    rate, units, dives = best
    keep = units > 0
    load = base + _load(entry_links[keep], units[keep], chunks, len(base))
    return Placement(block[keep], path[keep], units[keep].astype(np.int64), chunks, rate, dives, load)


def _rate(entry_links: np.ndarray, units: np.ndarray, chunks: int, capacity: np.ndarray, base: np.ndarray) -> float:
    """min_a cap_a / load_a (Gbit/s per block) of a placement on top of ``base``."""
    load = base + _load(entry_links, units, chunks, len(capacity))
    used = load > 1e-15
    return float(np.min(capacity[used] / load[used])) if np.any(used) else float("inf")


def _largest_remainder(block_of: np.ndarray, units: np.ndarray, chunks: int | None, n_blocks: int,
                       total: np.ndarray | None = None) -> np.ndarray:
    """Integers per entry summing to ``chunks`` (or ``total[b]``) per block: floors, then +1 to the
    entries with the largest fractional parts (Hamilton's method)."""
    whole = np.floor(units + _SNAP)
    target = np.full(n_blocks, chunks, dtype=np.int64) if total is None else np.asarray(total, dtype=np.int64)
    short = target - np.bincount(block_of, weights=whole, minlength=n_blocks).astype(np.int64)
    fraction = units - whole
    order = np.lexsort((-fraction, block_of))
    sorted_block = block_of[order]
    start = np.searchsorted(sorted_block, sorted_block, side="left")
    rank = np.arange(len(order)) - start
    bump = np.zeros(len(units), dtype=np.int64)
    bump[order] = rank < short[sorted_block]
    return whole.astype(np.int64) + bump


def _load(entry_links: np.ndarray, units: np.ndarray, chunks: int, n_links: int) -> np.ndarray:
    """Blocks per link when ``units[i]`` units take entry i's path."""
    return route_load(entry_links, units / chunks, n_links)


def route_load(route_links: np.ndarray, weight: np.ndarray, n_links: int) -> np.ndarray:
    """``Σ weight[i]`` over the routes i through each link (rows of link ids, -1 padded; a route that
    crosses a link twice counts twice)."""
    valid = route_links >= 0
    return np.bincount(route_links[valid], weights=np.broadcast_to(weight[:, None], route_links.shape)[valid],
                       minlength=n_links)


def _balance_lp(owner: np.ndarray, left: np.ndarray, entry_links: np.ndarray, load: np.ndarray,
                capacity: np.ndarray, chunks: int) -> np.ndarray:
    """min t s.t. Σ_paths w = left per block, load_a + Σ w β / K ≤ t cap_a, w ≥ 0; returns w."""
    blocks, local = np.unique(owner, return_inverse=True)
    k = len(owner)
    valid = entry_links >= 0
    touched, link_row = np.unique(entry_links[valid], return_inverse=True)
    m_blocks, m_links = len(blocks), len(touched)
    # Columns: w (k of them), then t. Rows: block equalities, then link rows load_a ≤ t cap_a.
    entry_col = np.broadcast_to(np.arange(k)[:, None], entry_links.shape)[valid]
    base_util = float(np.max(load / capacity))
    model = highs.new_model(threads=1)
    inf = highs.INF
    lower = np.concatenate([left[blocks].astype(float), np.full(m_links, -inf)])
    upper = np.concatenate([left[blocks].astype(float), -load[touched]])
    model.addRows(m_blocks + m_links, lower, upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
    # Entries of w: block row (1) and one per link crossing (β / K, repeated links add up).
    key = entry_col.astype(np.int64) * m_links + link_row
    unique_key, counts = np.unique(key, return_counts=True)
    cols = unique_key // m_links
    rows = m_blocks + unique_key % m_links
    all_cols = np.concatenate([np.arange(k), cols])
    all_rows = np.concatenate([local, rows])
    all_vals = np.concatenate([np.ones(k), counts / chunks])
    order = np.lexsort((all_rows, all_cols))
    starts = np.searchsorted(all_cols[order], np.arange(k + 1))
    model.addCols(k, np.zeros(k), np.zeros(k), left[blocks][local].astype(float), len(order),
                  starts[:-1].astype(np.int32), all_rows[order].astype(np.int32), all_vals[order])
    # t: minimise; -cap_a in every link row; at least the utilization the fixed units already cause.
    model.addCols(1, np.ones(1), np.full(1, base_util), np.full(1, inf), m_links, np.zeros(1, np.int32),
                  (m_blocks + np.arange(m_links)).astype(np.int32), -capacity[touched])
    highs.require_optimal(model, "the AllToAll rounding LP")
    return np.clip(np.asarray(model.getSolution().col_value)[:k], 0.0, None)


def _greedy(block_of: np.ndarray, left: np.ndarray, fixed: np.ndarray, entry_links: np.ndarray,
            capacity: np.ndarray, chunks: int, base: np.ndarray) -> None:
    """Place leftover units one at a time on the path whose busiest link stays least busy."""
    load = base + _load(entry_links, fixed, chunks, len(capacity))
    for b in np.flatnonzero(left > 0):
        entries = np.flatnonzero(block_of == b)
        for _ in range(int(left[b])):
            util = [np.max((load[links[links >= 0]] + 1 / chunks) / capacity[links[links >= 0]])
                    for links in entry_links[entries]]
            pick = entries[int(np.argmin(util))]
            fixed[pick] += 1
            links = entry_links[pick]
            np.add.at(load, links[links >= 0], 1 / chunks)
        left[b] = 0
