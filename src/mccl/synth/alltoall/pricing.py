"""Pricing: the cheapest source-rooted tree of each tensor under link prices (mccl-paper §4.2).

A tree of tensor c (source rank s) is one path from s to every other rank; its
cost under link prices α_a is ``Σ_a β_a(T) α_a``, with β_a(T) the number of its
paths that cross link a. The cost separates over destinations, so the cheapest
tree is the union of the cheapest path to each destination: a shortest-path tree.

Paths live on the time-expanded graph G̃ of §4.2: layer ℓ holds a copy of every
node; a link into a switch stays in its layer (a switch forwards within a step),
a link into a GPU moves one layer up (a transfer takes a step; a GPU may relay).
With ``max_steps = m`` there are layers 0..m, so every path has at most m
transfers (the paper's m_s = m + 1 node copies). Without a step bound the
layers collapse into the plain graph: prices are non-negative, so a cheapest path
can be taken simple, and a simple path fits in |V| − 1 steps, which is the
paper's default m_s = |V| − 1; the plain graph is the same search on |V| nodes
instead of |V|².

Shortest paths come from scipy's compiled Dijkstra (``scipy.sparse.csgraph``),
all sources in one call, then paths are read off the predecessor matrix hop by
hop with numpy over all (source, destination) pairs at once; no Python loop runs
per arc or per pair. Cost O(n · |Ã| log |Ṽ|) per pricing round.

Ties: every arc into a GPU costs an extra ``ε`` and every arc ``ε/64`` (both far
below the reduced-cost tolerance), so among equal-price trees the search takes
the one with fewest steps, then fewest links. ``noise`` adds random relative
perturbations that break the remaining ties differently on every call: the
master gets several diverse trees per tensor per round (the stall remedy of
issue 4), and every tree is re-priced with the true prices before it is used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from mccl.synth.alltoall.network import Network

__all__ = ["Pricer", "PathBatch"]


@dataclass(frozen=True, eq=False)
class PathBatch:
    """One path per (source, destination) pair of some sources.

    ``links[p]``: the network-link ids of path p in order, padded with -1;
    ``sources[i]`` / ``destinations[i, j]``: ranks; path of pair (i, j) is row
    ``i * (n - 1) + j``; ``cost[i, j]``: that path's price under the true
    (unperturbed) prices.
    """

    sources: np.ndarray  # (S,) ranks
    destinations: np.ndarray  # (S, n-1) ranks
    links: np.ndarray  # (S * (n-1), H) network link ids, -1 padded
    cost: np.ndarray  # (S, n-1) Σ_{a∈path} α_a


class Pricer:
    """Shortest-path trees on the time-expanded graph of one network."""

    def __init__(self, network: Network, max_steps: int | None = None) -> None:
        if max_steps is not None and max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        self.network = network
        self.max_steps = max_steps
        n_nodes = network.n_nodes
        # Parallel links between one node pair: the search sees one arc per pair, the cheapest link.
        pair_key = network.tail * n_nodes + network.head
        self._pair_keys, self._link_pair = np.unique(pair_key, return_inverse=True)
        self._pair_tail = self._pair_keys // n_nodes
        self._pair_head = self._pair_keys % n_nodes
        self._pair_multi = np.bincount(self._link_pair).max() > 1
        self._pair_of = np.full((n_nodes, n_nodes), -1, dtype=np.int64)
        self._pair_of[self._pair_tail, self._pair_head] = np.arange(len(self._pair_keys))
        into_gpu = network.is_gpu[self._pair_head]
        layers = 1 if max_steps is None else max_steps + 1
        self._layers = layers
        # Arcs of G̃: (pair, layer); into a GPU the arc climbs a layer (none from the top layer).
        arc_pair, arc_from, arc_to = [], [], []
        for layer in range(layers):
            climb = 0 if max_steps is None else 1
            usable = np.ones(len(self._pair_keys), dtype=bool) if climb == 0 or layer < layers - 1 else ~into_gpu
            pairs = np.flatnonzero(usable)
            arc_pair.append(pairs)
            arc_from.append(layer * n_nodes + self._pair_tail[pairs])
            arc_to.append((layer + climb * into_gpu[pairs]) * n_nodes + self._pair_head[pairs])
        self._arc_pair = np.concatenate(arc_pair)
        arc_from_all, arc_to_all = np.concatenate(arc_from), np.concatenate(arc_to)
        order = np.lexsort((arc_to_all, arc_from_all))
        self._arc_pair = self._arc_pair[order]
        self._arc_to = arc_to_all[order].astype(np.int32)
        self._indptr = np.searchsorted(arc_from_all[order], np.arange(layers * n_nodes + 1)).astype(np.int32)
        self._arc_into_gpu = into_gpu[self._arc_pair]
        self._n_expanded = layers * n_nodes

    # -- prices on the search graph ----------------------------------------------------------
    def _pair_choice(self, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per node pair: the cheapest link and its cost."""
        if not self._pair_multi:
            link = np.empty(len(self._pair_keys), dtype=np.int64)
            link[self._link_pair] = np.arange(len(cost))
            return link, cost[link]
        order = np.lexsort((cost, self._link_pair))
        first = np.ones(len(order), dtype=bool)
        first[1:] = self._link_pair[order][1:] != self._link_pair[order][:-1]
        link = order[first]
        return link, cost[link]

    def _search(self, cost: np.ndarray, sources: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pair_link, pair_cost = self._pair_choice(cost)
        weight = pair_cost[self._arc_pair] + epsilon / 64 + epsilon * self._arc_into_gpu
        graph = csr_matrix((weight, self._arc_to, self._indptr), shape=(self._n_expanded, self._n_expanded))
        origins = self.network.rank_node[sources]
        dist, pred = dijkstra(graph, directed=True, indices=origins, return_predecessors=True)
        return dist, pred, pair_link

    def distances(self, cost: np.ndarray, sources: np.ndarray | None = None) -> np.ndarray:
        """Exact cheapest-path prices ``(S, n)`` from each source rank to every rank (0 to itself)."""
        net = self.network
        sources = np.arange(net.n_ranks) if sources is None else np.asarray(sources)
        graph_cost = self._pair_choice(cost)[1][self._arc_pair]
        graph = csr_matrix((graph_cost, self._arc_to, self._indptr), shape=(self._n_expanded, self._n_expanded))
        dist = dijkstra(graph, directed=True, indices=net.rank_node[sources])
        per_layer = dist.reshape(len(sources), self._layers, net.n_nodes)[:, :, net.rank_node]
        return per_layer.min(axis=1)

    def trees(self, cost: np.ndarray, sources: np.ndarray, *, epsilon: float,
              noise: float = 0.0, rng: np.random.Generator | None = None) -> PathBatch:
        """The cheapest tree of each source under ``cost`` (perturbed by ``noise`` if > 0)."""
        net = self.network
        n, n_nodes = net.n_ranks, net.n_nodes
        sources = np.asarray(sources, dtype=np.int64)
        search_cost = cost
        if noise > 0:
            rng = np.random.default_rng() if rng is None else rng
            search_cost = cost * (1 + noise * rng.random(len(cost))) + epsilon / 128 * rng.random(len(cost))
        dist, pred, pair_link = self._search(search_cost, sources, epsilon)
        count = len(sources)
        destinations = np.array([np.delete(np.arange(n), s) for s in sources], dtype=np.int64).reshape(count, n - 1)
        dest_nodes = net.rank_node[destinations]
        layer_nodes = (np.arange(self._layers)[None, None, :] * n_nodes + dest_nodes[:, :, None])
        rows = np.arange(count)[:, None, None]
        best_layer = np.argmin(dist[rows, layer_nodes], axis=2)
        current = (best_layer * n_nodes + dest_nodes).ravel()
        row = np.repeat(np.arange(count), n - 1)
        origin = net.rank_node[sources][row]
        hops: list[np.ndarray] = []
        active = current != origin
        while np.any(active):
            previous = pred[row, current]
            if np.any(previous[active] < 0):
                raise RuntimeError("pricing found no path to some rank; the network check should have caught it")
            pair = self._pair_of[previous % n_nodes, current % n_nodes]
            hops.append(np.where(active, pair_link[pair], -1))
            current = np.where(active, previous, current)
            active = current != origin
        backwards = np.stack(hops, axis=1) if hops else np.empty((len(row), 0), dtype=np.int64)
        links = _reverse_padded(backwards)
        true_cost = np.where(links >= 0, cost[np.maximum(links, 0)], 0.0).sum(axis=1).reshape(count, n - 1)
        return PathBatch(sources, destinations, links, true_cost)


def _reverse_padded(backwards: np.ndarray) -> np.ndarray:
    """Rows ``[l_k, ..., l_1, -1, ...]`` to ``[l_1, ..., l_k, -1, ...]``."""
    if backwards.shape[1] == 0:
        return backwards
    lengths = (backwards >= 0).sum(axis=1)
    width = backwards.shape[1]
    column = np.arange(width)[None, :]
    source_col = lengths[:, None] - 1 - column
    valid = source_col >= 0
    out = np.full_like(backwards, -1)
    rows = np.nonzero(valid)
    out[rows] = backwards[rows[0], source_col[valid]]
    return out
