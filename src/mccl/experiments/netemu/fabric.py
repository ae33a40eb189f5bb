"""An mccl :class:`~mccl.topology.Topology` as network namespaces, veths, bridges and shaped links.

Layout (every name starts with the run's prefix ``mne<pid>-``, so a sweep can find a killed
run's leftovers and never touches another live run's):

* ``<P>sw`` — the switches: bridge ``br0`` (the NIC fabric: rail ToRs and spines collapsed into one
  non-blocking L2 switch), one bridge ``nvs<h>`` per host (its NVSwitch), bridge ``mg0`` (the
  management network: controller, TCPStore, hot-swap OOB — unshaped, as an out-of-band network).
* ``<P>g<r>`` — one namespace per GPU (rank ``r``) with three veths: ``eth0`` (its NIC, 10.77.0.r+1,
  port ``n<r>`` on ``br0``), ``nv0`` (its NVLink, port ``v<r>`` on ``nvs<h>``) and ``mg0`` (management,
  10.79.k.r+1, port ``m<r>``). Same-host peers' addresses are routed over ``nv0``, the rest over ``eth0``.
* one veth in the root namespace, ``<P>m`` (10.79.k.254), to ``mg0``: the controller runs in the root
  namespace and is reachable from every rank at that address.

Why a namespace per GPU and not one per host (ranks of a host sharing a namespace and talking
over loopback): in a rail-optimized fabric every GPU has its own NIC, and a rank pair's traffic
must leave through the sender's NIC and arrive through the receiver's (the routes the controller
maps telemetry onto). gloo does not bind the source address of the connections it opens (measured:
in a shared namespace rank 3's connection to rank 0 left from rank 2's NIC address), so the kernel
would pick the NIC by destination only. One namespace per GPU makes the NIC of every packet that
of its sender, with no per-process routing tricks.

Intra-host (NVLink-class) links: a veth pair per GPU into the host's ``nvs<h>`` bridge, shaped like
a NIC at the topology's NVLink rate / ``scale`` (``nvlink="shaped"``, default: the model the
controller synthesizes for and the emulation agree), or unshaped (``nvlink="unshaped"``: veth +
bridge speed, 5–9 Gbit/s per flow here, CPU-bound). Either way much faster than a NIC, as on the real
fabric (2880 vs 400 Gbit/s): measured at 1/20000, rank 0 → 1 over NVLink 134 Mbit/s, rank 0 → 4 over
the NICs 19.1 (7.0×).

Not emulated: the switch fabric's own links. A spine-leaf topology builds (one NIC per GPU), but its
leaf–spine trunks and their oversubscription collapse into the one bridge; faults on trunks cannot
be injected. (netemu.md §2d shows the two-tier layout works; it is not built here.)

Shaping: ``htb`` on the egress of both veth ends (see :mod:`.shaping`). A gray failure is a
``tc class change`` of both ends of a GPU's NIC at run time (:func:`shape_nic`,
:meth:`EmulatedFabric.scale_nic`, :meth:`EmulatedFabric.set_nic`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, replace
from types import FrameType

from mccl.experiments.netemu.shaping import FabricError, batch, run, shaper_lines
from mccl.topology import NodeKind, Topology

__all__ = ["BASE_PREFIX", "RankPort", "FabricPlan", "EmulatedFabric", "unsupported_reason", "sweep", "shape_nic"]

BASE_PREFIX = "mne"  # every run's names: mne<pid>-...
DATA_NET = "10.77.0"
MGMT_NET = "10.79"
MAX_RANKS = 250
# The NICs' largest TCP segment: one MSS at MTU 1500. Why: with the kernel's default (64 KiB) TCP hands the
# shaper 64 KiB GSO super-packets and htb passes each whole, so at the emulated rates data arrives in lumps —
# 64 KiB every 27 ms at 20 Mbit/s, where a real 400 Gbit/s NIC delivers those bytes in 1.3 µs (the emulation
# scales rates by 1/scale, not segment sizes). A receiver then sees a handful of lump edges per collective and
# no rate between them (BENCHMARKS.md, 2026-12-01 fourth and fifth sessions: telemetry +10 … +46 % with
# lumps); per-packet arrivals make the emulated NIC's timing that of a real one. Throughput: see the fifth
# session's A/B. The host-fabric veths (nv0) keep the default: 7× faster, not metered by counter.
NIC_GSO_MAX_SIZE = 1448
# Small TCP send buffers in the GPU namespaces. Why (when the executor's telemetry was timed on the send side,
# before 2026-12-01's third session; it is timed on the receive side now, and the buffers were kept, not
# re-measured without them): a gloo send completes once its bytes are in the socket; with Linux's default buffers
# (tcp_wmem up to 4 MiB, 1 MiB per socket allowed in the qdisc) a 128 KiB chunk "completes" long before
# it crosses a 20 Mbit/s link (measured: samples of 8 Gbit/s on a 20 Mbit/s NIC). 64 KiB of buffer is
# ~26 ms at 20 Mbit/s and still lets one flow fill the link (the RTT is ~0.1 ms). No slow start after an idle
# gap: the gaps between collectives would otherwise restart every connection's window each time.
TCP_SYSCTLS = ("net.ipv4.tcp_wmem=4096 16384 65536", "net.ipv4.tcp_limit_output_bytes=16384",
               "net.ipv4.tcp_slow_start_after_idle=0")


@dataclass(frozen=True)
class RankPort:
    """Where rank ``rank`` (GPU ``gpu`` of host ``host_index``) lives: its namespace, NIC address,
    management address, and its links' emulated rates (Mbit/s; ``nvlink_mbit`` None: unshaped)."""

    rank: int
    gpu: str
    host_index: int
    namespace: str
    ip: str
    mgmt_ip: str
    nic_up_mbit: float
    nic_down_mbit: float
    nvlink_mbit: float | None


