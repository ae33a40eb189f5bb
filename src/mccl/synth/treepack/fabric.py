"""The graph the tree packing works on: :class:`~mccl.topology.FabricView`, ranks required connected.

Node ``i < n`` is rank ``i``; nodes ``n …`` are switches; GPUs that hold no rank are
dropped with their links (a schedule may only relay through ranks). Arcs keep the
physical link id they stand for; ``groups`` is each node's host index (-1 for ToRs,
spines), which the packer uses to keep trees host-local. See :mod:`mccl.topology.fabric`.
"""

from __future__ import annotations

from collections.abc import Sequence

from mccl.topology import FabricView, Topology, fabric_view

__all__ = ["Fabric", "fabric_of"]

Fabric = FabricView


def fabric_of(topology: Topology, ranks: Sequence[str]) -> Fabric:
    """The rank-and-switch graph of ``topology``; :class:`~mccl.errors.Infeasible` if a rank cannot reach another."""
    return fabric_view(topology, ranks).require_connected("AllGather")
