"""``mccl demo`` (its default fabric; ``--fabric netemu``): the closed loop (mccl-paper §6.2.2, Fig. 13) on a kernel-emulated fabric.

What runs: the fabric of ``rail_optimized(1, 2, 4)`` (2 hosts × 4 GPUs, one NIC per GPU, as in
Fig. 13) built as namespaces and shaped veths (:mod:`.fabric`, rates = the topology's / ``scale``),
a controller process in the root namespace (reached over the management network), and 8 gloo
ranks, one in each GPU's namespace (:mod:`.ranks`). Every rank runs two streams through the mccl
executor, alternating: AllGather (tree packing) on one communicator, AllToAll (column generation)
on another, each on its own gloo group, each with its own controller state. The data crosses
real sockets and real shaped links; nothing is paced in the process.

The gray failure is a ``tc`` change: after ``healthy`` iterations rank 0 halves both directions
of its own NIC (gpu0 ↔ tor0.0, the rank 0 ↔ rank 4 path of Fig. 13); once both streams have run
``after_swap`` iterations on a version newer than the one the fault hit (or after
``max_degraded`` iterations), it restores the NIC, and the run ends when both streams have run
``after_swap`` iterations on a version newer again (or after ``max_recovered``). Versions are agreed
by the hot swap, so every rank takes the same decisions at the same iteration.

Every collective's output is compared with torch's own gloo collective on the same group and input.
The fabric is torn down on every exit path, the controller and the ranks stopped first.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from mccl.errors import MCCLError
from mccl.experiments.netemu.fabric import EmulatedFabric, FabricPlan, shape_nic
from mccl.experiments.netemu.report import CollectiveRecord, NetemuReport, Swap
from mccl.experiments.netemu.shaping import GOODPUT

__all__ = ["NetemuConfig", "run_netemu_demo"]

COMMUNICATORS = {"allgather": "netemu-ag", "alltoall": "netemu-a2a"}


@dataclass(frozen=True, kw_only=True)
class NetemuConfig:
    """``hosts`` × ``gpus_per_host`` ranks on ``rail_optimized(1, hosts, gpus_per_host)``. ``ag_bytes``:
    AllGather input per rank; ``a2a_bytes``: AllToAll send buffer per rank. ``scale``: emulated rates
    are the topology's / this (400 Gbit/s NICs → 400 Mbit/s). ``nvlink``: "shaped" (at the topology's
    NVLink rate / scale) or "unshaped". ``fault_rank``/``fault_factor``: whose NIC, and to what fraction
    (both directions). ``healthy``, ``after_swap``, ``max_degraded``, ``max_recovered``: iterations
    (one AllGather + one AllToAll each), see the module docstring. ``alpha``/``gamma``/``alpha_level``/
    ``warmup``/``settle``: the controller's :class:`~mccl.control.ControlConfig`. ``chunks``: most chunks per
    source (AllGather trees) and per block (AllToAll), for the first schedules and every re-synthesis: fewer
    chunks, fewer Python-level sends per collective (the CPU floor, see BENCHMARKS.md). Every collective's
    output is compared with the known answer; every ``torch_check_every``-th iteration (0: never) also with
    torch's own gloo collective on the same group and input."""

    hosts: int = 2
    gpus_per_host: int = 4
    ag_bytes: int = 256 << 10
    a2a_bytes: int = 512 << 10
    scale: float = 20000.0
    nvlink: str = "shaped"
    fault_rank: int = 0
    fault_factor: float = 0.5
    # `mccl demo`'s run: 25–60 s of collectives (50–52 of them, with their checks); the start-up before them is
    # CPU-bound (8 ranks import torch): 85 s at load 12–22, 150–190 s at load 25–40 (BENCHMARKS.md, 2026-12-01)
    healthy: int = 6
    after_swap: int = 3
    max_degraded: int = 12
    max_recovered: int = 12
    torch_check_every: int = 5
    chunks: int = 4
    # per-sample telemetry noise here was ~40 % (CV, TCP flows without fair queueing, send-side timing then,
    # a loaded CPU): α 0.5 / Γ 0.2 flagged healthy schedules and swapped 3–8 times per fault; α 0.15 / Γ 0.3
    # with the synthesizer on the same EWMA swapped 1–2 times (BENCHMARKS.md, 2026-11-30 netemu)
    alpha: float = 0.15
    gamma: float = 0.3
    alpha_level: float | None = None
    warmup: int = 3
    settle: int = 3
    # the reaction path (Fig. 13b): how often the controller runs its drift test and synthesis, how often a
    # rank's client may ask it for a new version, and how often the communicator's swap thread polls its client
    # (an answer is picked up on the poll after the one that asked: dispatch ≤ 2 × swap_poll_s; the defaults of
    # the service / client / communicator: 20 / 50 / 20 ms)
    check_interval_s: float = 0.01
    client_interval_s: float = 0.005
    swap_poll_s: float = 0.005
    timeout_s: float = 300.0

    @property
    def topology_spec(self) -> str:
        return f"rail_optimized(1,{self.hosts},{self.gpus_per_host})"

    @property
    def ranks(self) -> int:
        return self.hosts * self.gpus_per_host