@dataclass(frozen=True)
class FabricPlan:
    """What to build (a plain value: picklable, handed to the rank processes)."""

    prefix: str
    topology_name: str
    scale: float
    ranks: tuple[RankPort, ...]
    hosts: tuple[str, ...]
    mgmt_net: str  # e.g. 10.79.0

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}sw"

    @property
    def root_link(self) -> str:
        return f"{self.prefix.rstrip('-')}m"

    @property
    def controller_ip(self) -> str:
        return f"{self.mgmt_net}.254"

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.switch_ns, *(port.namespace for port in self.ranks))

    @staticmethod
    def from_topology(topology: Topology, *, scale: float = 1000.0, nvlink: str = "shaped",
                      prefix: str | None = None) -> FabricPlan:
        """One rank per GPU in ``topology.gpus`` order. Each GPU needs exactly one NIC (a link to a
        switch that is not an NVSwitch); the switch fabric beyond the NICs becomes one bridge."""
        if nvlink not in ("shaped", "unshaped"):
            raise FabricError(f"nvlink must be 'shaped' or 'unshaped', not {nvlink!r}")
        if not scale > 0:
            raise FabricError(f"the scale factor must be positive, got {scale}")
        gpus = topology.gpus
        if not 2 <= len(gpus) <= MAX_RANKS:
            raise FabricError(f"the emulated fabric holds 2..{MAX_RANKS} GPUs, {topology.name} has {len(gpus)}")
        prefix = prefix or f"{BASE_PREFIX}{os.getpid()}-"
        hosts = tuple(dict.fromkeys(topology.node(gpu).host or gpu for gpu in gpus))
        ports = []
        for rank, gpu in enumerate(gpus):
            nic_up = [topology.link(i) for i in topology.out_links[gpu]
                      if topology.node(topology.link(i).dst).kind is not NodeKind.NVSWITCH]
            nvl = [topology.link(i) for i in topology.out_links[gpu]
                   if topology.node(topology.link(i).dst).kind is NodeKind.NVSWITCH]
            if len(nic_up) != 1:
                raise FabricError(f"{gpu} has {len(nic_up)} NIC links; the emulated fabric needs exactly one per GPU")
            down = topology.links_between(nic_up[0].dst, gpu)
            if not down:
                raise FabricError(f"{gpu}'s NIC has no link back from {nic_up[0].dst}")
            host_index = hosts.index(topology.node(gpu).host or gpu)
            nvlink_mbit = (nvl[0].gbps * 1000 / scale) if nvl and nvlink == "shaped" else None
            ports.append(RankPort(rank, gpu, host_index, f"{prefix}g{rank}", f"{DATA_NET}.{rank + 1}", "",
                                  nic_up[0].gbps * 1000 / scale, topology.link(down[0]).gbps * 1000 / scale,
                                  nvlink_mbit))
        return FabricPlan(prefix, topology.name, float(scale), tuple(ports), hosts, mgmt_net="")

    def with_mgmt_net(self, mgmt_net: str) -> FabricPlan:
        ranks = tuple(replace(port, mgmt_ip=f"{mgmt_net}.{port.rank + 1}") for port in self.ranks)
        return replace(self, ranks=ranks, mgmt_net=mgmt_net)


