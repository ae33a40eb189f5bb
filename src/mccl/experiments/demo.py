"""``mccl demo``: the closed loop of mccl-paper §3 live on this machine (§6.2.2, Figure 13a).

What runs: a controller process (:class:`~mccl.control.ControllerService` with the
tree-packing synthesizer) and N gloo ranks on loopback, each running a stream of
AllGathers through the mccl executor on an emulated fabric. The ranks are the GPUs
of ``rail_optimized(1, 2, N/2)`` (two hosts); loopback is far faster than that
fabric scaled down by ``fabric_scale``, so the fabric is emulated in the executor's
transport (:meth:`mccl.runtime.transport.Transport.throttle`, real delays): each
rank's sends to its own host share one pacer at the NVSwitch port rate, its sends
to the other host one pacer at the NIC rate (both / ``fabric_scale``). After
``healthy`` collectives the transmit side of rank 0's NIC (link gpu0 → tor0.0)
degrades to ``degraded_gbps`` (Fail2's 50 Gbit/s, one direction): rank 0's pacer
for the other host slows to that rate. One direction because it is emulated
exactly — every send crossing that link leaves from rank 0 through that one
pacer — while the receive side is shared by senders in several processes.
The executors' passive telemetry sees it, the controller's drift test flags the
schedule, re-synthesizes on the measured topology, and the ranks hot-swap to the
new version at an agreed sequence number K.

Every collective's output is compared with torch's own ``all_gather_into_tensor``
of the same input. Every wait is bounded (``timeout_s``); the controller process is
stopped on every exit path.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass, field

from mccl.errors import MCCLError

__all__ = ["DemoConfig", "CollectiveRecord", "Swap", "DemoReport", "run_demo"]

COMMUNICATOR = "demo"


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """``ranks``: 4 or 8 gloo processes. ``size_bytes``: AllGather input per rank. ``healthy``:
    collectives before the degradation. ``after_swap``: collectives run on one unchanged newer
    schedule version before stopping (the loop has settled). ``max_collectives``: stop there in any case. ``degraded_gbps``: the degraded cable's
    rate in the topology's units (rank 0's NIC, transmit side). ``fabric_scale``: emulated rates are the topology's / this.
    ``alpha``/``gamma``: the controller's EWMA factor and drift threshold."""

    ranks: int = 4
    size_bytes: int = 1 << 20
    healthy: int = 12
    after_swap: int = 10
    max_collectives: int = 60
    degraded_gbps: float = 50.0
    fabric_scale: float = 1000.0
    alpha: float = 0.5
    gamma: float = 0.2
    timeout_s: float = 90.0

    @property
    def topology_spec(self) -> str:
        return f"rail_optimized(1,2,{self.ranks // 2})"


@dataclass(frozen=True)
class CollectiveRecord:
    """One AllGather: its sequence number, the schedule version it ran, when it started (wall
    clock, s), how long the slowest rank took (s), algbw (GB/s), and whether every rank's output
    equalled torch's."""

    seq: int
    version: int
    start: float
    seconds: float
    algbw_gbs: float
    degraded: bool
    correct: bool


@dataclass(frozen=True)
class Swap:
    """One hot swap as rank 0 saw it: collectives after ``switch_after`` (K) run ``version``;
    ``oob_s``: the out-of-band agreement, ``total_s``: staging to agreement (seconds)."""

    switch_after: int
    version: int
    oob_s: float
    total_s: float


