"""The fabric as an immutable value: GPUs, switches and directed links.

A :class:`Topology` is a plain value (frozen dataclass of tuples). Link ids are the
positions of the links in ``Topology.links``, so per-link quantities elsewhere in
mccl (capacities, loads, chunk counts) are numpy arrays indexed by link id. A
full-duplex cable is two directed links. Capacities are in Gbit/s, latencies in µs.

Derived views (lookups by id, adjacency, capacity arrays) are computed once on
first use and cached on the instance; they are functions of the value, so caching
them does not make the value mutable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from mccl.errors import TopologyError

__all__ = ["NodeKind", "Node", "Link", "Topology", "SWITCH_KINDS", "disconnected_gpu"]


class NodeKind(StrEnum):
    """What a node is. Only GPUs run ranks; every other kind only forwards."""

    GPU = "gpu"
    NVSWITCH = "nvswitch"  # an intra-host switch (NVSwitch, or PCIe on hosts without NVLink)
    TOR = "tor"  # top-of-rack / leaf switch
    AGGREGATION = "aggregation"  # spine or aggregation layer
    SWITCH = "switch"  # a switch with no layer of its own (single switch, ring of switches)


SWITCH_KINDS = frozenset(kind for kind in NodeKind if kind is not NodeKind.GPU)
# the slowest link may be this share of the fastest, no less: below it the solvers' tolerances (HiGHS,
# the tree packing's integral rate search) cannot tell the link from a dead one; measured on a 4-GPU
# switch of 100 Gbit/s links, one at 1e-14 of the rest: the packing's rate search raised ArithmeticError
# and the AllToAll came out with no chunks; at 1e-11 both still synthesized (the packing in 45 s)
MIN_CAPACITY_RATIO = 1e-9


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU or a switch. GPUs carry locality labels; switches may carry some too."""

    id: str
    kind: NodeKind
    host: str | None = None
    rail: int | None = None
    rack: str | None = None
    segment: str | None = None
    pod: str | None = None

    @property
    def is_gpu(self) -> bool:
        return self.kind is NodeKind.GPU


@dataclass(frozen=True, slots=True)
class Link:
    """One directed edge: ``src`` sends to ``dst`` at ``gbps`` after ``latency_us``."""

    id: int
    src: str
    dst: str
    gbps: float
    latency_us: float


