"""Builders for the fabrics of the reference papers.

Node naming is fixed so that faults, tests and files can name nodes: GPUs are
``gpu0 … gpu{N-1}`` in rank order; intra-host switches ``nvs{h}``; ToRs/leaves
``tor{s}.{r}`` (HPN: segment s, rail r) or ``leaf{r}``; aggregation/spine switches
``agg{j}`` / ``spine{j}``; plain switches ``sw{i}``.
"""

from __future__ import annotations

from mccl.errors import TopologyError
from mccl.topology.model import Node, NodeKind, Topology

__all__ = [
    "rail_optimized",
    "spine_leaf",
    "switch_ring",
    "single_switch",
    "NVSWITCH_GBPS",
    "NVSWITCH_LATENCY_US",
    "NIC_GBPS",
    "NIC_LATENCY_US",
]

# mccl-paper §6.1: NVSwitch 2880 Gbit/s per GPU with 25 ns; NIC/ToR 400 Gbit/s with 0.5 µs.
NVSWITCH_GBPS = 2880.0
NVSWITCH_LATENCY_US = 0.025
NIC_GBPS = 400.0
NIC_LATENCY_US = 0.5

Edge = tuple[str, str, float, float]


def _cable(edges: list[Edge], a: str, b: str, gbps: float, latency_us: float) -> None:
    """A full-duplex cable: two directed links, ``a → b`` then ``b → a``."""
    edges.append((a, b, gbps, latency_us))
    edges.append((b, a, gbps, latency_us))


def _gpu_nodes(groups: int, hosts_per_group: int, gpus_per_host: int, group_prefix: str) -> list[Node]:
    """GPUs ``gpu0 …`` host by host; host h of group g is ``host{h}``, its rack and segment ``{prefix}{g}``."""
    nodes = []
    for group in range(groups):
        for local_host in range(hosts_per_group):
            host = group * hosts_per_group + local_host
            for rail in range(gpus_per_host):
                nodes.append(Node(f"gpu{len(nodes)}", NodeKind.GPU, host=f"host{host}", rail=rail,
                                  rack=f"{group_prefix}{group}", segment=f"{group_prefix}{group}", pod="pod0"))
    return nodes


def _host_index(gpu: Node) -> int:
    return int((gpu.host or "host0").removeprefix("host"))


def _intra_host_cables(edges: list[Edge], gpus: list[Node], gbps: float) -> None:
    """Each GPU's cable to its host's switch ``nvs{h}`` (25 ns, as NVSwitch)."""
    for gpu in gpus:
        _cable(edges, gpu.id, f"nvs{_host_index(gpu)}", gbps, NVSWITCH_LATENCY_US)


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise TopologyError(f"{name} must be positive, got {value}")


def rail_optimized(
    segments: int,
    hosts_per_segment: int,
    gpus_per_host: int = 8,
    *,
    nic_gbps: float = NIC_GBPS,
    nvswitch_gbps: float = NVSWITCH_GBPS,
    aggregation_switches: int | None = None,
) -> Topology:
    """The HPN rail-optimized fabric of mccl-paper §6.1 (S×H×N).

    Per host one NVSwitch with a ``nvswitch_gbps`` cable to each GPU (25 ns). GPU r
    of every host in segment s has its own NIC cable to ToR ``tor{s}.{r}`` (one ToR
    per rail and segment, 0.5 µs). Every ToR has one ``nic_gbps`` cable to each of
    ``aggregation_switches`` aggregation switches (default: hosts per segment, so a
    ToR's uplinks match its downlinks, 1:1, as in HPN's single-plane design). The
    aggregation layer carries cross-rail and cross-segment traffic unless a
    schedule relays it through an NVSwitch.
    """
    _positive(
        segments=segments,
        hosts_per_segment=hosts_per_segment,
        gpus_per_host=gpus_per_host,
        nic_gbps=nic_gbps,
        nvswitch_gbps=nvswitch_gbps,
    )
    n_agg = hosts_per_segment if aggregation_switches is None else aggregation_switches
    _positive(aggregation_switches=n_agg)
    nodes = _gpu_nodes(segments, hosts_per_segment, gpus_per_host, "seg")
    gpus = list(nodes)
    edges: list[Edge] = []
    for host in range(segments * hosts_per_segment):
        segment = host // hosts_per_segment
        nodes.append(Node(f"nvs{host}", NodeKind.NVSWITCH, host=f"host{host}", segment=f"seg{segment}", pod="pod0"))
    for segment in range(segments):
        for rail in range(gpus_per_host):
            nodes.append(Node(f"tor{segment}.{rail}", NodeKind.TOR, rail=rail, segment=f"seg{segment}", pod="pod0"))
    for index in range(n_agg):
        nodes.append(Node(f"agg{index}", NodeKind.AGGREGATION, pod="pod0"))

    _intra_host_cables(edges, gpus, nvswitch_gbps)
    for gpu in gpus:
        _cable(edges, gpu.id, f"tor{_host_index(gpu) // hosts_per_segment}.{gpu.rail}", nic_gbps, NIC_LATENCY_US)
    for segment in range(segments):
        for rail in range(gpus_per_host):
            for index in range(n_agg):
                _cable(edges, f"tor{segment}.{rail}", f"agg{index}", nic_gbps, NIC_LATENCY_US)
    name = f"rail_optimized({segments},{hosts_per_segment},{gpus_per_host})"
    return Topology.from_edges(name, nodes, edges)