@dataclass(frozen=True)
class DemoReport:
    config: DemoConfig
    records: tuple[CollectiveRecord, ...]
    events: tuple[dict, ...]
    degraded_at: float
    swaps: tuple[Swap, ...]
    controller_stats: dict = field(default_factory=dict)

    def _event(self, kind: str) -> dict | None:
        return next((event for event in self.events if event["kind"] == kind and event["time"] >= self.degraded_at),
                    None)

    @property
    def detection_s(self) -> float | None:
        flagged = self._event("flagged")
        return None if flagged is None else flagged["time"] - self.degraded_at

    @property
    def synthesis_s(self) -> float | None:
        synthesized = self._event("synthesized")
        return None if synthesized is None else synthesized["value"]

    @property
    def issued_s(self) -> float | None:
        issued = self._event("issued")
        return None if issued is None else issued["time"] - self.degraded_at

    @property
    def version_at_degradation(self) -> int:
        return next((r.version for r in self.records if r.degraded), self.records[-1].version)

    @property
    def first_new(self) -> CollectiveRecord | None:
        """The first collective after the degradation on a newer version than the one it hit."""
        hit = self.version_at_degradation
        return next((r for r in self.records if r.degraded and r.version > hit), None)

    @property
    def activated_s(self) -> float | None:
        """From the degradation to the start of the first collective on a new version (reaction time)."""
        first = self.first_new
        return None if first is None else first.start - self.degraded_at

    def median_algbw(self, phase: str) -> float | None:
        """``healthy``, ``degraded`` (the schedule the degradation hit, on the slow link) or ``recovered``
        (the last version the loop settled on, when newer than that one)."""
        hit, last = self.version_at_degradation, self.records[-1].version
        chosen = [r.algbw_gbs for r in self.records
                  if (phase == "healthy" and not r.degraded)
                  or (phase == "degraded" and r.degraded and r.version == hit)
                  or (phase == "recovered" and last > hit and r.degraded and r.version == last)]
        return statistics.median(chosen) if chosen else None

    @property
    def all_correct(self) -> bool:
        return all(record.correct for record in self.records)


# ---- the controller process ------------------------------------------------------------------
def _controller_main(topology_spec: str, bind: str, alpha: float, gamma: float, secret: str) -> None:
    import logging

    from mccl.control import ControlConfig, ControllerService, ScheduleManager
    from mccl.topology import parse_topology

    logging.basicConfig(level=logging.WARNING)
    # start-up (connections, caches) lasts a few collectives on a loaded machine: skip 4, then learn the
    # healthy references over 4 samples per overlay link
    manager = ScheduleManager(parse_topology(topology_spec),
                              ControlConfig(alpha=alpha, gamma=gamma, warmup=4, settle_collectives=4))
    ControllerService(manager, bind, secret=secret).serve_forever()


# ---- one rank ----------------------------------------------------------------------------------
def _rank_main(rank: int, world: int, endpoint: str, schedule_text: str, config: DemoConfig, secret: str) -> dict:
    import torch
    import torch.distributed as dist

    from mccl.control import ControllerClient
    from mccl.runtime import TelemetryConfig, init
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    topology = parse_topology(config.topology_spec)
    schedule = loads_schedule(schedule_text)
    client = ControllerClient(endpoint, COMMUNICATOR, rank, installed=[schedule], secret=secret)
    if rank == 0:
        client.register(schedule)
    dist.barrier()
    comm = init(topology=topology, schedules=[schedule], controller=client, sink=client, name=COMMUNICATOR,
                telemetry=TelemetryConfig(flush_interval_s=0.02))
    gpus = schedule.ranks
    hosts = [topology.node(gpu).host for gpu in gpus]
    near = [peer for peer in range(world) if peer != rank and hosts[peer] == hosts[rank]]
    far = [peer for peer in range(world) if hosts[peer] != hosts[rank]]
    scale = config.fabric_scale
    ports = topology.capacities_gbps[list(topology.out_links[gpus[rank]])]  # NVSwitch port (fast), NIC (slow)
    if near:  # the emulated fabric: this GPU's NVSwitch port and its NIC, one shared pacer each
        comm.transport.throttle(near, float(ports.max()) / scale)
    comm.transport.throttle(far, float(ports.min()) / scale)
    elements = config.size_bytes // 4
    generator = torch.Generator().manual_seed(1234 + rank)
    records = []
    degraded_at = 0.0
    first_version = int(schedule.meta.version)
    changed_at, current, hit_version = 0, first_version, first_version
    try:
        for index in range(config.max_collectives):
            if index == config.healthy:  # the gray failure: rank 0's NIC transmits slower
                if rank == 0:
                    comm.transport.throttle(far, config.degraded_gbps / scale)
                degraded_at = time.time()
            source = torch.randint(-2**30, 2**30, (elements,), dtype=torch.int32, generator=generator)
            output = torch.empty(elements * world, dtype=torch.int32)
            expected = torch.empty_like(output)
            dist.barrier()
            start_wall, start = time.time(), time.perf_counter()
            comm.all_gather_into_tensor(output, source)
            seconds = time.perf_counter() - start
            seq, _, version = comm.history[-1]
            comm.transport.native_all_gather(expected, source)  # torch's own gloo AllGather, same group
            records.append((seq, int(version), start_wall, seconds, index >= config.healthy,
                            bool(torch.equal(output, expected))))
            if version != current:  # versions are agreed, so every rank stops after the same collective
                changed_at, current = index, version
            if index == config.healthy:
                hit_version = version
            if index >= config.healthy and current > hit_version and index - changed_at + 1 >= config.after_swap:
                break
        comm.transport.throttle(near + far, None)
        swaps = [(s.switch_after, dict(s.adopted).get("allgather", 0), s.oob_s, s.total_s)
                 for s in comm.swaps if s.adopted]
        return {"records": records, "degraded_at": degraded_at, "swaps": swaps, "dropped": client.dropped}
    finally:
        comm.close()
        client.close()


