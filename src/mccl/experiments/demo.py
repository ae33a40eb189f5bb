"""``mccl demo``: the closed loop of mccl-paper §3 live on this machine (§6.2.2, Fig. 13) — one driver, two fabrics.

What runs: a controller process (:class:`~mccl.control.ControllerService` with the tree-packing
and column-generation synthesizers) and one gloo rank per GPU of ``rail_optimized(1, hosts,
gpus_per_host)``, each running its streams through the mccl executor (:mod:`.demo_ranks`: the
rank loop, the phases, the checks against the known answer and torch's own collective). A
gray failure halves a NIC after ``healthy`` iterations and is repaired once the loop has
settled; the executors' passive telemetry sees it, the controller flags the schedule,
re-synthesizes on the measured topology, and the ranks hot-swap at an agreed sequence number.

The fabric (``DemoConfig.fabric``):

* ``netemu`` (default of ``mccl demo``): network namespaces, veths and ``tc``-shaped links
  (:mod:`mccl.experiments.netemu`), 2 hosts × 4 GPUs as in Fig. 13, AllGather and AllToAll; the
  controller in the root namespace on the management network; the fault a ``tc`` change of
  both directions. Needs root.
* ``pacer``: ranks on loopback, the fabric emulated by each rank's transport pacing its own
  sends (:meth:`mccl.runtime.transport.Transport.throttle`); the fault slows the transmit side
  of one NIC. Runs anywhere (``DemoConfig.pacer()``: its defaults, AllGather only).

Both give one :class:`~mccl.experiments.netemu.report.NetemuReport` (phases, versions, the
controller's events, the reaction path's marks in ``trace``). Every wait is bounded
(``timeout_s``); the controller, the ranks and the fabric are stopped on every exit path.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from mccl.errors import MCCLError
from mccl.experiments.demo_ranks import COMMUNICATORS, rank_main

__all__ = ["DemoConfig", "run_demo", "synth_options"]

FABRICS = ("netemu", "pacer")


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """``fabric``: "netemu" or "pacer" (module docstring). ``hosts`` × ``gpus_per_host`` ranks on
    ``rail_optimized(1, hosts, gpus_per_host)``. ``kinds``: the streams (allgather, alltoall). ``ag_bytes``:
    AllGather input per rank; ``a2a_bytes``: AllToAll send buffer per rank. ``scale``: emulated rates are
    the topology's / this (400 Gbit/s NICs → 20 Mbit/s at 20000). ``nvlink`` (netemu): "shaped" (at the
    topology's NVLink rate / scale) or "unshaped". ``fault_rank``/``fault_factor``: whose NIC, and to what
    fraction. ``healthy``, ``after_swap``, ``max_degraded``, ``max_recovered`` (0: no repair phase):
    iterations (one collective per stream each), see :mod:`.demo_ranks`. ``alpha``/``gamma``/``alpha_level``/
    ``warmup``/``settle``: the controller's :class:`~mccl.control.ControlConfig`; ``speculate``: the fraction
    of Γ at which a drifting schedule is synthesized ahead of its flag (None: never; :mod:`mccl.control.manager`).
    ``chunks``: most chunks per source (AllGather trees) and per block (AllToAll), None: the synthesizers'
    defaults. ``torch_check_every``: every so many iterations the outputs are also compared with torch's gloo
    collective (0: never)."""

    fabric: str = "netemu"
    hosts: int = 2
    gpus_per_host: int = 4
    kinds: tuple[str, ...] = ("allgather", "alltoall")
    ag_bytes: int = 256 << 10
    a2a_bytes: int = 512 << 10
    scale: float = 20000.0
    nvlink: str = "shaped"
    fault_rank: int = 0
    fault_factor: float = 0.5
    # `mccl demo`'s run: 25–60 s of collectives (50–52 of them, with their checks); the start-up before them is
    # CPU-bound (8 ranks import torch): 85 s at load 12–22, 150–190 s at load 25–40 (BENCHMARKS.md, 2026-12-01)
    # max_degraded (tenth session: 20, was 12): at α 0.15 the drift test needs about 10 collectives of the halved NIC
    # (src/mccl/experiments/README.md, "Choosing α and Γ"); a fresh clone's `mccl demo` flagged at 10 and 9 on its
    # second run and not within 12 on its first (cold caches), so the fault showed no swap. The fault phase still
    # ends `after_swap` collectives after the swap: 20 only lengthens a run whose detection is slow.
    # after_swap (eleventh session: 7, was 3, as benchmarks/netemu.py has used since the seventh): a new version's path
    # samples count `settle` (3) collectives after its issue and its references are learned over `warmup` (3) more;
    # a repair 3 collectives after the swap came inside that window, the version learned its references on the
    # repaired fabric, and the swap back had no jump to see — in 7 of 10 runs the AllToAll stayed on the fault's
    # version after the repair (0.85–0.87 of the healthy rate); with 7, both collectives swapped back to the healthy
    # schedule 2 collectives after the repair in 12 of 13 runs (BENCHMARKS.md, eleventh session)
    healthy: int = 6
    after_swap: int = 7
    max_degraded: int = 20
    max_recovered: int = 12
    torch_check_every: int = 5
    chunks: int | None = 4
    # per-sample telemetry noise here was ~40 % (CV, TCP flows without fair queueing, send-side timing then,
    # a loaded CPU): α 0.5 / Γ 0.2 flagged healthy schedules and swapped 3–8 times per fault; α 0.15 / Γ 0.3
    # with the synthesizer on the same EWMA swapped 1–2 times (BENCHMARKS.md, 2026-11-30 netemu)
    alpha: float = 0.15
    gamma: float = 0.3
    alpha_level: float | None = None
    warmup: int = 3
    settle: int = 3
    speculate: float | None = 0.5
    # a wider band (× nominal per link) in which a speculation is offered at the flag and issued only where the guard
    # chooses it (mccl.control.ahead, "The wider band"; None: the 10 % band and "kept going" only)
    speculate_band: float | None = None
    # the reaction path (Fig. 13b): how often the controller runs its drift test and synthesis; how often a
    # rank's client asks the controller (liveness only: new versions are pushed, mccl.control.service); how long
    # the communicator's swap thread waits on the client per call (it wakes when a version is pushed)
    check_interval_s: float = 0.01
    client_interval_s: float = 0.1
    swap_poll_s: float = 0.05
    # False: the swap thread polls the client every swap_poll_s instead of waiting for a push (the path before
    # issue 15's pushes, kept for the A/B of benchmarks/reaction.py)
    push: bool = True
    # the ranks ask for candidates (mccl.control.candidates): a synthesis ahead of the flag is pushed and
    # prepared before the flag. ready_poll_s: None, the hot swap's ready wait is the store's event; a number,
    # it polls (the path before). switch_interval_s: the ranks' sys.setswitchinterval (None: Python's 5 ms):
    # how long the swap thread may wait for the GIL while the main thread runs a collective
    prestage: bool = True
    ready_poll_s: float | None = None
    switch_interval_s: float | None = None
    # the ranks' hot-swap hold (Communicator.swap_hold_s, mccl.runtime.hotswap "The hold"; None: off)
    swap_hold_s: float | None = None
    # the reaction path's threads above the collective's (mccl.runtime.priority; root only, refused → as before):
    # each rank's swap thread and controller clients' ZeroMQ I/O threads this many steps of niceness higher
    swap_priority: int | None = None
    # the controller process's niceness increment (os.nice; negative needs root, refused → it runs as it is). The
    # controller stands for a machine of its own (mccl-paper §3); here it shares 2 cores with the 8 busy ranks, and
    # under load its flag → push path (2 ms of CPU) took 30–100 ms of wall waiting for a core
    controller_nice: int = 0
    # (eleventh session) each rank moves its set-up's heap (torch, gloo, the clients: ~10^6 objects) to the collector's
    # permanent generation before the first collective (gc.collect(); gc.freeze()). Without it a generation-2
    # collection ran in all 8 ranks at once mid-run — 580–690 ms each on 2 cores, the collective it landed in 770 ms
    # instead of ~260 — and the controller's collective clock read that as a slowdown the measured fabric did not
    # explain: the guard kept the first flag and the swap came seconds later (BENCHMARKS.md, eleventh session)
    gc_freeze: bool = True
    timeout_s: float = 300.0

    @classmethod
    def pacer(cls, ranks: int = 4, **knobs: Any) -> DemoConfig:
        """The in-process pacer's defaults: ``ranks`` (4 or 8) on 2 hosts, a 1 MiB AllGather at 1/1000 speed,
        rank 0's NIC transmit side down to 50 of 400 Gbit/s (Fail2), the fast-reacting controller."""
        if ranks not in (4, 8):
            raise MCCLError(f"the pacer demo runs 4 or 8 ranks, not {ranks}")
        base = {"fabric": "pacer", "gpus_per_host": ranks // 2, "kinds": ("allgather",), "ag_bytes": 1 << 20,
                "scale": 1000.0, "fault_factor": 50 / 400, "healthy": 12, "after_swap": 10, "max_degraded": 48,
                "max_recovered": 0, "torch_check_every": 1, "chunks": None, "alpha": 0.5, "gamma": 0.2,
                "warmup": 4, "settle": 4, "timeout_s": 90.0}
        return cls(**{**base, **knobs})

    @property
    def topology_spec(self) -> str:
        return f"rail_optimized(1,{self.hosts},{self.gpus_per_host})"

    @property
    def ranks(self) -> int:
        return self.hosts * self.gpus_per_host

    def check(self) -> None:
        """Refuse what cannot run, naming it."""
        if self.fabric not in FABRICS:
            raise MCCLError(f"the demo's fabric is one of {FABRICS}, not {self.fabric!r}")
        if self.hosts < 2 or self.gpus_per_host < 1 or not 0 <= self.fault_rank < self.ranks:
            raise MCCLError(f"the demo needs ≥ 2 hosts and a fault rank among its {self.ranks} ranks")
        if not 0 < self.fault_factor <= 1:
            raise MCCLError(f"fault_factor is the NIC's remaining fraction, in (0, 1], not {self.fault_factor}")
        if not self.kinds or set(self.kinds) - set(COMMUNICATORS):
            raise MCCLError(f"the demo's streams are some of {tuple(COMMUNICATORS)}, not {self.kinds}")
        if self.swap_priority is not None and not (isinstance(self.swap_priority, int) and 0 <= self.swap_priority <= 39):
            raise MCCLError(f"swap_priority is steps of niceness above the collectives, 0–39 or None, not "
                            f"{self.swap_priority!r}")


