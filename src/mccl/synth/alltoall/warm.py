"""Warm start: the previous schedule's routes that still exist become the first columns.

A deployed AllToAll schedule records, for every chunk, the transfers (with
routes) that carry it from its source through relays to its destination. Glued
together they are one path per chunk. On the new topology (capacities changed,
links possibly gone, mccl-paper §4.1) a path is kept when each of its link ids
is a link of the new LP network and the links chain from the chunk's source GPU
to its destination GPU. For every block the kept paths are numbered; tree j of a
block takes the j-th path to each destination (cycling through a destination's
paths, and taking the cheapest fresh path where a destination has none left), so
every kept route appears in some column and the master starts near the old
solution. Column generation then prices from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mccl.errors import SynthesisError
from mccl.schedule import Collective, Schedule
from mccl.synth.alltoall.network import Network
from mccl.synth.alltoall.pool import ColumnPool
from mccl.synth.alltoall.pricing import PathBatch
from mccl.topology import Topology

__all__ = ["WarmStart", "seed_from_schedule", "check_previous"]


@dataclass(frozen=True)
class WarmStart:
    routes: int  # distinct (pair, path) routes in the previous schedule
    kept: int  # of those, still valid on the new network
    columns: int  # columns seeded
    restarted: bool = False  # from the previous run's solver state (:mod:`.state`), not from its routes
    fell_back: bool = False  # the seeded master took too many pivots: the run restarted cold (pipeline)
    abandoned_pivots: int = 0  # simplex pivots spent on the seeded master before falling back

    @property
    def kept_fraction(self) -> float:
        return self.kept / self.routes if self.routes else 0.0


def _base_name(name: str) -> str:
    """A topology's name without the faults appended to it (``X+Fail2(gpu0)`` -> ``X``)."""
    return name.split("+", 1)[0]


def check_previous(previous: Schedule, ranks: Sequence[str] | None, topology: Topology) -> tuple[str, ...]:
    """The ranks of a warm start: the previous schedule's, which ``ranks`` (if given) must equal.

    A schedule made for another fabric (its topology's name, faults aside, differs) is refused.
    """
    if not isinstance(previous, Schedule):
        raise SynthesisError(f"previous must be a Schedule, got {type(previous).__name__}")
    made_for = previous.meta.topology
    if made_for and _base_name(made_for) != _base_name(topology.name):
        raise SynthesisError(f"the previous schedule was made for topology {made_for!r}, not {topology.name!r}; "
                             "a warm start needs a schedule of the same fabric")
    if previous.collective is not Collective.ALLTOALL:
        raise SynthesisError(f"cannot warm-start an AllToAll from a schedule for {previous.collective.value}")
    if ranks is not None and tuple(ranks) != previous.ranks:
        raise SynthesisError("the previous schedule's ranks differ from the requested ranks; "
                             "a warm start needs the same ranks in the same order")
    return previous.ranks


def _chunk_paths(previous: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(chunk, offsets, links)``: every chunk's transfers glued in step order (topology link ids)."""
    transfers = previous.transfers
    order = np.lexsort((transfers.step, transfers.chunk))
    lengths = transfers.route_lengths[order]
    starts = np.repeat(transfers.route_offsets[:-1][order], lengths)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    links = transfers.route_links[starts + within].astype(np.int64)
    per_chunk = np.bincount(transfers.chunk[order], weights=lengths, minlength=len(previous.chunks)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(per_chunk)])
    return np.arange(len(previous.chunks)), offsets, links


def seed_from_schedule(previous: Schedule, network: Network, pool: ColumnPool, fallback: PathBatch,
                       max_trees: int = 10) -> WarmStart:
    """Add the previous schedule's still-valid routes to ``pool`` as trees (see module docstring).

    ``fallback`` holds one fresh path per (source, destination) for all sources.
    """
    n = network.n_ranks
    topo_to_net = np.full(len(network.topology.links), -1, dtype=np.int64)
    topo_to_net[network.link_ids] = np.arange(network.n_links)
    chunk, offsets, topo_links = _chunk_paths(previous)
    in_range = (topo_links >= 0) & (topo_links < len(topo_to_net))
    links = np.where(in_range, topo_to_net[np.where(in_range, topo_links, 0)], -1)
    lengths = np.diff(offsets)
    width = int(lengths.max(initial=1))
    matrix = np.full((len(chunk), width), -1, dtype=np.int64)
    row = np.repeat(chunk, lengths)
    col = np.arange(len(links)) - np.repeat(offsets[:-1], lengths)
    matrix[row, col] = links
    source = previous.chunks.source.astype(np.int64)
    dest = previous.chunks.destination.astype(np.int64)
    ok = (lengths > 0) & ~np.any((matrix < 0) & (_columns(width) < lengths[:, None]), axis=1)
    safe = np.maximum(matrix, 0)
    chained = (network.head[safe[:, :-1]] == network.tail[safe[:, 1:]]) | (_columns(width)[:, 1:] >= lengths[:, None])
    ok &= np.all(chained, axis=1) if width > 1 else True
    ok &= network.tail[safe[:, 0]] == network.rank_node[source]
    ok &= network.head[safe[np.arange(len(chunk)), np.maximum(lengths - 1, 0)]] == network.rank_node[dest]
    pair = source * n + dest
    routes = len(np.unique(np.column_stack([pair, matrix]), axis=0))
    if not np.any(ok):
        raise SynthesisError(f"the previous schedule does not fit topology {network.topology.name!r}: none of its "
                             f"{routes} routes exists there (is it a schedule for another topology?)")
    path_ids = pool.register_paths(matrix[ok])
    kept_pair = pair[ok]
    unique = np.unique(kept_pair * (pool.paths.shape[0] + 1) + path_ids)
    kept_pair, kept_path = unique // (pool.paths.shape[0] + 1), unique % (pool.paths.shape[0] + 1)
    count = np.bincount(kept_pair, minlength=n * n)
    first = np.concatenate([[0], np.cumsum(count)])[:-1]
    fallback_ids = np.full(n * n, -1, dtype=np.int64)
    fallback_pairs = (fallback.sources[:, None] * n + fallback.destinations).ravel()
    fallback_ids[fallback_pairs] = pool.register_paths(fallback.links)
    blocks = pool.blocks
    block_pair = np.repeat(blocks.source, blocks.sizes) * n + blocks.dests
    # A block needs as many trees as its destination with the most kept paths has paths.
    block_depth = np.minimum(np.maximum(np.maximum.reduceat(count[block_pair], blocks.offsets[:-1]), 1), max_trees)
    columns = 0
    for j in range(int(block_depth.max(initial=1))):
        chosen = np.flatnonzero(block_depth > j)
        entries = _entries(blocks.offsets, chosen)
        p = block_pair[entries]
        has = count[p] > 0
        ids = np.where(has, kept_path[np.minimum(first[p] + j % np.maximum(count[p], 1), len(kept_path) - 1)],
                       fallback_ids[p])
        columns += pool.add_trees(chosen, ids.astype(np.int32))
    return WarmStart(routes=routes, kept=int(len(unique)), columns=columns)


def _columns(width: int) -> np.ndarray:
    return np.arange(width)[None, :]


def _entries(offsets: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    sizes = offsets[chosen + 1] - offsets[chosen]
    return np.repeat(offsets[chosen], sizes) + np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
