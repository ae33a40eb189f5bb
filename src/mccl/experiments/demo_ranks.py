"""One rank of ``mccl demo`` (:mod:`mccl.experiments.demo`), the same on both fabrics.

A rank runs its streams (AllGather by tree packing on one communicator, AllToAll by column
generation on another, each on its own gloo group and controller state), alternating, one
iteration = one collective of each. Every output is compared with the known answer (every
rank can rebuild every input), every ``torch_check_every``-th also with torch's own gloo
collective. The fabric differs only in how the fault is made and where the rank runs:

* ``netemu``: the rank runs in its GPU's network namespace; rank 0 halves the NIC of
  ``fault_rank`` (both directions) with ``tc`` (:func:`~mccl.experiments.netemu.fabric.shape_nic`).
* ``pacer``: ranks on loopback; each rank paces its own sends in the transport (one pacer at
  the NVSwitch port rate for its host's peers, one at the NIC rate for the other host's,
  both / ``scale``), and ``fault_rank`` slows its NIC pacer (the transmit side only: every send
  crossing that link leaves from that rank through that one pacer, so it is emulated exactly).

Phases: ``healthy`` iterations, then the fault until every stream ran ``after_swap`` iterations
on a version newer than the one the fault hit (or ``max_degraded``), then the repair until the
same holds again (or ``max_recovered``). Versions are agreed by the hot swap, so every rank takes
these decisions at the same iteration.
"""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["COMMUNICATORS", "rank_main", "source_of", "known_answer"]

COMMUNICATORS = {"allgather": "netemu-ag", "alltoall": "netemu-a2a"}


def rank_main(rank: int, world: int, plan: Any, endpoint: str, schedules: dict[str, str], config: Any,
              progress: Any, secret: str) -> dict:
    """What one rank did: its records, fabric marks, swaps and the reaction path's marks (module docstring).
    ``plan``: the emulated fabric's plan (netemu) or None (pacer)."""
    import gc

    import torch
    import torch.distributed as dist

    from mccl.control import ControllerClient
    from mccl.runtime import TelemetryConfig, init
    from mccl.runtime.priority import raised
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    if config.switch_interval_s is not None:
        sys.setswitchinterval(config.switch_interval_s)
    topology = parse_topology(config.topology_spec)
    groups = {"allgather": dist.group.WORLD, "alltoall": dist.new_group(backend="gloo")}
    comms, clients = {}, {}
    kept: list[tuple] = []
    try:
        for kind, text in schedules.items():
            schedule = loads_schedule(text)
            with raised(config.swap_priority):  # its ZeroMQ I/O thread, started here, keeps the priority
                clients[kind] = ControllerClient(endpoint, COMMUNICATORS[kind], rank, installed=[schedule],
                                                 secret=secret, interval_s=config.client_interval_s,
                                                 candidates=config.prestage)
            if rank == 0:
                clients[kind].register(schedule)
        dist.barrier()
        for kind, text in schedules.items():
            source = clients[kind] if config.push else _PollOnly(clients[kind])
            comms[kind] = init(groups[kind], source, topology=topology, schedules=[loads_schedule(text)],
                               sink=_RecordingSink(clients[kind], kind, kept), name=COMMUNICATORS[kind],
                               telemetry=TelemetryConfig(flush_interval_s=0.02), poll_s=config.swap_poll_s)
            if comms[kind].swap_control is not None:
                comms[kind].swap_control.poll_s = config.ready_poll_s
            comms[kind].swap_hold_s = config.swap_hold_s
            comms[kind].swap_priority = config.swap_priority
        gpus = loads_schedule(next(iter(schedules.values()))).ranks
        fault = _NetemuFault(plan, rank, config) if plan is not None else _PacedFault(comms, topology, gpus, rank, config)
        if config.gc_freeze:  # the set-up's heap out of the cyclic collector's reach (DemoConfig.gc_freeze)
            gc.collect()
            gc.freeze()
        out = _stream(rank, world, comms, config, progress, fault, torch, dist)
        for comm in comms.values():
            comm.flush_telemetry()
        out["samples"] = list(kept)
        out["received"] = [item for client in clients.values() for item in client.arrivals]
        out["switches"] = {kind: [(seq, at, versions) for seq, at, versions in comm.switches]
                           for kind, comm in comms.items()}
        out["candidates"] = [item for client in clients.values() for item in client.candidate_arrivals]
        out["take_cpu"] = [item for client in clients.values() for item in client.take_cpu]
        out["prestages"] = {kind: list(comm.prestages) for kind, comm in comms.items()}
        out["prestage_hits"] = {kind: comm.prestage_hits for kind, comm in comms.items()}
        out["holds"] = {kind: list(comm.holds) for kind, comm in comms.items()}
        return out
    finally:
        for comm in comms.values():
            comm.close()
        for client in clients.values():
            client.close()