def synth_options(chunks: int | None) -> dict:
    """The synthesizers' options of the first schedules and of every re-synthesis."""
    from mccl.schedule import Collective
    from mccl.synth.options import AllToAllOptions, TreePackOptions

    if chunks is None:
        return {}
    return {Collective.ALLGATHER: TreePackOptions(chunks=chunks), Collective.ALLTOALL: AllToAllOptions(chunks=chunks)}


# ---- the controller process -------------------------------------------------------------------
def _controller_main(topology_spec: str, bind: str, control: dict, chunks: int | None, speculate: float | None,
                     secret: str, check_interval_s: float, nice: int = 0, kinds: tuple[str, ...] = (),
                     speculate_band: float | None = None) -> None:
    import logging
    import os

    from mccl.control import ControlConfig, ControllerService, ScheduleManager
    from mccl.control.ahead import warm_synthesis
    from mccl.topology import parse_topology

    logging.basicConfig(level=logging.WARNING)
    if nice:
        try:
            os.nice(nice)
        except OSError as error:  # not root: the controller runs at the ranks' priority
            logging.getLogger("mccl.demo").warning("controller niceness %+d refused (%s)", nice, error)
    topology = parse_topology(topology_spec)
    manager = ScheduleManager(topology, ControlConfig(**control, synth_options=synth_options(chunks)), speculate=speculate,
                              speculate_band=speculate_band)
    if kinds:  # the first synthesis loads the kernels: before telemetry, not on the first fault's check (ahead.py)
        warm_synthesis(topology, list(kinds), synth_options(chunks), adopt=manager.adopt)  # the ranks' schedules
    ControllerService(manager, bind, secret=secret, check_interval_s=check_interval_s).serve_forever()


