"""The fabric as the AllToAll LP sees it: the :class:`~mccl.topology.FabricView` of the ranks.

A GPU that is not a rank of the collective cannot relay (a relay is a transfer
between ranks), so it and its links are left out. The remaining links are the
LP's link rows (in link-id order); ``link_ids`` maps them back to topology link
ids. Capacities are in Gbit/s. Node order is the view's: rank ``r`` is node ``r``,
switches follow.

Feasibility: every rank must reach every other over the kept links (possibly
relaying through other ranks); otherwise :class:`~mccl.errors.Infeasible` names a
pair that cannot communicate (:meth:`~mccl.topology.FabricView.require_connected`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mccl.synth.common import check_ranks
from mccl.topology import FabricView, Topology, fabric_view

__all__ = ["Network", "build_network"]


@dataclass(frozen=True, eq=False)
class Network:
    """The topology and its view, under the names the LP code uses (per kept node / kept link)."""

    topology: Topology
    view: FabricView

    @property
    def ranks(self) -> tuple[str, ...]:
        return self.view.ranks

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self.view.names

    @property
    def link_ids(self) -> np.ndarray:
        """Topology link id of each kept link."""
        return self.view.link

    @property
    def tail(self) -> np.ndarray:
        return self.view.tail

    @property
    def head(self) -> np.ndarray:
        return self.view.head

    @property
    def capacity(self) -> np.ndarray:
        """Gbit/s per kept link."""
        return self.view.gbps

    @cached_property
    def is_gpu(self) -> np.ndarray:
        """Per kept node: a rank's GPU (the view puts ranks first)."""
        return np.arange(self.n_nodes) < self.n_ranks

    @cached_property
    def rank_node(self) -> np.ndarray:
        """Kept-node index of each rank: the rank itself."""
        return np.arange(self.n_ranks, dtype=np.int64)

    @cached_property
    def node_rank(self) -> np.ndarray:
        """Rank of each kept node, -1 for switches."""
        return np.where(self.is_gpu, np.arange(self.n_nodes), -1).astype(np.int64)

    @property
    def n_ranks(self) -> int:
        return self.view.n_ranks

    @property
    def n_nodes(self) -> int:
        return self.view.n_nodes

    @property
    def n_links(self) -> int:
        return self.view.n_arcs


def build_network(topology: Topology, ranks: Sequence[str] | None = None) -> Network:
    """The LP's view of ``topology`` for an AllToAll over ``ranks`` (all GPUs by default)."""
    chosen = check_ranks(topology, ranks)
    return Network(topology, fabric_view(topology, chosen).require_connected("AllToAll"))
