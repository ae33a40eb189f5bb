"""Faults: new topologies with some links slowed down (gray failures).

Topologies are immutable, so a fault is a function from a topology to a new one.
The named scenarios are those of mccl-paper §6.1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mccl.errors import TopologyError
from mccl.topology.model import Link, Node, NodeKind, Topology

__all__ = ["degrade", "fail1", "fail2", "fail3", "FAULTS", "apply_fault", "LinkRef"]

LinkRef = int | tuple[str, str]


def _resolve(topology: Topology, link: LinkRef) -> list[int]:
    if isinstance(link, tuple):
        src, dst = link
        topology.node(src)
        topology.node(dst)
        ids = list(topology.links_between(src, dst))
        if not ids:
            raise TopologyError(f"cannot degrade {src} -> {dst}: topology {topology.name!r} has no such link")
        return ids
    topology.link(link)
    return [int(link)]


def degrade(
    topology: Topology,
    link: LinkRef,
    *,
    gbps: float | None = None,
    factor: float | None = None,
    duplex: bool = False,
    extra_latency_us: float = 0.0,
) -> Topology:
    """A new topology with ``link`` (an id or a ``(src, dst)`` pair) slowed down.

    Give exactly one of ``gbps`` (the new capacity) or ``factor`` (multiplies the
    old one; 0.5 halves it). ``duplex=True`` also degrades the reverse direction
    (a damaged cable slows both). ``extra_latency_us`` adds latency.
    """
    if (gbps is None) == (factor is None):
        raise TopologyError("degrade needs exactly one of gbps= or factor=")
    if gbps is not None and not gbps > 0:
        raise TopologyError(f"degraded capacity must be positive, got {gbps} Gbit/s")
    if factor is not None and not factor > 0:
        raise TopologyError(f"degrade factor must be positive, got {factor}")
    ids = _resolve(topology, link)
    if duplex:
        for link_id in list(ids):
            forward = topology.links[link_id]
            ids.extend(topology.links_between(forward.dst, forward.src))
    links = list(topology.links)
    for link_id in dict.fromkeys(ids):
        old = links[link_id]
        new_gbps = gbps if gbps is not None else old.gbps * factor  # type: ignore[operator]
        links[link_id] = replace(old, gbps=float(new_gbps), latency_us=old.latency_us + extra_latency_us)
    first = topology.links[ids[0]]
    change = f"{gbps:g}Gbps" if gbps is not None else f"x{factor:g}"
    arrow = "<->" if duplex else "->"
    return topology.with_links(links, name=f"{topology.name}+degrade({first.src}{arrow}{first.dst},{change})")


def _neighbor(topology: Topology, gpu: str, kind: NodeKind, fault: str) -> str:
    if not topology.node(gpu).is_gpu:
        raise TopologyError(f"{fault} needs a GPU, {gpu!r} is a {topology.node(gpu).kind}")
    found = topology.gpu_neighbors(gpu, kind)
    if not found:
        raise TopologyError(f"{fault} needs {gpu} to have a link to a {kind.value} switch; {topology.name!r} has none")
    return found[0]


def fail1(topology: Topology, gpu: str = "gpu0") -> Topology:
    """Fail1: 13 of the 18 NVLink lanes of ``gpu`` fail, its NVSwitch port drops to 800 Gbit/s."""
    nvswitch = _neighbor(topology, gpu, NodeKind.NVSWITCH, "Fail1")
    result = degrade(topology, (gpu, nvswitch), gbps=800.0, duplex=True)
    return topology.with_links(result.links, name=f"{topology.name}+Fail1({gpu})")


def fail2(topology: Topology, gpu: str = "gpu0") -> Topology:
    """Fail2: the NIC cable of ``gpu`` to its ToR drops from 400 to 50 Gbit/s."""
    tor = _neighbor(topology, gpu, NodeKind.TOR, "Fail2")
    result = degrade(topology, (gpu, tor), gbps=50.0, duplex=True)
    return topology.with_links(result.links, name=f"{topology.name}+Fail2({gpu})")


def fail3(topology: Topology, gpu: str = "gpu0") -> Topology:
    """Fail3: ``gpu`` is replaced by a spare in another rack (mccl-paper §6.1).

    The spare keeps the rank (and node id) of the GPU it replaces, but sits on a
    host of its own in another rack: every path from it crosses one more ToR
    (+1 µs). It has a dedicated 50 Gbit/s path to its old host, modelled as the
    old NVSwitch cable slowed to 50 Gbit/s, and shares 100 Gbit/s to the rest of
    the data center, modelled as its NIC cable slowed to 100 Gbit/s.
    """
    nvswitch = _neighbor(topology, gpu, NodeKind.NVSWITCH, "Fail3")
    tor = _neighbor(topology, gpu, NodeKind.TOR, "Fail3")
    nic_latency = topology.link_between(gpu, tor).latency_us
    step = degrade(topology, (gpu, nvswitch), gbps=50.0, duplex=True, extra_latency_us=nic_latency + 1.0)
    step = degrade(step, (gpu, tor), gbps=100.0, duplex=True, extra_latency_us=1.0)
    old = topology.node(gpu)
    spare = Node(old.id, NodeKind.GPU, host=f"spare-{gpu}", rail=old.rail,
                 rack=f"spare-rack-{gpu}", segment=old.segment, pod=old.pod)
    nodes = tuple(spare if node.id == gpu else node for node in topology.nodes)
    links: tuple[Link, ...] = step.links
    return Topology(f"{topology.name}+Fail3({gpu})", nodes, links)


FAULTS: dict[str, Callable[[Topology], Topology]] = {"Fail1": fail1, "Fail2": fail2, "Fail3": fail3}


def apply_fault(topology: Topology, name: str) -> Topology:
    """Apply a named scenario (``Fail1``, ``Fail2``, ``Fail3``, case-insensitive)."""
    for key, fault in FAULTS.items():
        if key.lower() == name.lower():
            return fault(topology)
    raise TopologyError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