# ---- the controller process (root namespace, bound on the management network) ----------------
def _synth_options(chunks: int) -> dict:
    from mccl.schedule import Collective
    from mccl.synth.options import AllToAllOptions, TreePackOptions

    return {Collective.ALLGATHER: TreePackOptions(chunks=chunks), Collective.ALLTOALL: AllToAllOptions(chunks=chunks)}


def _controller_main(topology_spec: str, bind: str, control: dict, chunks: int, secret: str,
                     check_interval_s: float) -> None:
    import logging

    from mccl.control import ControlConfig, ControllerService, ScheduleManager
    from mccl.topology import parse_topology

    logging.basicConfig(level=logging.WARNING)
    manager = ScheduleManager(parse_topology(topology_spec), ControlConfig(**control, synth_options=_synth_options(chunks)))
    ControllerService(manager, bind, secret=secret, check_interval_s=check_interval_s).serve_forever()


# ---- one rank (inside its GPU's namespace) --------------------------------------------------
def _rank_main(rank: int, world: int, plan: FabricPlan, endpoint: str, schedules: dict[str, str],
               config: NetemuConfig, progress: object, secret: str) -> dict:
    import torch
    import torch.distributed as dist

    from mccl.control import ControllerClient
    from mccl.runtime import TelemetryConfig, init
    from mccl.schedule import loads_schedule
    from mccl.topology import parse_topology

    topology = parse_topology(config.topology_spec)
    groups = {"allgather": dist.group.WORLD, "alltoall": dist.new_group(backend="gloo")}
    comms, clients = {}, {}
    kept: list[tuple] = []
    received: list[tuple[str, int, float]] = []
    try:
        for kind, text in schedules.items():
            schedule = loads_schedule(text)
            clients[kind] = ControllerClient(endpoint, COMMUNICATORS[kind], rank, installed=[schedule], secret=secret,
                                             interval_s=config.client_interval_s)
            if rank == 0:
                clients[kind].register(schedule)
        dist.barrier()
        for kind, text in schedules.items():
            comms[kind] = init(groups[kind], _TimedSource(clients[kind], kind, received), topology=topology, schedules=[loads_schedule(text)],
                               sink=_RecordingSink(clients[kind], kind, kept), name=COMMUNICATORS[kind],
                               telemetry=TelemetryConfig(flush_interval_s=0.02), poll_s=config.swap_poll_s)
        out = _stream(rank, world, plan, comms, config, progress, torch, dist)
        for comm in comms.values():
            comm.flush_telemetry()
        out["samples"] = list(kept)
        out["received"] = list(received)
        return out
    finally:
        for comm in comms.values():
            comm.close()
        for client in clients.values():
            client.close()


class _TimedSource:
    """The controller's client as the communicator's schedule source, noting when each new version reached
    this rank (wall clock: the controller's "issued" events are on the same machine's clock) — the dispatch
    term of the reaction time."""

    def __init__(self, client: object, kind: str, received: list) -> None:
        self.client, self.kind, self.received = client, kind, received

    def poll(self):  # noqa: ANN201 - a Schedule or None
        schedule = self.client.poll()
        if schedule is not None:
            self.received.append((self.kind, int(schedule.meta.version or 0), time.time()))
        return schedule


class _RecordingSink:
    """Forwards telemetry to the controller and keeps a copy (kind, sample kind, sender, bytes, seconds,
    end time, seq) for the accuracy figures: what the controller was told, against the shaped rates. The
    samples are measured on the receive side: a rank's copy describes the paths into it."""

    def __init__(self, sink: object, kind: str, kept: list) -> None:
        self.sink, self.kind, self.kept = sink, kind, kept

    def submit(self, samples) -> None:  # noqa: ANN001 - a sequence of mccl Samples
        self.sink.submit(samples)
        self.kept.extend((self.kind, s.kind, s.rank, s.bytes, s.seconds, s.end_time, s.seq) for s in samples)