class _PollOnly:
    """The client as a source that can only be polled (``DemoConfig.push`` False): the swap thread asks every
    ``swap_poll_s``, as before pushes."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def poll(self) -> Any:
        return self.client.poll()


class _NetemuFault:
    """A ``tc`` change of ``fault_rank``'s NIC, both directions, made by rank 0."""

    def __init__(self, plan: Any, rank: int, config: Any) -> None:
        self.plan, self.rank, self.config = plan, rank, config

    def set(self, factor: float) -> float:
        """Shape the NIC to ``factor`` of its rate; seconds it took (0 on the ranks that do not make it)."""
        from mccl.experiments.netemu.fabric import shape_nic

        return shape_nic(self.plan, self.config.fault_rank, factor) if self.rank == 0 else 0.0


class _PacedFault:
    """The in-process fabric: this rank's pacers (module docstring), on every communicator's transport."""

    def __init__(self, comms: dict, topology: Any, gpus: Any, rank: int, config: Any) -> None:
        self.comms, self.rank, self.config = comms, rank, config
        hosts = [topology.node(gpu).host for gpu in gpus]
        world = len(gpus)
        self.near = [peer for peer in range(world) if peer != rank and hosts[peer] == hosts[rank]]
        self.far = [peer for peer in range(world) if hosts[peer] != hosts[rank]]
        ports = topology.capacities_gbps[list(topology.out_links[gpus[rank]])]  # NVSwitch port (fast), NIC (slow)
        self.nvswitch_gbps, self.nic_gbps = float(ports.max()) / config.scale, float(ports.min()) / config.scale
        for comm in comms.values():
            if self.near:
                comm.transport.throttle(self.near, self.nvswitch_gbps)
            comm.transport.throttle(self.far, self.nic_gbps)

    def set(self, factor: float) -> float:
        if self.rank != self.config.fault_rank:
            return 0.0
        start = time.perf_counter()
        for comm in self.comms.values():
            comm.transport.throttle(self.far, self.nic_gbps * factor)
        return time.perf_counter() - start


class _RecordingSink:
    """Forwards telemetry to the controller and keeps a copy (kind, sample kind, sender, bytes, seconds,
    end time, seq) for the accuracy figures. Samples are measured on the receive side: a rank's copy
    describes the paths into it."""

    def __init__(self, sink: Any, kind: str, kept: list) -> None:
        self.sink, self.kind, self.kept = sink, kind, kept

    def submit(self, samples: Any) -> None:
        self.sink.submit(samples)
        self.kept.extend((self.kind, s.kind, s.rank, s.bytes, s.seconds, s.end_time, s.seq) for s in samples)