def _wait_for_controller(endpoint: str, process: mp.process.BaseProcess, timeout_s: float, secret: str) -> None:
    from mccl.control.client import wait_for_controller

    wait_for_controller(endpoint, secret=secret, timeout_s=timeout_s, alive=process.is_alive, communicator=COMMUNICATOR)


def run_demo(config: DemoConfig, *, progress=None) -> DemoReport:
    """Run the closed loop (see module docstring) and return what happened."""
    from mccl.control import ControllerClient
    from mccl.control.auth import new_secret
    from mccl.runtime.launch import free_port, run_ranks
    from mccl.schedule import dumps_schedule
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    if config.ranks not in (4, 8):
        raise MCCLError(f"the demo runs 4 or 8 ranks, not {config.ranks}")
    say = progress or (lambda text: None)
    topology = parse_topology(config.topology_spec)
    schedule = optimize(topology, "allgather").schedule.with_meta(version=1)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    secret = new_secret().hex  # this run's control-plane secret: the controller and the ranks get it, nobody else
    context = mp.get_context("spawn")
    controller = context.Process(target=_controller_main, args=(config.topology_spec, endpoint, config.alpha,
                                                                  config.gamma, secret), daemon=True)
    controller.start()
    admin = None
    try:
        say(f"controller at {endpoint}; starting {config.ranks} gloo ranks on {config.topology_spec}")
        _wait_for_controller(endpoint, controller, 30.0, secret)
        results = run_ranks(_rank_main, config.ranks, endpoint, dumps_schedule(schedule), config, secret,
                            timeout_s=config.timeout_s)
        admin = ControllerClient(endpoint, COMMUNICATOR, -1, secret=secret)
        status = admin.status()
        admin.request("stop")
    finally:
        if admin is not None:
            admin.close()
        controller.join(timeout=5)
        if controller.is_alive():
            controller.terminate()
            controller.join(timeout=5)
    n = config.ranks
    by_seq: dict[int, list] = {}
    for result in results:
        for seq, version, start, seconds, degraded, ok in result["records"]:
            by_seq.setdefault(seq, []).append((version, start, seconds, degraded, ok))
    records = []
    for seq in sorted(by_seq):
        rows = by_seq[seq]
        if len({row[0] for row in rows}) != 1:
            raise MCCLError(f"collective {seq} ran on different schedule versions on different ranks")
        seconds = max(row[2] for row in rows)
        records.append(CollectiveRecord(seq, rows[0][0], min(row[1] for row in rows), seconds,
                                        n * config.size_bytes / seconds / 1e9, rows[0][3], all(row[4] for row in rows)))
    swaps = tuple(Swap(*item) for item in results[0]["swaps"])
    return DemoReport(config, tuple(records), tuple(status["events"]), results[0]["degraded_at"], swaps,
                      {**status["stats"], "telemetry_dropped": sum(r["dropped"] for r in results)})