def spine_leaf(
    racks: int,
    hosts_per_rack: int,
    gpus_per_host: int,
    spines: int,
    host_gbps: float,
    uplink_gbps: float,
    *,
    intra_host_gbps: float = 256.0,
    latency_us: float = NIC_LATENCY_US,
) -> Topology:
    """A two-tier spine-leaf fabric, the MCCS testbed and its generalizations.

    Each host's NIC (``host_gbps``) is split evenly into one virtual NIC per GPU,
    as the MCCS testbed splits a 100 Gbit/s ConnectX-5 into two 50 Gbit/s ones;
    every leaf has one ``uplink_gbps`` cable to each spine. The MCCS testbed (2:1
    oversubscribed) is ``spine_leaf(2, 2, 2, 2, host_gbps=100, uplink_gbps=50)``.
    GPUs of a host share an intra-host switch (``intra_host_gbps`` per GPU; the
    default is a PCIe 4.0 x16 link, as on hosts without NVLink).
    """
    _positive(
        racks=racks,
        hosts_per_rack=hosts_per_rack,
        gpus_per_host=gpus_per_host,
        spines=spines,
        host_gbps=host_gbps,
        uplink_gbps=uplink_gbps,
        intra_host_gbps=intra_host_gbps,
    )
    nic_gbps = host_gbps / gpus_per_host
    nodes = _gpu_nodes(racks, hosts_per_rack, gpus_per_host, "rack")
    gpus = list(nodes)
    edges: list[Edge] = []
    n_hosts = racks * hosts_per_rack
    if gpus_per_host > 1:
        for host in range(n_hosts):
            nodes.append(Node(f"nvs{host}", NodeKind.NVSWITCH, host=f"host{host}", rack=f"rack{host // hosts_per_rack}"))
    for rack in range(racks):
        nodes.append(Node(f"leaf{rack}", NodeKind.TOR, rack=f"rack{rack}", pod="pod0"))
    for index in range(spines):
        nodes.append(Node(f"spine{index}", NodeKind.AGGREGATION, pod="pod0"))
    if gpus_per_host > 1:
        _intra_host_cables(edges, gpus, intra_host_gbps)
    for gpu in gpus:
        _cable(edges, gpu.id, f"leaf{_host_index(gpu) // hosts_per_rack}", nic_gbps, latency_us)
    for rack in range(racks):
        for index in range(spines):
            _cable(edges, f"leaf{rack}", f"spine{index}", uplink_gbps, latency_us)
    name = f"spine_leaf({racks},{hosts_per_rack},{gpus_per_host},{spines},{host_gbps:g},{uplink_gbps:g})"
    return Topology.from_edges(name, nodes, edges)


def switch_ring(
    n_switches: int,
    hosts_per_switch: int,
    gpus_per_host: int,
    link_gbps: float,
    *,
    host_gbps: float | None = None,
    intra_host_gbps: float = 256.0,
    latency_us: float = NIC_LATENCY_US,
) -> Topology:
    """Switches ``sw0 … sw{n-1}`` in a ring (a cable between neighbours), hosts on each.

    The MCCS ring-reversal experiment: four switches, one server with two GPUs on
    each. Each GPU has its own ``host_gbps`` link (default ``link_gbps``) to its
    switch. The paper's numbers (a hop carried ~83 Gbit/s; 75 Gbit/s of background
    left 25) imply 100 Gbit/s links: ``switch_ring(4, 1, 2, 100)``.
    """
    _positive(n_switches=n_switches, hosts_per_switch=hosts_per_switch,
              gpus_per_host=gpus_per_host, link_gbps=link_gbps, intra_host_gbps=intra_host_gbps)
    nic_gbps = link_gbps if host_gbps is None else host_gbps
    _positive(host_gbps=nic_gbps)
    nodes = _gpu_nodes(n_switches, hosts_per_switch, gpus_per_host, "rack")
    gpus = list(nodes)
    edges: list[Edge] = []
    n_hosts = n_switches * hosts_per_switch
    if gpus_per_host > 1:
        for host in range(n_hosts):
            nodes.append(Node(f"nvs{host}", NodeKind.NVSWITCH, host=f"host{host}"))
    for switch in range(n_switches):
        nodes.append(Node(f"sw{switch}", NodeKind.SWITCH, rack=f"rack{switch}", pod="pod0"))
    if gpus_per_host > 1:
        _intra_host_cables(edges, gpus, intra_host_gbps)
    for gpu in gpus:
        _cable(edges, gpu.id, f"sw{_host_index(gpu) // hosts_per_switch}", nic_gbps, latency_us)
    if n_switches == 2:
        _cable(edges, "sw0", "sw1", link_gbps, latency_us)
    elif n_switches > 2:
        for switch in range(n_switches):
            _cable(edges, f"sw{switch}", f"sw{(switch + 1) % n_switches}", link_gbps, latency_us)
    name = f"switch_ring({n_switches},{hosts_per_switch},{gpus_per_host},{link_gbps:g})"
    return Topology.from_edges(name, nodes, edges)


def single_switch(n_gpus: int, gbps: float, *, latency_us: float = NIC_LATENCY_US) -> Topology:
    """``n_gpus`` GPUs, each on its own host, each with a ``gbps`` cable to one switch."""
    _positive(n_gpus=n_gpus, gbps=gbps)
    nodes = _gpu_nodes(1, n_gpus, 1, "rack")
    nodes.append(Node("sw0", NodeKind.SWITCH, rack="rack0", pod="pod0"))
    edges: list[Edge] = []
    for i in range(n_gpus):
        _cable(edges, f"gpu{i}", "sw0", gbps, latency_us)
    return Topology.from_edges(f"single_switch({n_gpus},{gbps:g})", nodes, edges)