def _rank_in_fabric(rank: int, world: int, plan: Any, *args: Any) -> dict:
    return rank_main(rank, world, plan, *args)


def _rank_on_loopback(rank: int, world: int, *args: Any) -> dict:
    return rank_main(rank, world, None, *args)


# ---- the driver ---------------------------------------------------------------------------------
def run_demo(config: DemoConfig, *, progress: Callable[[str], None] | None = None,
             on_collective: Callable[[tuple], None] | None = None) -> Any:
    """Run the loop on ``config.fabric`` (module docstring) and return its
    :class:`~mccl.experiments.netemu.report.NetemuReport`. ``on_collective`` sees rank 0's view of each
    collective as it finishes (the live table)."""
    from mccl.schedule import Collective
    from mccl.synth import optimize
    from mccl.topology import parse_topology

    config.check()
    say = progress or (lambda text: None)
    topology = parse_topology(config.topology_spec)
    options = synth_options(config.chunks)
    results = {kind: optimize(topology, kind, options=options.get(Collective(kind))) for kind in config.kinds}
    schedules = {kind: result.schedule.with_meta(version=1) for kind, result in results.items()}
    started, started_at = time.perf_counter(), time.time()
    if config.fabric == "netemu":
        outputs, status, fabric = _run_netemu(config, topology, schedules, say, on_collective)
    else:
        outputs, status, fabric = _run_pacer(config, topology, schedules, say, on_collective)
    predicted = {kind: float(result.schedule.meta.achieved_gbs or 0.0) for kind, result in results.items()}
    report = _report(config, fabric, outputs, status, predicted, time.perf_counter() - started)
    return replace(report, startup_s=report.records[0].start - started_at if report.records else 0.0)