def unsupported_reason() -> str | None:
    """Why the emulated fabric cannot be built here (one line), or None when it can."""
    if os.geteuid() != 0:
        return "the emulated fabric needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the emulated fabric needs iproute2's `{tool}` (apt-get install -y iproute2)"
    probe = f"{BASE_PREFIX}{os.getpid()}-probe"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"network namespaces are not available here ({done.stderr.strip()[:120]})"
    try:
        done = subprocess.run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return f"tc htb is not available here ({done.stderr.strip()[:120]})"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def shape_nic(plan: FabricPlan, rank: int, factor: float) -> float:
    """Both directions of ``rank``'s NIC at ``factor`` × its healthy rate (0.5: halved, 1.0: restored): one
    ``tc class change`` on each veth end. Callable from any process (a rank applies its own fault); seconds."""
    if not factor > 0:
        raise FabricError(f"a NIC rate factor must be positive, got {factor}")
    port = plan.ranks[rank]
    start = time.perf_counter()
    batch("tc", port.namespace, shaper_lines("eth0", port.nic_up_mbit * factor))
    batch("tc", plan.switch_ns, shaper_lines(f"n{rank}", port.nic_down_mbit * factor))
    return time.perf_counter() - start


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(*, only_dead: bool = True, prefix: str | None = None) -> list[str]:
    """Delete leftover namespaces and root links of emulated fabrics; the names deleted.

    ``prefix``: exactly that run's names. Otherwise every ``mne<pid>-`` name whose pid is no longer
    alive (``only_dead``; False: every run's, live or not)."""
    if shutil.which("ip") is None:
        return []
    pattern = re.compile(rf"^{BASE_PREFIX}(\d+)-")

    def mine(name: str) -> bool:
        if prefix is not None:
            return name.startswith(prefix)
        match = pattern.match(name)
        return bool(match) and (not only_dead or not _pid_alive(int(match.group(1))))

    names = [line.split()[0] for line in run(["ip", "netns", "list"], check=False).splitlines() if line.strip()]
    gone = [name for name in names if mine(name)]
    links = []
    for line in run(["ip", "-o", "link", "show"], check=False).splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if re.match(rf"^{BASE_PREFIX}\d+m$", name) and mine(name[:-1] + "-"):
                links.append(name)
    for name in links:
        run(["ip", "link", "del", name], check=False)
    if gone:
        run(["ip", "-force", "-batch", "-"], check=False, stdin="".join(f"netns del {name}\n" for name in gone))
    return gone + links


def _free_mgmt_net() -> str:
    """A 10.79.k.0/24 the root namespace neither has an address in nor routes (other runs hold theirs)."""
    used = run(["ip", "-4", "-o", "addr", "show"], check=False) + run(["ip", "-4", "route", "show"], check=False)
    for k in range(256):
        net = f"{MGMT_NET}.{k}"
        if f"{net}." not in used:
            return net
    raise FabricError(f"no free management subnet {MGMT_NET}.k.0/24 in the root namespace")