def _stream(rank: int, world: int, comms: dict, config: Any, progress: Any, fault: Any, torch: Any,
            dist: Any) -> dict:
    records: list[tuple] = []
    marks: dict[str, float] = {}
    phase = "healthy"
    hit: dict[str, int] = {}
    settled_since: dict[str, int] = {}
    last_version: dict[str, int] = {}
    limit = config.healthy + config.max_degraded + config.max_recovered
    phase_end = config.healthy + config.max_degraded  # the last iteration of the fault, unless settled earlier
    for index in range(limit):
        if index == config.healthy:
            phase = "degraded"
            marks["tc_s"] = fault.set(config.fault_factor)
            marks["degraded_at"] = time.time()
        for kind, comm in comms.items():
            sources = [source_of(kind, config, world, peer, index, torch) for peer in range(world)]
            source = sources[rank]
            output = torch.empty(source.numel() * (world if kind == "allgather" else 1), dtype=source.dtype)
            size = output.numel() * 4 if kind == "allgather" else source.numel() * 4
            dist.barrier()
            start_wall, start = time.time(), time.perf_counter()
            if kind == "allgather":
                comm.all_gather_into_tensor(output, source)
            else:
                comm.all_to_all_single(output, source)
            seconds = time.perf_counter() - start
            seq, _, version = comm.history[-1]
            version = int(version)
            correct = bool(torch.equal(output, known_answer(kind, sources, rank, world, torch)))
            torch_checked = config.torch_check_every > 0 and index % config.torch_check_every == 0
            if torch_checked:  # torch's own gloo collective on the same group and input
                expected = torch.empty_like(output)
                if kind == "allgather":
                    comm.transport.native_all_gather(expected, source)
                else:
                    comm.transport.native_all_to_all(expected, source, [], [])
                correct = correct and bool(torch.equal(output, expected))
            records.append((kind, seq, version, start_wall, seconds, phase, correct, torch_checked))
            if rank == 0 and progress is not None:
                progress.put((kind, seq, version, start_wall, seconds, size / seconds / 1e9, phase, correct))
            if version != last_version.get(kind):
                last_version[kind], settled_since[kind] = version, index
            if phase != "healthy" and kind not in hit:
                hit[kind] = version
        # versions are agreed by the hot swap, so every rank takes these decisions at the same index
        settled = phase != "healthy" and all(last_version[k] > hit[k] and index - settled_since[k] + 1 >= config.after_swap
                                             for k in comms)
        if phase == "degraded" and (settled or index + 1 >= phase_end):
            if config.max_recovered <= 0:
                break
            phase, hit, phase_end = "restored", {}, index + 1 + config.max_recovered
            marks["tc_restore_s"] = fault.set(1.0)
            marks["restored_at"] = time.time()
        elif phase == "restored" and (settled or index + 1 >= phase_end):
            break
    swaps = {kind: [(s.switch_after, dict(s.adopted).get(kind, 0), s.stage_s, s.ready_s, s.oob_s, s.total_s,
                     s.started_at, s.cpu_s) for s in comm.swaps if s.adopted] for kind, comm in comms.items()}
    return {"records": records, "marks": marks, "swaps": swaps,
            "dropped": sum(comm.telemetry_dropped for comm in comms.values())}


def source_of(kind: str, config: Any, world: int, rank: int, index: int, torch: Any) -> Any:
    """Rank ``rank``'s input of iteration ``index``: random, and reproducible by every rank (the known answer)."""
    generator = torch.Generator().manual_seed(1_000_003 * index + 1009 * rank + (7 if kind == "alltoall" else 0))
    elements = config.ag_bytes // 4 if kind == "allgather" else (config.a2a_bytes // 4 // world) * world
    return torch.randint(-2**30, 2**30, (elements,), dtype=torch.int32, generator=generator)


def known_answer(kind: str, sources: list, rank: int, world: int, torch: Any) -> Any:
    """What the collective must produce on ``rank``: every input in rank order (AllGather), or block
    ``rank`` of every rank's input (AllToAll)."""
    if kind == "allgather":
        return torch.cat(sources)
    block = sources[0].numel() // world
    return torch.cat([source[rank * block:(rank + 1) * block] for source in sources])