def _stream(rank: int, world: int, plan: FabricPlan, comms: dict, config: NetemuConfig, progress: object,
            torch, dist) -> dict:  # noqa: ANN001 - torch modules, imported in the rank
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
            if rank == 0:
                marks["tc_s"] = shape_nic(plan, config.fault_rank, config.fault_factor)
            marks["degraded_at"] = time.time()
        for kind, comm in comms.items():
            sources = [_source(kind, config, world, peer, index, torch) for peer in range(world)]
            source = sources[rank]
            output, size = torch.empty(source.numel() * (world if kind == "allgather" else 1), dtype=source.dtype), 0
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
            correct = bool(torch.equal(output, _known_answer(kind, sources, rank, world, torch)))
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
            phase, hit, phase_end = "restored", {}, index + 1 + config.max_recovered
            if rank == 0:
                marks["tc_restore_s"] = shape_nic(plan, config.fault_rank, 1.0)
            marks["restored_at"] = time.time()
        elif phase == "restored" and (settled or index + 1 >= phase_end):
            break
    swaps = {kind: [(s.switch_after, dict(s.adopted).get(kind, 0), s.stage_s, s.ready_s, s.oob_s, s.total_s)
                    for s in comm.swaps if s.adopted] for kind, comm in comms.items()}
    return {"records": records, "marks": marks, "swaps": swaps,
            "dropped": sum(comm.telemetry_dropped for comm in comms.values())}


def _source(kind: str, config: NetemuConfig, world: int, rank: int, index: int, torch):  # noqa: ANN001, ANN202
    """Rank ``rank``'s input of iteration ``index``: random, and reproducible by every rank (the known answer)."""
    generator = torch.Generator().manual_seed(1_000_003 * index + 1009 * rank + (7 if kind == "alltoall" else 0))
    elements = config.ag_bytes // 4 if kind == "allgather" else (config.a2a_bytes // 4 // world) * world
    return torch.randint(-2**30, 2**30, (elements,), dtype=torch.int32, generator=generator)


def _known_answer(kind: str, sources: list, rank: int, world: int, torch):  # noqa: ANN001, ANN202
    """What the collective must produce on ``rank``: every input in rank order (AllGather), or block
    ``rank`` of every rank's input (AllToAll)."""
    if kind == "allgather":
        return torch.cat(sources)
    block = sources[0].numel() // world
    return torch.cat([source[rank * block:(rank + 1) * block] for source in sources])


# ---- the driver ---------------------------------------------------------------------------
def run_netemu_demo(config: NetemuConfig, *, progress: Callable[[str], None] | None = None,
                    on_collective: Callable[[tuple], None] | None = None) -> NetemuReport:
    """Build the fabric, run the loop (module docstring), tear everything down; what happened.
    ``on_collective`` sees rank 0's view of each collective as it finishes (the live table)."""
    from mccl.control import ControllerClient
    from mccl.control.auth import new_secret
    from mccl.control.client import wait_for_controller
    from mccl.experiments.netemu.ranks import run_ranks_in_fabric
    from mccl.schedule import Collective, dumps_schedule
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    if config.hosts < 2 or config.gpus_per_host < 1 or not 0 <= config.fault_rank < config.ranks:
        raise MCCLError(f"the netemu demo needs ≥ 2 hosts and a fault rank among its {config.ranks} ranks")
    if not 0 < config.fault_factor <= 1:
        raise MCCLError(f"fault_factor is the NIC's remaining fraction, in (0, 1], not {config.fault_factor}")
    say = progress or (lambda text: None)
    topology = parse_topology(config.topology_spec)
    options = _synth_options(config.chunks)
    results = {kind: optimize(topology, kind, options=options[Collective(kind)]) for kind in ("allgather", "alltoall")}
    schedules = {kind: result.schedule.with_meta(version=1) for kind, result in results.items()}
    plan = FabricPlan.from_topology(topology, scale=config.scale, nvlink=config.nvlink)
    control = {"alpha": config.alpha, "gamma": config.gamma, "alpha_level": config.alpha_level,
               "warmup": config.warmup, "settle_collectives": config.settle}
    started, started_at = time.perf_counter(), time.time()
    with EmulatedFabric(plan) as fabric:
        plan = fabric.plan
        say(f"fabric {plan.topology_name} built in {fabric.build_s:.2f} s: {len(plan.ranks)} GPU namespaces, NICs "
            f"{plan.ranks[0].nic_up_mbit:g} Mbit/s, NVLink "
            + (f"{plan.ranks[0].nvlink_mbit:g} Mbit/s" if plan.ranks[0].nvlink_mbit else "unshaped")
            + f" (1/{config.scale:g} of the topology)")
        endpoint = f"tcp://{plan.controller_ip}:{_free_port(plan.controller_ip)}"
        context = mp.get_context("spawn")
        secret = new_secret().hex  # this run's control-plane secret: the controller and the ranks get it, nobody else
        controller = context.Process(target=_controller_main, args=(config.topology_spec, endpoint, control, config.chunks, secret,
                                                                    config.check_interval_s), daemon=True)
        controller.start()
        live = context.Queue()
        stop = threading.Event()
        watcher = threading.Thread(target=_forward, args=(live, stop, on_collective), daemon=True)
        watcher.start()
        admin = None
        try:
            wait_for_controller(endpoint, secret=secret, timeout_s=60.0, alive=controller.is_alive)
            say(f"controller at {endpoint}; starting {config.ranks} gloo ranks in their namespaces")
            texts = {kind: dumps_schedule(schedule) for kind, schedule in schedules.items()}
            outputs = run_ranks_in_fabric(_rank_main, plan, endpoint, texts, config, live, secret, timeout_s=config.timeout_s)
            admin = ControllerClient(endpoint, "admin", -1, secret=secret)
            status = admin.status()
            admin.request("stop")
        finally:
            stop.set()
            watcher.join(timeout=5)
            if admin is not None:
                admin.close()
            controller.join(timeout=5)
            if controller.is_alive():
                controller.terminate()
                controller.join(timeout=5)
        teardown_s = fabric.teardown()
    predicted = {kind: float(result.schedule.meta.achieved_gbs or 0.0) for kind, result in results.items()}
    report = _report(config, plan, outputs, status, predicted, time.perf_counter() - started, teardown_s)
    return replace(report, startup_s=report.records[0].start - started_at if report.records else 0.0)


