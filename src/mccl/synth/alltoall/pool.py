"""Commodity blocks and the columns generated so far (trees as path ids, paths as links).

A commodity block is a source rank and a set of destinations it sends distinct
data to; the master has one convexity row per block. ``grouping="tensor"`` is
the paper's choice, one block per source with every other rank as destination.
``grouping="host"`` splits a source's destinations by host: the LP optimum is
the same (a tree's cost separates over destinations, so any combination of
per-host subtrees is a tree), but a new route to one host costs the master a
column of ~10 entries instead of one of ~n, which keeps large masters sparse.

Trees of a block share most of their paths, so paths are stored once
(``paths``: network link ids, -1 padded) and a column is the list of path ids
it takes to the block's destinations (CSR, in the block's destination order).
Paths and trees are recognised by 64-bit hashes of their rows, so a tree that
pricing finds twice enters the master once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl.synth.alltoall.network import Network
from mccl.synth.alltoall.pricing import PathBatch

__all__ = ["Blocks", "ColumnPool", "make_blocks", "row_hashes", "GROUPINGS"]

_MIX = np.uint64(0x9E3779B97F4A7C15)
GROUPINGS = ("tensor", "host")


def row_hashes(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row of an integer matrix (wrapping uint64 arithmetic)."""
    h = np.full(rows.shape[0], 0xCBF29CE484222325, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in range(rows.shape[1]):
            h = (h ^ (rows[:, column].astype(np.int64).astype(np.uint64) + np.uint64(column + 1))) * _MIX
            h ^= h >> np.uint64(29)
    return h


@dataclass(frozen=True, eq=False)
class Blocks:
    """Commodity blocks: ``source[b]`` sends to ``dests[offsets[b]:offsets[b+1]]`` (ranks)."""

    source: np.ndarray
    offsets: np.ndarray
    dests: np.ndarray
    pair_block: np.ndarray  # (n, n): block of pair (s, d), -1 on the diagonal
    pair_slot: np.ndarray  # (n, n): position of d in its block's destination list

    def __len__(self) -> int:
        return len(self.source)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)


def make_blocks(network: Network, grouping: str = "tensor") -> Blocks:
    """The master's commodity blocks for an AllToAll over the network's ranks."""
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
    n = network.n_ranks
    if grouping == "tensor":
        group = np.zeros(n, dtype=np.int64)
    else:
        hosts = [network.topology.node(gpu).host or gpu for gpu in network.ranks]
        group = np.unique(np.array(hosts, dtype=object), return_inverse=True)[1].astype(np.int64)
    n_groups = int(group.max()) + 1
    source, dests, sizes = [], [], []
    pair_block = np.full((n, n), -1, dtype=np.int64)
    pair_slot = np.full((n, n), -1, dtype=np.int64)
    for s in range(n):
        for g in range(n_groups):
            members = np.flatnonzero((group == g) & (np.arange(n) != s))
            if members.size == 0:
                continue
            pair_block[s, members] = len(source)
            pair_slot[s, members] = np.arange(members.size)
            source.append(s)
            dests.append(members)
            sizes.append(members.size)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return Blocks(np.array(source, dtype=np.int64), offsets, np.concatenate(dests).astype(np.int64),
                  pair_block, pair_slot)