def _run_netemu(config: DemoConfig, topology: Any, schedules: dict, say: Callable[[str], None],
                on_collective: Callable[[tuple], None] | None) -> tuple[list[dict], dict, dict]:
    from mccl.experiments.netemu.fabric import EmulatedFabric, FabricPlan
    from mccl.experiments.netemu.ranks import run_ranks_in_fabric
    from mccl.experiments.netemu.shaping import GOODPUT

    plan = FabricPlan.from_topology(topology, scale=config.scale, nvlink=config.nvlink)
    with EmulatedFabric(plan) as fabric:
        plan = fabric.plan
        say(f"fabric {plan.topology_name} built in {fabric.build_s:.2f} s: {len(plan.ranks)} GPU namespaces, NICs "
            f"{plan.ranks[0].nic_up_mbit:g} Mbit/s, NVLink "
            + (f"{plan.ranks[0].nvlink_mbit:g} Mbit/s" if plan.ranks[0].nvlink_mbit else "unshaped")
            + f" (1/{config.scale:g} of the topology)")
        endpoint = f"tcp://{plan.controller_ip}:{_free_port(plan.controller_ip)}"
        outputs, status = _with_controller(config, endpoint, schedules, say, on_collective,
                                           lambda *args: run_ranks_in_fabric(_rank_in_fabric, plan, *args,
                                                                             timeout_s=config.timeout_s,
                                                                             store_priority=config.swap_priority))
        teardown_s = fabric.teardown()
    return outputs, status, {"nic_mbit": plan.ranks[config.fault_rank].nic_up_mbit, "goodput": GOODPUT,
                             "teardown_s": teardown_s, "prefix": plan.prefix}


def _run_pacer(config: DemoConfig, topology: Any, schedules: dict, say: Callable[[str], None],
               on_collective: Callable[[tuple], None] | None) -> tuple[list[dict], dict, dict]:
    from mccl.runtime.launch import free_port, run_ranks

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    outputs, status = _with_controller(config, endpoint, schedules, say, on_collective,
                                       lambda *args: run_ranks(_rank_on_loopback, config.ranks, *args,
                                                               timeout_s=config.timeout_s))
    gpu = topology.gpus[config.fault_rank]
    nic_gbps = float(topology.capacities_gbps[list(topology.out_links[gpu])].min())
    # the pacer paces payload bytes: its goodput is its rate
    return outputs, status, {"nic_mbit": nic_gbps / config.scale * 1e3, "goodput": 1.0, "teardown_s": 0.0, "prefix": ""}


