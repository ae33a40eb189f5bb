"""Route pinning on the kernel-emulated fabric: policy routing by source port (MCCS §3.3; issue 16).

MCCS pins a flow to a path by writing a route id into the RoCEv2 UDP source port; the
switches map source ports to paths. Here the switches are network namespaces that route
(IPv4 forwarding), and the map is Linux policy routing — one routing table per spine and
``ip rule ipproto tcp sport LO-HI lookup <spine's table>`` (and ``dport`` for the reverse
direction, so a flow's ACKs take its path back):

* a routed two-tier spine-leaf (:class:`RoutedSpineLeaf`): namespaces ``<P>h<i>`` (hosts, one
  NIC each), ``<P>l<j>`` (leaves: a bridge for their hosts, one uplink per spine), ``<P>s<k>``
  (spines). Every leaf reaches another leaf's hosts over every spine: an ECMP multipath route
  hashed on the 5-tuple (``fib_multipath_hash_policy=1``), the baseline a provider does not
  control; the pinned source-port ranges override it;
* route ``k`` of a pair (its flow through spine ``k``) is the source-port range
  ``[ROUTE_PORT_BASE + k·PORTS_PER_ROUTE, … + PORTS_PER_ROUTE)`` (:func:`~mccl.control.tenancy.pinning.route_port`);
  the hosts' ephemeral ports are moved below the pinned ranges (``ip_local_port_range``), so a
  connection that did not choose its port — gloo's: it binds neither its source port nor its
  listening port to anything a caller sets (``GLOO_SOCKET_IFNAME`` picks the interface only) —
  is hashed by ECMP and never lands in a pinned range by chance;
* a flow a policy placed (a route: link ids on an mccl spine-leaf topology of the same shape,
  :func:`pinned_port`) is sent from a port of its spine's range.

Links are shaped with ``htb`` on the egress of both ends (:mod:`.shaping`): host links at
``host_mbit``, leaf–spine links at ``uplink_mbit`` — 2:1 oversubscribed when two hosts of a leaf
send across at once and the uplinks run at half the host rate, as on the MCCS testbed. The
byte counters of the uplinks' qdiscs (``tc -s``) show which spine carried a flow.

gloo's connections cannot be pinned by port (above): :mod:`.gloopin` pins them by the pair's
addresses (``ip rule from A to B``), one path per host pair rather than per connection — the
granularity the MCCS source-port trick improves on. The fabric :mod:`.fabric` builds (one bridge
for the whole switch fabric) is left as it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
import time
from dataclasses import dataclass

from mccl.control.tenancy.flows import route_plane
from mccl.control.tenancy.pinning import PORTS_PER_ROUTE, ROUTE_PORT_BASE, route_port
from mccl.experiments.netemu.fabric import BASE_PREFIX, sweep
from mccl.experiments.netemu.shaping import FabricError, batch, run, shaper_lines
from mccl.topology import NodeKind, Topology

__all__ = ["RoutedSpineLeaf", "Flow", "FlowResult", "pinned_port", "run_flows", "EPHEMERAL_PORTS"]

EPHEMERAL_PORTS = (32768, ROUTE_PORT_BASE - 1)  # the hosts' ephemeral ports: below every pinned range
_TABLE_BASE = 100  # spine k's routing table in every leaf


@dataclass(frozen=True)
class RoutedSpineLeaf:
    """What to build (a plain value). Host ``i`` is on leaf ``i // hosts_per_leaf``."""

    prefix: str
    leaves: int = 2
    hosts_per_leaf: int = 2
    spines: int = 2
    host_mbit: float = 200.0
    uplink_mbit: float = 100.0

    def __post_init__(self) -> None:
        if self.leaves < 2 or self.spines < 2 or self.hosts_per_leaf < 1:
            raise FabricError("route pinning needs at least 2 leaves, 2 spines (2 equal-cost paths) and 1 host per leaf")
        if self.leaves > 16 or self.spines > 16 or self.hosts_per_leaf > 200:
            raise FabricError("a routed spine-leaf of at most 16 leaves, 16 spines, 200 hosts per leaf")
        if not (self.host_mbit > 0 and self.uplink_mbit > 0):
            raise FabricError("link rates must be positive")

    @staticmethod
    def from_topology(topology: Topology, *, scale: float = 1000.0, prefix: str | None = None) -> RoutedSpineLeaf:
        """The emulation of an mccl spine-leaf with one GPU per host (``spine_leaf(L, H, 1, S, ...)``), its
        rates divided by ``scale`` (Gbit/s → Mbit/s: 1000 keeps the numbers)."""
        gpus = topology.gpus
        hosts = {topology.node(gpu).host for gpu in gpus}
        if len(hosts) != len(gpus):
            raise FabricError("route pinning emulates one GPU per host (a NIC each)")
        racks = sorted({topology.node(gpu).rack for gpu in gpus})
        kinds = {node.id: node.kind for node in topology.nodes}
        spines = [node for node, kind in kinds.items() if kind is NodeKind.AGGREGATION]
        uplinks = [link.gbps for link in topology.links if kinds[link.src] is NodeKind.TOR and link.dst in spines]
        nics = [link.gbps for link in topology.links if kinds[link.src] is NodeKind.GPU]
        if not spines or not uplinks or len(gpus) % len(racks):
            raise FabricError(f"{topology.name} is not a spine-leaf with the same number of hosts per rack")
        return RoutedSpineLeaf(prefix or f"{BASE_PREFIX}{os.getpid()}-r", len(racks), len(gpus) // len(racks),
                               len(spines), min(nics) * 1000 / scale, min(uplinks) * 1000 / scale)

    # names ---------------------------------------------------------------------------------
    @property
    def hosts(self) -> int:
        return self.leaves * self.hosts_per_leaf

    def host_ns(self, host: int) -> str:
        return f"{self.prefix}h{host}"

    def leaf_ns(self, leaf: int) -> str:
        return f"{self.prefix}l{leaf}"

    def spine_ns(self, spine: int) -> str:
        return f"{self.prefix}s{spine}"

    def leaf_of(self, host: int) -> int:
        return host // self.hosts_per_leaf

    def host_ip(self, host: int) -> str:
        return f"10.80.{self.leaf_of(host)}.{host % self.hosts_per_leaf + 1}"

    @staticmethod
    def _p2p(leaf: int, spine: int) -> tuple[str, str]:
        """(leaf side, spine side) of the leaf–spine link."""
        return f"10.81.{leaf * 16 + spine}.1", f"10.81.{leaf * 16 + spine}.2"

    @property
    def namespaces(self) -> list[str]:
        return ([self.host_ns(i) for i in range(self.hosts)] + [self.leaf_ns(j) for j in range(self.leaves)]
                + [self.spine_ns(k) for k in range(self.spines)])


