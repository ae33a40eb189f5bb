"""The fabric a Fig. 14 group's schedule may use (its overlay), and where a fault sits.

A group's synthesizer sees the group's GPUs, their NVSwitches and — when the group spans more
than one host — the ToRs its GPUs attach to and the aggregation layer. A multi-host group also
gets, on the hosts a fault touches, the host's *other* GPUs and their ToRs as **relay-only
nodes**: the PXN-style detour of HPN, where a member whose NIC is degraded sends (and receives)
through NVLink to a peer GPU of its host and out of that GPU's NIC on another rail.

Why relay GPUs are turned into switches: the synthesizers drop every GPU that holds no rank,
with its links (:func:`mccl.topology.fabric_view`: "a schedule may only relay through ranks";
routes never pass through a GPU, :mod:`mccl.topology.routing`). A non-member GPU therefore cannot
forward in ``optimize(topology, collective, ranks)`` on the real topology. Here such a GPU
becomes a :attr:`~mccl.topology.NodeKind.SWITCH` with the same id, host and links: tree
packing's switch removal and column generation's paths then route through it like any switch
(cut-through, no store-and-forward copy in the GPU's memory, which the α-β model does not see anyway).

Why only on the hosts a fault touches: on a healthy host every NIC is fully used by its own rail's
group (the 8 DP groups of a host run together), so a detour through it adds load to a saturated
NIC and cannot shorten the joint phase; leaving those relays out keeps 256-rank DP groups
tractable (measured at 128 GPUs: relays on all 16 hosts give the same joint DP times under Fail2, and none
gain on the healthy fabric; BENCHMARKS.md, Fig. 14 revisited). A one-host group (Llama TP) gets its NVSwitch only: a loop out of one NIC and back in
through another would make tree packing beat the ring on a healthy host by 12 % (α-β), against
the paper's "no gain without failures".
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mccl.topology import SWITCH_KINDS, NodeKind, Topology

__all__ = ["group_fabric", "fault_hosts", "link_map"]


def group_fabric(fabric: Topology, ranks: tuple[str, ...], relay_hosts: frozenset[str] = frozenset()) -> Topology:
    """The part of ``fabric`` a group's schedule can use (module docstring); a multi-host group also
    relays through the non-member GPUs of ``relay_hosts`` (as switches) and their ToRs."""
    members = set(ranks)
    hosts = {fabric.node(gpu).host for gpu in ranks}
    multi_host = len(hosts) > 1
    relays = ({node.id for node in fabric.nodes if node.is_gpu and node.host in relay_hosts and node.id not in members}
              if multi_host else set())
    kinds = set(SWITCH_KINDS) if multi_host else {NodeKind.NVSWITCH}
    sources = members | relays
    kept = set(sources)
    for link in fabric.links:
        if link.src in sources and fabric.node(link.dst).kind in kinds:
            kept.add(link.dst)
    if multi_host:
        kept.update(node.id for node in fabric.nodes if node.kind is NodeKind.AGGREGATION)
    nodes = [dataclasses.replace(node, kind=NodeKind.SWITCH) if node.id in relays else node
             for node in fabric.nodes if node.id in kept]
    edges = [(link.src, link.dst, link.gbps, link.latency_us) for link in fabric.links
             if link.src in kept and link.dst in kept]
    suffix = f" relays@{','.join(sorted(relay_hosts))}" if relays else ""
    return Topology.from_edges(f"{fabric.name}[{ranks[0]}..{ranks[-1]} n={len(ranks)}{suffix}]", nodes, edges)


def fault_hosts(healthy: Topology, faulted: Topology) -> frozenset[str]:
    """Hosts of the nodes whose links differ between the two fabrics (Fail1/2: gpu0's host; Fail3: the
    spare's host and the host it left)."""
    before = {(link.src, link.dst, link.gbps, link.latency_us) for link in healthy.links}
    changed = {end for link in faulted.links if (link.src, link.dst, link.gbps, link.latency_us) not in before
               for end in (link.src, link.dst)}
    changed |= {node.id for node in faulted.nodes
                if node.id in healthy.node_index and healthy.node(node.id).host != node.host}
    return frozenset(host for node in changed if (host := faulted.node(node).host) is not None)


def link_map(full: Topology, sub: Topology) -> np.ndarray:
    """For each link of ``sub`` (a :func:`group_fabric` of ``full``), the id of the same cable in ``full``."""
    index = {(link.src, link.dst): link.id for link in full.links}
    return np.array([index[link.src, link.dst] for link in sub.links], dtype=np.int64)