@dataclass(frozen=True)
class Topology:
    """A fabric. Construction checks every rule; an invalid topology cannot exist."""

    name: str
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "links", tuple(self.links))
        _check(self.nodes, self.links)

    # -- construction helpers -------------------------------------------------
    @staticmethod
    def from_edges(
        name: str,
        nodes: Iterable[Node],
        edges: Iterable[tuple[str, str, float, float]],
    ) -> Topology:
        """Build from ``(src, dst, gbps, latency_us)`` tuples; ids follow the order."""
        links = tuple(
            Link(index, src, dst, float(gbps), float(latency))
            for index, (src, dst, gbps, latency) in enumerate(edges)
        )
        return Topology(name, tuple(nodes), links)

    def with_links(self, links: Sequence[Link], name: str | None = None) -> Topology:
        """A new topology with the same nodes and these links."""
        return Topology(self.name if name is None else name, self.nodes, tuple(links))

    def with_capacities(self, gbps: Sequence[float] | np.ndarray, name: str | None = None) -> Topology:
        """A new topology whose link ``i`` has capacity ``gbps[i]`` (same structure)."""
        values = np.asarray(gbps, dtype=float)
        if values.shape != (len(self.links),):
            raise TopologyError(
                f"expected {len(self.links)} capacities, one per link, got shape {values.shape}"
            )
        # Only capacities change, so only the capacity rules are checked again, and the lookups that do not
        # depend on capacity are carried over. Why: the controller re-weights a 512-GPU fabric (3,072 links)
        # per measured drift; a `replace` per link and the full construction check took ~16 ms of CPU.
        links = tuple(link if link.gbps == value else Link(link.id, link.src, link.dst, value, link.latency_us)
                      for link, value in zip(self.links, values.tolist(), strict=True))
        if len(values) and not (np.all(np.isfinite(values)) and values.min() > 0
                                and values.min() >= values.max() * MIN_CAPACITY_RATIO):
            _check_capacities(links)  # raises, naming the link, with the construction check's message
        topology = object.__new__(Topology)
        object.__setattr__(topology, "name", self.name if name is None else name)
        object.__setattr__(topology, "nodes", self.nodes)
        object.__setattr__(topology, "links", links)
        for key in _STRUCTURAL_LOOKUPS & self.__dict__.keys():
            topology.__dict__[key] = self.__dict__[key]
        return topology

    # -- lookups --------------------------------------------------------------
    @cached_property
    def node_index(self) -> dict[str, int]:
        return {node.id: index for index, node in enumerate(self.nodes)}

    def node(self, node_id: str) -> Node:
        try:
            return self.nodes[self.node_index[node_id]]
        except KeyError:
            raise TopologyError(f"topology {self.name!r} has no node {node_id!r}") from None

    def link(self, link_id: int) -> Link:
        if not 0 <= link_id < len(self.links):
            raise TopologyError(f"topology {self.name!r} has no link {link_id}")
        return self.links[link_id]

    @cached_property
    def gpus(self) -> tuple[str, ...]:
        """GPU ids in node order; the default rank order."""
        return tuple(node.id for node in self.nodes if node.is_gpu)

    @cached_property
    def out_links(self) -> dict[str, tuple[int, ...]]:
        table: dict[str, list[int]] = {node.id: [] for node in self.nodes}
        for link in self.links:
            table[link.src].append(link.id)
        return {key: tuple(value) for key, value in table.items()}

    @cached_property
    def _links_by_pair(self) -> dict[tuple[str, str], tuple[int, ...]]:
        table: dict[tuple[str, str], list[int]] = {}
        for link in self.links:
            table.setdefault((link.src, link.dst), []).append(link.id)
        return {key: tuple(value) for key, value in table.items()}

    def links_between(self, src: str, dst: str) -> tuple[int, ...]:
        """Ids of the directed links from ``src`` to ``dst`` (empty when none)."""
        return self._links_by_pair.get((src, dst), ())

    def link_between(self, src: str, dst: str) -> Link:
        """The one directed link ``src → dst``; an error names the pair when there is none."""
        ids = self.links_between(src, dst)
        if not ids:
            raise TopologyError(f"topology {self.name!r} has no link {src} -> {dst}")
        return self.links[ids[0]]

    @cached_property
    def capacities_gbps(self) -> np.ndarray:
        values = np.array([link.gbps for link in self.links], dtype=float)
        values.setflags(write=False)
        return values

    @cached_property
    def link_endpoints(self) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)``: per link id, the node positions (in ``nodes``) it leaves and enters (read-only int64)."""
        index = self.node_index
        src = np.array([index[link.src] for link in self.links], dtype=np.int64)
        dst = np.array([index[link.dst] for link in self.links], dtype=np.int64)
        src.setflags(write=False)
        dst.setflags(write=False)
        return src, dst

    @cached_property
    def latencies_us(self) -> np.ndarray:
        values = np.array([link.latency_us for link in self.links], dtype=float)
        values.setflags(write=False)
        return values

    def gpu_neighbors(self, gpu: str, kind: NodeKind) -> tuple[str, ...]:
        """Nodes of ``kind`` that ``gpu`` has an outgoing link to."""
        return tuple(
            self.links[i].dst for i in self.out_links[gpu] if self.node(self.links[i].dst).kind is kind
        )

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.kind.value] = counts.get(node.kind.value, 0) + 1
        counts["links"] = len(self.links)
        return counts


def disconnected_gpu(nodes: Sequence[Node], links: Sequence[Link]) -> tuple[str, str] | None:
    """A GPU that cannot reach, or be reached by, the others, and a sentence saying so; or None.

    Every GPU must reach every other over directed links (a collective needs it); that holds
    exactly when all GPUs lie in one strongly connected component. The GPU named is the first
    (in node order) outside the component holding the most GPUs — the one a user has to fix,
    e.g. a GPU whose links were left out, not the fabric's first GPU that merely fails to reach it.
    """
    index = {node.id: i for i, node in enumerate(nodes)}
    gpu_positions = [i for i, node in enumerate(nodes) if node.is_gpu]
    if len(gpu_positions) < 2:
        return None
    rows = [index[link.src] for link in links]
    cols = [index[link.dst] for link in links]
    graph = csr_matrix((np.ones(len(links)), (rows, cols)), shape=(len(nodes), len(nodes)))
    _, labels = connected_components(graph, directed=True, connection="strong")
    gpu_labels = labels[gpu_positions]
    sizes = np.bincount(gpu_labels)
    if sizes.max() == len(gpu_positions):
        return None
    main = int(gpu_labels[int(np.flatnonzero(sizes[gpu_labels] == sizes.max())[0])])  # ties: the first GPU's
    culprit = next(p for p in gpu_positions if labels[p] != main)
    anchor = next(p for p in gpu_positions if labels[p] == main)
    name, other = nodes[culprit].id, nodes[anchor].id
    outgoing, incoming = rows.count(culprit), cols.count(culprit)
    if not outgoing and not incoming:
        return name, f"GPU {name!r} has no links: it cannot reach any other GPU (the fabric is disconnected)"
    if not outgoing:
        return name, f"GPU {name!r} has no outgoing links: it cannot reach GPU {other!r} (the fabric is disconnected)"
    if not incoming:
        return name, (f"GPU {name!r} has no incoming links: GPU {other!r} cannot reach it "
                      "(the fabric is disconnected)")
    if not _reachable(graph, culprit)[anchor]:
        return name, f"GPU {name!r} cannot reach GPU {other!r}: the fabric is disconnected"
    return name, f"GPU {other!r} cannot reach GPU {name!r}: the fabric is disconnected"


def _reachable(graph: csr_matrix, start: int) -> np.ndarray:
    from scipy.sparse.csgraph import breadth_first_order

    order = breadth_first_order(graph, start, directed=True, return_predecessors=False)
    seen = np.zeros(graph.shape[0], dtype=bool)
    seen[order] = True
    return seen


def _check(nodes: Sequence[Node], links: Sequence[Link]) -> None:
    seen: set[str] = set()
    for node in nodes:
        if not isinstance(node.id, str) or not node.id:
            raise TopologyError(f"node id {node.id!r} must be a non-empty string")
        if node.id in seen:
            raise TopologyError(f"duplicate node id {node.id!r}")
        if not isinstance(node.kind, NodeKind):
            raise TopologyError(f"node {node.id!r} has unknown kind {node.kind!r}")
        seen.add(node.id)
    if not any(node.is_gpu for node in nodes):
        raise TopologyError("a topology needs at least one GPU")
    for position, link in enumerate(links):
        if link.id != position:
            raise TopologyError(f"link at position {position} has id {link.id}; link ids are positions")
        for end in (link.src, link.dst):
            if end not in seen:
                raise TopologyError(f"link {link.id} ({link.src} -> {link.dst}) names unknown node {end!r}")
        if link.src == link.dst:
            raise TopologyError(f"link {link.id} is a self-loop on {link.src!r}")
        _check_capacity(link)
        if not (math.isfinite(link.latency_us) and link.latency_us >= 0):
            raise TopologyError(
                f"link {link.id} ({link.src} -> {link.dst}) has latency {link.latency_us} µs; it must be >= 0"
            )
    _check_capacity_ratio(links)
    cut = disconnected_gpu(nodes, links)
    if cut is not None:
        raise TopologyError(cut[1])


def _check_capacity(link: Link) -> None:
    if not (math.isfinite(link.gbps) and link.gbps > 0):
        raise TopologyError(
            f"link {link.id} ({link.src} -> {link.dst}) has capacity {link.gbps} Gbit/s; it must be positive"
        )


def _check_capacity_ratio(links: Sequence[Link]) -> None:
    if links:
        fastest = max(links, key=lambda link: link.gbps)
        slowest = min(links, key=lambda link: link.gbps)
        if slowest.gbps < fastest.gbps * MIN_CAPACITY_RATIO:
            raise TopologyError(
                f"link {slowest.id} ({slowest.src} -> {slowest.dst}) has capacity {slowest.gbps:g} Gbit/s, below "
                f"{MIN_CAPACITY_RATIO:g} of the fastest link's {fastest.gbps:g}: too slow to schedule around "
                "(a dead link is one to leave out)"
            )


def _check_capacities(links: Sequence[Link]) -> None:
    """The rules of :func:`_check` that a change of capacities alone can break, with its messages."""
    for link in links:
        _check_capacity(link)
    _check_capacity_ratio(links)


# Cached lookups of a Topology that depend on its structure only (nodes, link ends and latencies), so
# Topology.with_capacities hands them on; capacities_gbps is not among them.
_STRUCTURAL_LOOKUPS = frozenset({"node_index", "gpus", "out_links", "_links_by_pair", "link_endpoints",
                                 "latencies_us"})