def _forward(live: object, stop: threading.Event, on_collective: Callable[[tuple], None] | None) -> None:
    while not stop.is_set():
        try:
            item = live.get(timeout=0.2)
        except queue.Empty:
            continue
        except (EOFError, OSError):
            return
        if on_collective is not None:
            on_collective(item)


def _free_port(address: str) -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _report(config: NetemuConfig, plan: FabricPlan, outputs: list[dict], status: dict, predicted: dict,
            wall_s: float, teardown_s: float) -> NetemuReport:
    by_key: dict[tuple[str, int], list] = {}
    for output in outputs:
        for kind, seq, version, start, seconds, phase, ok, torch_checked in output["records"]:
            by_key.setdefault((kind, seq), []).append((version, start, seconds, phase, ok, torch_checked))
    records = []
    for (kind, seq), rows in sorted(by_key.items(), key=lambda item: min(row[1] for row in item[1])):
        if len({row[0] for row in rows}) != 1:
            raise MCCLError(f"{kind} collective {seq} ran on different schedule versions on different ranks")
        seconds = max(row[2] for row in rows)
        size = config.ag_bytes * config.ranks if kind == "allgather" else (
            config.a2a_bytes // 4 // config.ranks) * config.ranks * 4
        records.append(CollectiveRecord(kind, seq, rows[0][0], min(row[1] for row in rows), seconds, size / seconds / 1e9,
                                        rows[0][3], all(row[4] for row in rows), rows[0][5]))
    marks = outputs[0]["marks"]
    received = {(kind, version): at for kind, version, at in outputs[0].get("received", [])}
    swaps = tuple(Swap(kind, *item, received_at=received.get((kind, item[1]))) for kind, items in outputs[0]["swaps"].items()
                  for item in items)
    return NetemuReport(config=asdict(config), records=tuple(records), events=tuple(status["events"]),
                        degraded_at=marks.get("degraded_at", 0.0), restored_at=marks.get("restored_at"),
                        tc_s=(marks.get("tc_s", 0.0), marks.get("tc_restore_s", 0.0)), swaps=swaps,
                        predicted_v1=predicted, scale=config.scale, goodput=GOODPUT,
                        nic_mbit=plan.ranks[config.fault_rank].nic_up_mbit, wall_s=wall_s, teardown_s=teardown_s,
                        controller_stats={**status["stats"], "telemetry_dropped": sum(o["dropped"] for o in outputs)},
                        communicators=COMMUNICATORS,
                        telemetry={rank: output["samples"] for rank, output in enumerate(outputs)},
                        prefix=plan.prefix)
