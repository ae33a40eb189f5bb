"""Warm start (ForestColl-warm, mccl-paper §4.3): what a previous schedule tells the next synthesis.

A previous AllGather schedule (or ReduceScatter, read as its reversed trees) on the
same ranks and links gives, per source rank, the rank-to-rank arcs its trees used;
Phase 3 tries those arcs first for that source (A*-like ordering: a known-good
arc before the capacity order). Its bottleneck cut, re-priced at the new
capacities, is a valid upper bound to start Phase 1 from, and its chunk count is
the first k the rounding tries. A previous schedule that does not fit the
topology (other links, other ranks, another collective) is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mccl.errors import SynthesisError
from mccl.schedule import Collective, Schedule
from mccl.synth.treepack.fabric import Fabric
from mccl.synth.treepack.tree import Tree
from mccl.topology import Topology

__all__ = ["WarmHints", "warm_hints", "kept_fraction", "previous_trees", "keep_previous_trees", "drop_crossing"]


@dataclass(frozen=True)
class WarmHints:
    """Per source rank, the arcs of its previous trees; cut node sets to try; the previous k."""

    arcs: tuple[frozenset[tuple[int, int]], ...]
    cut_sides: tuple[np.ndarray, ...]
    k: int | None


def warm_hints(previous: Schedule, topology: Topology, ranks: Sequence[str], collective: Collective,
               fabric: Fabric) -> WarmHints:
    """Hints from ``previous``; :class:`SynthesisError` naming why it cannot seed this synthesis."""
    if previous.collective is not collective:
        raise SynthesisError(f"the previous schedule is a {previous.collective.value}, not a {collective.value}; "
                             "it cannot seed this synthesis")
    if tuple(previous.ranks) != tuple(ranks):
        raise SynthesisError(f"the previous schedule has ranks {list(previous.ranks)[:4]}..., this synthesis "
                             f"{list(ranks)[:4]}...; a warm start needs the same ranks in the same order")
    problem = _misfit(previous, topology)
    if problem:
        raise SynthesisError(f"the previous schedule does not fit topology {topology.name!r} "
                             f"(made for {previous.meta.topology!r}): {problem}")
    n = len(ranks)
    transfers = previous.transfers
    if collective is Collective.ALLGATHER:
        roots = previous.chunks.source[transfers.chunk]
        tails, heads = transfers.sender, transfers.receiver
    else:  # ReduceScatter: trees reversed, rooted at the block's owner
        roots = previous.chunks.destination[transfers.chunk]
        tails, heads = transfers.receiver, transfers.sender
    arcs: list[set[tuple[int, int]]] = [set() for _ in range(n)]
    for root, tail, head in zip(roots.tolist(), tails.tolist(), heads.tolist(), strict=True):
        arcs[root].add((tail, head))
    side = np.zeros(fabric.n_nodes, dtype=bool)
    index = {name: i for i, name in enumerate(fabric.names)}
    for cut_link in previous.meta.bottleneck_cut:
        link = topology.links[cut_link.link]
        node = link.src if collective is Collective.REDUCESCATTER else link.dst
        if node in index:
            side[index[node]] = True
    sides = (side,) if side[:n].any() and not side[:n].all() else ()
    counts = np.bincount(previous.block_of_chunks(), minlength=n)
    k = int(counts[0]) if np.all(counts == counts[0]) else None
    return WarmHints(tuple(frozenset(a) for a in arcs), sides, k)


def _misfit(previous: Schedule, topology: Topology) -> str | None:
    """Why the previous schedule's routes are not routes of ``topology`` (None if they are).

    The previous schedule was validated when it was made; here only its fit to the new fabric
    matters (same links between the same nodes), checked with numpy instead of a full replay.
    """
    transfers = previous.transfers
    links = transfers.route_links.astype(np.int64)
    if len(links) == 0 or links.min() < 0 or links.max() >= len(topology.links):
        return "its routes use links that this topology does not have"
    node_index = topology.node_index
    link_src = np.array([node_index[link.src] for link in topology.links], dtype=np.int64)
    link_dst = np.array([node_index[link.dst] for link in topology.links], dtype=np.int64)
    rank_node = np.array([node_index[gpu] for gpu in previous.ranks], dtype=np.int64)
    first = transfers.route_offsets[:-1]
    last = transfers.route_offsets[1:] - 1
    if np.any(link_src[links[first]] != rank_node[transfers.sender]):
        return "a route does not start at its sender's GPU"
    if np.any(link_dst[links[last]] != rank_node[transfers.receiver]):
        return "a route does not end at its receiver's GPU"
    inner = np.ones(len(links), dtype=bool)
    inner[last] = False
    positions = np.flatnonzero(inner)
    if np.any(link_dst[links[positions]] != link_src[links[positions + 1]]):
        return "a route is not contiguous on this topology"
    is_gpu = np.array([node.is_gpu for node in topology.nodes], dtype=bool)
    if np.any(is_gpu[link_dst[links[positions]]]):
        return "a route passes through a GPU of this topology"
    return None


def kept_fraction(hints: WarmHints, trees: Sequence) -> float:
    """Share of the new trees' arcs (weighted by multiplicity) that the previous trees of the same source used."""
    used = sum(tree.multiplicity * len(tree.edges) for tree in trees)
    kept = sum(tree.multiplicity * sum((e in hints.arcs[tree.root]) for e in tree.edges) for tree in trees)
    return kept / used if used else 0.0