class ColumnPool:
    """Trees (columns of the master), each of one block, as path ids in CSR layout."""

    def __init__(self, blocks: Blocks, n_ranks: int, n_links: int) -> None:
        self.blocks = blocks
        self.n_ranks = n_ranks
        self.n_links = n_links
        self._paths = np.full((0, 1), -1, dtype=np.int32)
        self._n_paths = 0
        self._known_hashes = np.zeros(0, dtype=np.uint64)  # sorted hashes of the stored paths
        self._known_ids = np.zeros(0, dtype=np.int64)
        self._block: list[np.ndarray] = []
        self._path_ids: list[np.ndarray] = []  # flat, per added batch
        self._n_trees = 0
        self._tree_keys: set[tuple[int, int]] = set()
        self._cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def copy(self) -> ColumnPool:
        """An independent pool with the same paths and trees (a warm restart adds to the copy)."""
        other = ColumnPool(self.blocks, self.n_ranks, self.n_links)
        other._paths = self._paths.copy()  # rows past _n_paths get written by register_paths
        other._n_paths = self._n_paths
        other._known_hashes, other._known_ids = self._known_hashes, self._known_ids  # replaced, never written
        other._block = list(self._block)
        other._path_ids = list(self._path_ids)
        other._n_trees = self._n_trees
        other._tree_keys = set(self._tree_keys)
        return other

    # -- reading -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n_trees

    def _flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._cache is None or len(self._cache[0]) != self._n_trees:
            block = np.concatenate(self._block) if self._block else np.zeros(0, dtype=np.int64)
            flat = np.concatenate(self._path_ids) if self._path_ids else np.zeros(0, dtype=np.int32)
            offsets = np.concatenate([[0], np.cumsum(self.blocks.sizes[block])]).astype(np.int64)
            self._cache = (block, offsets, flat)
        return self._cache

    @property
    def block(self) -> np.ndarray:
        """The block of every column."""
        return self._flat()[0]

    def column_paths(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, path ids)``: column k takes ``ids[offsets[k]:offsets[k+1]]`` to its block's dests."""
        _, offsets, flat = self._flat()
        return offsets, flat

    @property
    def paths(self) -> np.ndarray:
        """``(paths, H)`` network link ids, -1 padded."""
        return self._paths[: self._n_paths]

    # -- adding ------------------------------------------------------------------------------
    def register_paths(self, links: np.ndarray) -> np.ndarray:
        """Path ids of ``links`` rows (-1 padded), storing the new ones."""
        width = links.shape[1]
        if width > self._paths.shape[1]:
            pad = np.full((self._paths.shape[0], width - self._paths.shape[1]), -1, dtype=np.int32)
            self._paths = np.hstack([self._paths, pad])
        elif width < self._paths.shape[1]:
            links = np.hstack([links, np.full((links.shape[0], self._paths.shape[1] - width), -1, dtype=links.dtype)])
        hashes = row_hashes(links)
        unique, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        position = np.searchsorted(self._known_hashes, unique)
        clipped = np.minimum(position, max(len(self._known_hashes) - 1, 0))
        known = (self._known_hashes[clipped] == unique) if len(self._known_hashes) else np.zeros(len(unique), bool)
        ids = np.empty(len(unique), dtype=np.int64)
        ids[known] = self._known_ids[clipped[known]]
        fresh = np.flatnonzero(~known)
        if fresh.size:
            ids[fresh] = self._n_paths + np.arange(fresh.size)
            rows = links[first[fresh]]
            need = self._n_paths + len(rows)
            if need > self._paths.shape[0]:
                grown = np.full((max(need, 2 * self._paths.shape[0]), self._paths.shape[1]), -1, dtype=np.int32)
                grown[: self._n_paths] = self._paths[: self._n_paths]
                self._paths = grown
            self._paths[self._n_paths:need] = rows
            self._n_paths = need
            merged = np.concatenate([self._known_hashes, unique[fresh]])
            merged_ids = np.concatenate([self._known_ids, ids[fresh]])
            order = np.argsort(merged, kind="stable")
            self._known_hashes, self._known_ids = merged[order], merged_ids[order]
        return ids[inverse]

    def add_batch(self, batch: PathBatch, blocks: np.ndarray) -> int:
        """Add, for each block in ``blocks`` (whose sources the batch covers), its subtree from
        the batch, when new. Returns the number of columns added."""
        blocks = np.asarray(blocks, dtype=np.int64)
        if blocks.size == 0:
            return 0
        n = self.n_ranks
        row_of_source = np.full(n, -1, dtype=np.int64)
        row_of_source[batch.sources] = np.arange(len(batch.sources))
        source = self.blocks.source[blocks]
        sizes = self.blocks.sizes[blocks]
        dest = _gather(self.blocks, blocks)
        src_rep = np.repeat(source, sizes)
        pair_row = row_of_source[src_rep] * (n - 1) + dest - (dest > src_rep)
        path_ids = self.register_paths(batch.links[pair_row]).astype(np.int32)
        return self._append(blocks, sizes, path_ids)

    def add_trees(self, blocks: np.ndarray, path_ids: np.ndarray) -> int:
        """Add trees given as path ids (concatenated, each in its block's destination order)."""
        blocks = np.asarray(blocks, dtype=np.int64)
        return self._append(blocks, self.blocks.sizes[blocks], np.asarray(path_ids, dtype=np.int32)) if blocks.size else 0

    def _append(self, blocks: np.ndarray, sizes: np.ndarray, path_ids: np.ndarray) -> int:
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        keys = _segment_hashes(path_ids, offsets)
        keep: list[int] = []
        for i, (b, key) in enumerate(zip(blocks.tolist(), keys.tolist(), strict=True)):
            if (b, key) not in self._tree_keys:
                self._tree_keys.add((b, key))
                keep.append(i)
        if not keep:
            return 0
        chosen = np.asarray(keep)
        if len(chosen) == len(blocks):
            kept_ids = path_ids
        else:
            mask = np.zeros(len(blocks), dtype=bool)
            mask[chosen] = True
            kept_ids = path_ids[np.repeat(mask, sizes)]
        self._block.append(blocks[chosen])
        self._path_ids.append(kept_ids)
        self._n_trees += len(chosen)
        return len(chosen)

    # -- the master's view ----------------------------------------------------------------------
    def coefficients(self, first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Columns ``first..`` as ``(block, starts, links, counts)`` (β in CSC layout)."""
        block, offsets, flat = self._flat()
        columns = np.arange(first, len(block))
        ids = flat[offsets[first]:]
        owner = np.repeat(np.arange(len(columns)), np.diff(offsets[first:]))
        path_links = self.paths[ids]  # (entries, H)
        valid = path_links >= 0
        keys = np.broadcast_to(owner[:, None], path_links.shape)[valid].astype(np.int64) * self.n_links \
            + path_links[valid]
        unique, counts = np.unique(keys, return_counts=True)
        col = unique // self.n_links
        starts = np.searchsorted(col, np.arange(len(columns) + 1))
        return block[first:], starts, unique % self.n_links, counts.astype(float)


def _gather(blocks: Blocks, chosen: np.ndarray) -> np.ndarray:
    """Concatenated destination lists of the chosen blocks (vectorized)."""
    sizes = blocks.sizes[chosen]
    starts = np.repeat(blocks.offsets[chosen], sizes)
    within = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return blocks.dests[starts + within]


def _segment_hashes(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A 64-bit hash per CSR segment of ``values``."""
    sizes = np.diff(offsets)
    result = np.zeros(len(sizes), dtype=np.uint64)
    for width in np.unique(sizes):
        rows = np.flatnonzero(sizes == width)
        matrix = values[offsets[rows][:, None] + np.arange(width)[None, :]]
        result[rows] = row_hashes(matrix)
    return result