class EmulatedFabric:
    """Build, change and tear down the fabric of a :class:`FabricPlan`. Use as a context manager:
    teardown runs on exit, on an exception, on Ctrl-C, and on SIGTERM (turned into SystemExit while
    the fabric is up, when entered from the main thread)."""

    def __init__(self, plan: FabricPlan) -> None:
        self.plan = plan
        self.built = False
        self.build_s = 0.0
        self._nic_mbit = {port.rank: (port.nic_up_mbit, port.nic_down_mbit) for port in plan.ranks}
        self._previous_sigterm: object = None

    # ---- life cycle ------------------------------------------------------------------------
    def __enter__(self) -> EmulatedFabric:
        self.build()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def build(self) -> None:
        start = time.perf_counter()
        sweep()  # a killed earlier run's leftovers (dead pids only)
        self.plan = self.plan.with_mgmt_net(_free_mgmt_net())
        plan = self.plan
        self._install_sigterm()
        self.built = True  # from here on, teardown deletes whatever exists
        try:
            self._build(plan)
        except BaseException:
            self.teardown()
            raise
        self.build_s = time.perf_counter() - start

    def _build(self, plan: FabricPlan) -> None:
        sw = plan.switch_ns
        root = [f"netns add {ns}" for ns in plan.namespaces]
        for port in plan.ranks:
            r, ns = port.rank, port.namespace
            root.append(f"link add eth0 netns {ns} type veth peer name n{r} netns {sw}")
            root.append(f"link add nv0 netns {ns} type veth peer name v{r} netns {sw}")
            root.append(f"link add mg0 netns {ns} type veth peer name m{r} netns {sw}")
        root.append(f"link add {plan.root_link} type veth peer name mroot netns {sw}")
        batch("ip", None, root)
        switch = ["link set lo up", "link add br0 type bridge", "link set br0 up", "link add mg0 type bridge",
                  "link set mg0 up", "link set mroot master mg0", "link set mroot up"]
        for h in range(len(plan.hosts)):
            switch += [f"link add nvs{h} type bridge", f"link set nvs{h} up"]
        for port in plan.ranks:
            r = port.rank
            switch += [f"link set n{r} master br0", f"link set n{r} up", f"link set v{r} master nvs{port.host_index}",
                       f"link set v{r} up", f"link set m{r} master mg0", f"link set m{r} up"]
        batch("ip", sw, switch)
        tc_switch = []
        for port in plan.ranks:
            same_host = [peer for peer in plan.ranks if peer.host_index == port.host_index and peer.rank != port.rank]
            lines = ["link set lo up", f"addr add {port.ip}/24 dev eth0",
                     f"link set eth0 gso_max_size {NIC_GSO_MAX_SIZE}", "link set eth0 up",
                     f"addr add {port.mgmt_ip}/24 dev mg0", "link set mg0 up",
                     f"addr add 10.78.0.{port.rank + 1}/32 dev nv0", "link set nv0 up"]
            lines += [f"route add {peer.ip}/32 dev nv0 src {port.ip}" for peer in same_host]
            batch("ip", port.namespace, lines)
            if TCP_SYSCTLS:
                run(["ip", "netns", "exec", port.namespace, "sysctl", "-q", "-w", *TCP_SYSCTLS])
            tc = shaper_lines("eth0", port.nic_up_mbit, add=True)
            tc_switch += shaper_lines(f"n{port.rank}", port.nic_down_mbit, add=True)
            if port.nvlink_mbit is not None:
                tc += shaper_lines("nv0", port.nvlink_mbit, add=True)
                tc_switch += shaper_lines(f"v{port.rank}", port.nvlink_mbit, add=True)
            batch("tc", port.namespace, tc)
        batch("tc", sw, tc_switch)
        batch("ip", None, [f"addr add {plan.controller_ip}/24 dev {plan.root_link}", f"link set {plan.root_link} up"])

    def teardown(self) -> float:
        """Delete every namespace and link of this run (idempotent); seconds taken. Kill the processes
        inside first: a process still in a namespace keeps it and its veths alive after ``netns del``."""
        if not self.built:
            return 0.0
        start = time.perf_counter()
        try:
            sweep(prefix=self.plan.prefix)
        finally:
            self.built = False
            self._restore_sigterm()
        return time.perf_counter() - start

    def _install_sigterm(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)

        self._previous_sigterm = signal.signal(signal.SIGTERM, on_term)

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)  # type: ignore[arg-type]
            self._previous_sigterm = None

    # ---- gray failures ---------------------------------------------------------------------
    def nic_mbit(self, rank: int) -> tuple[float, float]:
        """The NIC of ``rank`` as configured now: (uplink, downlink) Mbit/s."""
        return self._nic_mbit[rank]

    def set_nic(self, rank: int, up_mbit: float | None = None, down_mbit: float | None = None) -> float:
        """Change the shaped rate of ``rank``'s NIC (either direction; None keeps it); seconds taken."""
        if not self.built:
            raise FabricError("the emulated fabric is not built")
        port = self.plan.ranks[rank]
        start = time.perf_counter()
        up, down = self._nic_mbit[rank]
        if up_mbit is not None:
            batch("tc", port.namespace, shaper_lines("eth0", up_mbit))
            up = up_mbit
        if down_mbit is not None:
            batch("tc", self.plan.switch_ns, shaper_lines(f"n{rank}", down_mbit))
            down = down_mbit
        self._nic_mbit[rank] = (up, down)
        return time.perf_counter() - start

    def scale_nic(self, rank: int, factor: float) -> float:
        """Both directions of ``rank``'s NIC at ``factor`` × the healthy rate (0.5: halved; 1.0: restored)."""
        if not self.built:
            raise FabricError("the emulated fabric is not built")
        seconds = shape_nic(self.plan, rank, factor)
        port = self.plan.ranks[rank]
        self._nic_mbit[rank] = (port.nic_up_mbit * factor, port.nic_down_mbit * factor)
        return seconds