def previous_trees(previous: Schedule, collective: Collective) -> list[Tree]:
    """The previous schedule's trees (AllGather view: ReduceScatter trees reversed), identical chunks grouped.

    Each tree keeps its physical routes (link ids, in AllGather direction on the fabric the
    synthesis runs on, i.e. the reversed fabric for ReduceScatter). Chunks are compared by the
    bytes of their transfer columns, and only one chunk per group is decoded.
    """
    transfers = previous.transfers
    order = np.lexsort((transfers.receiver, transfers.sender, transfers.step, transfers.chunk))
    lengths = transfers.route_lengths[order]
    starts = transfers.route_offsets[:-1][order]
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    links = transfers.route_links[shift + np.arange(int(lengths.sum()))]
    link_bounds = np.concatenate([[0], np.cumsum(lengths)])
    chunk_col = transfers.chunk[order]
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(chunk_col)) + 1, [len(order)]])
    reverse = collective is Collective.REDUCESCATTER
    roots = previous.chunks.destination if reverse else previous.chunks.source
    senders, receivers = transfers.sender[order], transfers.receiver[order]
    groups: dict[bytes, Tree] = {}
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        root = int(roots[chunk_col[a]])
        key = b"".join((np.int64(root).tobytes(), senders[a:b].tobytes(), receivers[a:b].tobytes(),
                        lengths[a:b].tobytes(), links[link_bounds[a]:link_bounds[b]].tobytes()))
        if key in groups:
            groups[key].multiplicity += 1
            continue
        edges, routes = [], []
        for i in range(a, b):
            route = tuple(links[link_bounds[i]:link_bounds[i + 1]].tolist())
            if reverse:  # REDUCE v -> u is the AllGather edge u -> v on the reversed fabric
                edges.append((int(receivers[i]), int(senders[i])))
                routes.append(route[::-1])
            else:
                edges.append((int(senders[i]), int(receivers[i])))
                routes.append(route)
        groups[key] = Tree(root, 1, edges, {}, 0, routes)
    trees = list(groups.values())
    for tree in trees:
        _order_edges(tree)
    return trees


def _order_edges(tree: Tree) -> None:
    """Parents before children (ReduceScatter steps run the other way); depth of every reached rank."""
    depth = {tree.root: 0}
    pending = list(zip(tree.edges, tree.routes or [], strict=True))
    ordered: list[tuple[tuple[int, int], tuple[int, ...]]] = []
    while pending:
        rest = []
        for edge, route in pending:
            if edge[0] in depth:
                depth[edge[1]] = depth[edge[0]] + 1
                ordered.append((edge, route))
            else:
                rest.append((edge, route))
        if len(rest) == len(pending):
            break
        pending = rest
    tree.edges = [edge for edge, _ in ordered]
    tree.routes = [route for _, route in ordered]
    tree.depth = depth
    tree.preferred = len(tree.edges)


def keep_previous_trees(trees: Sequence[Tree], fabric: Fabric, units: np.ndarray, k: int,
                        n_links: int) -> tuple[list[Tree], np.ndarray, np.ndarray]:
    """Keep as many previous trees as the new integer capacities allow (at most k per root).

    Returns the kept trees, the residual units per fabric arc, and the trees still needed per root.
    """
    n = fabric.n_ranks
    arc_of_link = np.full(n_links, -1, dtype=np.int64)
    arc_of_link[fabric.link] = np.arange(fabric.n_arcs)
    residual = units.copy()
    need = np.full(n, k, dtype=np.int64)
    kept: list[Tree] = []
    for tree in sorted(trees, key=lambda t: -t.multiplicity):
        if len(tree.depth) != n or tree.routes is None:
            continue
        links = np.fromiter((link for route in tree.routes for link in route), dtype=np.int64)
        arcs = arc_of_link[links]
        if np.any(arcs < 0):
            continue
        used = np.bincount(arcs, minlength=fabric.n_arcs)
        touched = np.flatnonzero(used)
        fits = int(np.min(residual[touched] // used[touched])) if len(touched) else 0
        take = min(tree.multiplicity, fits, int(need[tree.root]))
        if take <= 0:
            continue
        residual[touched] -= take * used[touched]
        need[tree.root] -= take
        kept.append(Tree(tree.root, take, list(tree.edges), dict(tree.depth), len(tree.edges), list(tree.routes)))
    return kept, residual, need


def drop_crossing(kept: list[Tree], residual: np.ndarray, need: np.ndarray, fabric: Fabric, side: np.ndarray,
                  n_links: int) -> list[Tree]:
    """Give back the kept trees that enter the node set ``side`` (a cut the rest cannot cross)."""
    arc_of_link = np.full(n_links, -1, dtype=np.int64)
    arc_of_link[fabric.link] = np.arange(fabric.n_arcs)
    entering = side[fabric.head] & ~side[fabric.tail]
    still: list[Tree] = []
    for tree in kept:
        arcs = arc_of_link[np.fromiter((link for route in tree.routes or () for link in route), dtype=np.int64)]
        if np.any(entering[arcs]):
            np.add.at(residual, arcs, tree.multiplicity)
            need[tree.root] += tree.multiplicity
        else:
            still.append(tree)
    return still
