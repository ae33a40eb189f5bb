"""The fabric: GPUs, switches, directed links, builders, files and faults."""

from mccl.topology.builders import rail_optimized, single_switch, spine_leaf, switch_ring
from mccl.topology.fabric import FabricView, fabric_view
from mccl.topology.faults import FAULTS, apply_fault, degrade, fail1, fail2, fail3
from mccl.topology.fileformat import dump_topology, dumps_topology, load_topology, loads_topology
from mccl.topology.model import SWITCH_KINDS, Link, Node, NodeKind, Topology
from mccl.topology.routing import Router
from mccl.topology.spec import BUILDERS, apply_faults, parse_fault, parse_topology

__all__ = [
    "BUILDERS",
    "apply_faults",
    "parse_fault",
    "parse_topology",
    "FAULTS",
    "FabricView",
    "fabric_view",
    "SWITCH_KINDS",
    "Link",
    "Node",
    "NodeKind",
    "Router",
    "Topology",
    "apply_fault",
    "degrade",
    "dump_topology",
    "dumps_topology",
    "fail1",
    "fail2",
    "fail3",
    "load_topology",
    "loads_topology",
    "rail_optimized",
    "single_switch",
    "spine_leaf",
    "switch_ring",
]