def _with_controller(config: DemoConfig, endpoint: str, schedules: dict, say: Callable[[str], None],
                     on_collective: Callable[[tuple], None] | None,
                     launch: Callable[..., list[dict]]) -> tuple[list[dict], dict]:
    """Start the controller at ``endpoint``, run the ranks through ``launch``, stop it; (rank outputs, its status)."""
    from mccl.control import ControllerClient
    from mccl.control.auth import new_secret
    from mccl.control.client import wait_for_controller
    from mccl.schedule import dumps_schedule

    control = {"alpha": config.alpha, "gamma": config.gamma, "alpha_level": config.alpha_level,
               "warmup": config.warmup, "settle_collectives": config.settle}
    context = mp.get_context("spawn")
    secret = new_secret().hex  # this run's control-plane secret: the controller and the ranks get it, nobody else
    controller = context.Process(target=_controller_main, args=(config.topology_spec, endpoint, control, config.chunks,
                                                                config.speculate, secret, config.check_interval_s,
                                                                config.controller_nice, config.kinds,
                                                                config.speculate_band),
                                 daemon=True)
    controller.start()
    live = context.Queue()
    stop = threading.Event()
    watcher = threading.Thread(target=_forward, args=(live, stop, on_collective), daemon=True)
    watcher.start()
    admin = None
    try:
        # the controller synthesizes each collective once before it serves (mccl.control.ahead, "Warm
        # synthesizers"): on a cold kernel cache (a fresh clone's first run) that compiles, 30–70 s quiet and over
        # 60 s at load ~10 (ninth session: two runs refused so); its liveness is checked on every probe, so a
        # crashed controller still fails at once
        wait_for_controller(endpoint, secret=secret, timeout_s=240.0, alive=controller.is_alive)
        say(f"controller at {endpoint}; starting {config.ranks} gloo ranks on {config.topology_spec} ({config.fabric})")
        texts = {kind: dumps_schedule(schedule) for kind, schedule in schedules.items()}
        outputs = launch(endpoint, texts, config, live, secret)
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
    return outputs, status


def _forward(live: Any, stop: threading.Event, on_collective: Callable[[tuple], None] | None) -> None:
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


def _report(config: DemoConfig, fabric: dict, outputs: list[dict], status: dict, predicted: dict,
            wall_s: float) -> Any:
    from mccl.experiments.netemu.report import CollectiveRecord, NetemuReport, Swap

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
    swaps = tuple(Swap(kind, *item[:6], received_at=received.get((kind, item[1])))
                  for kind, items in outputs[0]["swaps"].items() for item in items)
    # the reaction path's marks (mccl.experiments.reaction_path): every rank's, and the controller's
    trace = {"received": [output.get("received", []) for output in outputs],
             "swaps": [output["swaps"] for output in outputs],
             "switches": [output.get("switches", {}) for output in outputs],
             "candidates": [output.get("candidates", []) for output in outputs],
             "take_cpu": [output.get("take_cpu", []) for output in outputs],
             "prestage_hits": [output.get("prestage_hits", {}) for output in outputs],
             "holds": [output.get("holds", {}) for output in outputs],
             "candidates_pushed": status.get("candidates", []),
             "reactions": status.get("reactions", []), "deliveries": status.get("deliveries", [])}
    return NetemuReport(config=asdict(config), records=tuple(records), events=tuple(status["events"]),
                        degraded_at=marks.get("degraded_at", 0.0), restored_at=marks.get("restored_at"),
                        tc_s=(marks.get("tc_s", 0.0), marks.get("tc_restore_s", 0.0)), swaps=swaps,
                        predicted_v1=predicted, scale=config.scale, goodput=fabric["goodput"],
                        nic_mbit=fabric["nic_mbit"], wall_s=wall_s, teardown_s=fabric["teardown_s"],
                        controller_stats={**status["stats"], "telemetry_dropped": sum(o["dropped"] for o in outputs)},
                        communicators={kind: COMMUNICATORS[kind] for kind in config.kinds},
                        telemetry={rank: output["samples"] for rank, output in enumerate(outputs)},
                        prefix=fabric["prefix"], trace=trace)