class RoutedFabric:
    """Build and tear down a :class:`RoutedSpineLeaf` (a context manager; teardown on any exit)."""

    def __init__(self, plan: RoutedSpineLeaf) -> None:
        self.plan = plan
        self.built = False

    def __enter__(self) -> RoutedFabric:
        self.build()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def build(self) -> None:
        sweep()  # a killed earlier run's leftovers (dead pids only)
        self.built = True
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise

    def _build(self) -> None:
        p = self.plan
        root = [f"netns add {ns}" for ns in p.namespaces]
        for i in range(p.hosts):
            root.append(f"link add eth0 netns {p.host_ns(i)} type veth peer name h{i} netns {p.leaf_ns(p.leaf_of(i))}")
        for j in range(p.leaves):
            for k in range(p.spines):
                root.append(f"link add u{k} netns {p.leaf_ns(j)} type veth peer name d{j} netns {p.spine_ns(k)}")
        batch("ip", None, root)
        forwarding = ["net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1"]
        for j in range(p.leaves):
            ns = p.leaf_ns(j)
            lines = ["link set lo up", "link add br0 type bridge", "link set br0 up", f"addr add 10.80.{j}.254/24 dev br0"]
            lines += [f"link set h{i} master br0" for i in range(p.hosts) if p.leaf_of(i) == j]
            lines += [f"link set h{i} up" for i in range(p.hosts) if p.leaf_of(i) == j]
            for k in range(p.spines):
                lines += [f"addr add {p._p2p(j, k)[0]}/30 dev u{k}", f"link set u{k} up"]
            for other in range(p.leaves):
                if other == j:
                    continue
                hops = " ".join(f"nexthop via {p._p2p(j, k)[1]} dev u{k}" for k in range(p.spines))
                lines.append(f"route add 10.80.{other}.0/24 {hops}")  # ECMP over every spine
                lines += [f"route add 10.80.{other}.0/24 via {p._p2p(j, k)[1]} dev u{k} table {_TABLE_BASE + k}"
                          for k in range(p.spines)]
            for k in range(p.spines):  # route k ↔ its source-port range (and destination port: the ACKs)
                low, high = route_port(k), route_port(k) + PORTS_PER_ROUTE - 1
                lines += [f"rule add priority {1000 + k} ipproto tcp sport {low}-{high} lookup {_TABLE_BASE + k}",
                          f"rule add priority {1100 + k} ipproto tcp dport {low}-{high} lookup {_TABLE_BASE + k}"]
            batch("ip", ns, lines)
            run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", *forwarding])
            tc = [line for i in range(p.hosts) if p.leaf_of(i) == j
                  for line in shaper_lines(f"h{i}", p.host_mbit, add=True)]
            tc += [line for k in range(p.spines) for line in shaper_lines(f"u{k}", p.uplink_mbit, add=True)]
            batch("tc", ns, tc)
        for k in range(p.spines):
            ns = p.spine_ns(k)
            lines = ["link set lo up"]
            for j in range(p.leaves):
                lines += [f"addr add {p._p2p(j, k)[1]}/30 dev d{j}", f"link set d{j} up",
                          f"route add 10.80.{j}.0/24 via {p._p2p(j, k)[0]} dev d{j}"]
            batch("ip", ns, lines)
            run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
            batch("tc", ns, [line for j in range(p.leaves) for line in shaper_lines(f"d{j}", p.uplink_mbit, add=True)])
        for i in range(p.hosts):
            ns = p.host_ns(i)
            batch("ip", ns, ["link set lo up", f"addr add {p.host_ip(i)}/24 dev eth0", "link set eth0 up",
                             f"route add default via 10.80.{p.leaf_of(i)}.254"])
            run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                 f"net.ipv4.ip_local_port_range={EPHEMERAL_PORTS[0]} {EPHEMERAL_PORTS[1]}"])
            batch("tc", ns, shaper_lines("eth0", p.host_mbit, add=True))

    def teardown(self) -> None:
        if self.built:
            sweep(prefix=self.plan.prefix)
            self.built = False

    def uplink_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes sent so far on every leaf → spine uplink, by (leaf, spine): the ``tc -s`` qdisc counters."""
        counters = {}
        for j in range(self.plan.leaves):
            for k in range(self.plan.spines):
                text = run(["tc", "-s", "-n", self.plan.leaf_ns(j), "qdisc", "show", "dev", f"u{k}"])
                words = text.split()
                counters[(j, k)] = int(words[words.index("Sent") + 1])
        return counters


def pinned_port(topology: Topology, route: tuple[int, ...], flow: int = 0) -> int:
    """The source port that pins a flow to ``route`` (link ids on a spine-leaf topology): the ``flow``-th
    port of the range of the route's spine (spines numbered in the topology's node order)."""
    spines = [node.id for node in topology.nodes if node.kind is NodeKind.AGGREGATION]
    plane = route_plane(topology, route)
    if len(plane) != 1 or plane[0] not in spines:
        raise FabricError(f"route {route} crosses {plane or 'no spine'}, not one spine: nothing to pin")
    return route_port(spines.index(plane[0]), flow)


@dataclass(frozen=True)
class Flow:
    """``src`` → ``dst`` (host indices), from source port ``port`` (None: an ephemeral one, ECMP-hashed)."""

    src: int
    dst: int
    port: int | None = None


@dataclass(frozen=True)
class FlowResult:
    flow: Flow
    bytes: int
    seconds: float
    port: int  # the source port the connection had

    @property
    def mbit(self) -> float:
        return self.bytes * 8 / self.seconds / 1e6


_CLONE_NEWNET = 0x40000000


def _enter(namespace: str) -> None:
    """Move the calling thread into ``namespace`` (setns is per thread; sockets keep the namespace they
    were made in). ``os.setns`` is Python ≥ 3.12; libc's otherwise (netemu.md §4)."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if hasattr(os, "setns"):
            os.setns(fd, _CLONE_NEWNET)
        elif ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            raise FabricError(f"setns into {namespace} failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def run_flows(fabric: RoutedFabric, flows: list[Flow], seconds: float = 1.5) -> list[FlowResult]:
    """Run ``flows`` at once for ``seconds`` (each sends as fast as TCP lets it); bytes received each.
    One thread per end, each in its host's namespace; every wait is bounded."""
    plan = fabric.plan
    results: list[FlowResult | None] = [None] * len(flows)
    errors: list[str] = []
    ready = threading.Barrier(len(flows) + 1, timeout=30)
    listeners = []
    for flow in flows:
        box: list[socket.socket] = []

        def listen(flow: Flow = flow, box: list = box) -> None:
            _enter(plan.host_ns(flow.dst))
            server = socket.socket()
            server.bind((plan.host_ip(flow.dst), 0))
            server.listen(1)
            box.append(server)

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        thread.join(timeout=10)
        if not box:
            raise FabricError(f"could not listen in {plan.host_ns(flow.dst)}")
        listeners.append(box[0])

    def receive(index: int) -> None:
        try:
            server = listeners[index]
            server.settimeout(30)
            conn, (_, port) = server.accept()
            conn.settimeout(seconds + 30)
            total, first = 0, None
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    break
                first = first or time.perf_counter()
                total += len(data)
            results[index] = FlowResult(flows[index], total, time.perf_counter() - (first or time.perf_counter()), port)
            conn.close()
        except OSError as error:
            errors.append(f"receiver of flow {index}: {error}")
        finally:
            listeners[index].close()

    def send(index: int) -> None:
        flow = flows[index]
        try:
            _enter(plan.host_ns(flow.src))
            conn = socket.socket()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            conn.bind((plan.host_ip(flow.src), flow.port or 0))
            conn.settimeout(30)
            conn.connect(listeners[index].getsockname())
            ready.wait()
            payload = b"\0" * (256 << 10)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)
            conn.close()
        except (OSError, threading.BrokenBarrierError) as error:
            errors.append(f"sender of flow {index}: {error}")

    threads = [threading.Thread(target=receive, args=(i,), daemon=True) for i in range(len(flows))]
    threads += [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(flows))]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a sender failed: its error is reported below
        ready.wait()
    for thread in threads:
        thread.join(timeout=seconds + 60)
    if errors or any(result is None for result in results):
        raise FabricError("flows failed: " + "; ".join(errors or ["a flow did not finish"]))
    return [result for result in results if result is not None]
