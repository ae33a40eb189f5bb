"""TS live (MCCS §3.3, issue 16): two tenants' jobs on gloo, the controller service between them.

Job ``a`` (priority 1) trains: one AllGather per iteration, then "compute" (a sleep) until
the next iteration's start, every ``period_s``. Job ``b`` (priority 0, time-shared) runs
AllGathers back to back, competing with ``a``. Both are mccl communicators (2 ranks each,
gloo on loopback) with the controller's client as schedule source and telemetry sink; the
controller is the real :class:`~mccl.control.service.ControllerService` (ZeroMQ, CURVE
authenticated) running a :class:`~mccl.control.tenancy.live.TenancyManager` in this process.

What happens: ``a``'s ranks report telemetry as always; the controller learns ``a``'s busy
intervals, computes its idle windows, gives ``b`` a new plan version and serves the windows
under it (``windows`` message); ``b``'s ranks fetch the schedule (poll), switch by the
(min version, max seq) agreement, and their send gates (:func:`mccl.runtime.sendgate.attach`)
hold every send outside the windows from that collective on.

Every rank logs its sends (the wall-clock time each send was posted, and the collective's
sequence number), from a wrapper around its transport's ``post`` outside the gate, and checks
every result exactly. The policy can be switched during the run (:func:`run_ts_live`'s
``phases``: PFA without TS, then PFA+TS, ...), so ``a``'s collective time with and without TS
is measured in one run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mccl.control import ControllerService
from mccl.control.tenancy import JobProfile, TenancyController, TenantJob
from mccl.control.tenancy.live import TenancyManager, windows_field, windows_of
from mccl.runtime.launch import run_ranks
from mccl.schedule import Collective
from mccl.telemetry import SendWindows
from mccl.topology import spine_leaf

__all__ = ["TsLiveSpec", "TsLiveResult", "run_ts_live", "sends_outside", "a_times_by_phase"]

PLACEMENT = {"a": ("gpu0", "gpu4"), "b": ("gpu1", "gpu5")}  # each job across the two racks of the MCCS testbed


@dataclass(frozen=True)
class TsLiveSpec:
    """``a``: one AllGather of ``a_bytes`` per rank every ``period_s``, ``iterations`` times; ``b``: AllGathers
    of ``b_bytes`` per rank back to back until ``a`` ends. ``phases``: (policy, seconds) switched in order
    by the controller while the jobs run (the last one lasts until the end)."""

    period_s: float = 0.3
    iterations: int = 30
    a_bytes: int = 1 << 20
    b_bytes: int = 1 << 20
    guard_s: float = 0.02
    phases: tuple[tuple[str, float], ...] = (("pfa+ts", 0.0),)
    timeout_s: float = 240.0


@dataclass
class TsLiveResult:
    a: list[dict] = field(default_factory=list)  # per rank: {"times": [(start, seconds)], "exact": bool}
    b: list[dict] = field(default_factory=list)  # per rank: sends, windows by seq, exact, gate counters
    phases: list[tuple[str, float]] = field(default_factory=list)  # (policy, wall-clock start)
    replans: int = 0
    busy_intervals: int = 0
    busy: list[tuple[float, float]] = field(default_factory=list)  # a's last busy intervals the controller kept


def _topology():
    return spine_leaf(2, 2, 2, 2, 100, 50)  # MCCS §5's 2:1 spine-leaf


def _rank(rank: int, world: int, endpoint: str, secret: str, texts: dict[str, str], spec: TsLiveSpec) -> dict:
    import torch
    import torch.distributed as dist

    from mccl.control import ControllerClient
    from mccl.control.tenancy.live import windows_fetcher
    from mccl.runtime import init, torch_private
    from mccl.runtime.sendgate import attach
    from mccl.schedule import loads_schedule

    groups = {"a": dist.new_group([0, 1]), "b": dist.new_group([2, 3])}
    job = "a" if rank < 2 else "b"
    local = rank % 2
    store = torch_private.default_store()
    schedule = loads_schedule(texts[job])
    client = ControllerClient(endpoint, job, local, installed=[schedule], secret=secret)
    comm = init(groups[job], controller=client, sink=client, topology=_topology(), schedules=[schedule], name=job)
    nbytes = (spec.a_bytes if job == "a" else spec.b_bytes) or 4  # b_bytes 0: b idles (a alone, a reference)
    source = torch.full((nbytes // 4,), local + 1, dtype=torch.int32)
    output = torch.empty(2 * source.numel(), dtype=torch.int32)
    expected = torch.arange(1, 3, dtype=torch.int32).repeat_interleave(source.numel())
    exact = True
    sends: list[tuple[float, float, int]] = []
    post = comm.transport.post

    def logged(op):  # the send log: the send was posted between these two times (any hold of the gate inside)
        entered = time.time()
        work = post(op)
        if op.is_send:
            sends.append((entered, time.time(), comm.seq))
        return work

    comm.transport.post = logged
    out: dict = {"job": job}
    try:
        if job == "a":
            comm.all_gather_into_tensor(output, source)  # warm-up, and both ranks start together
            times = []
            start = time.time()
            for i in range(spec.iterations):
                delay = start + i * spec.period_s - time.time()
                if delay > 0:
                    time.sleep(delay)
                t0 = time.time()
                comm.all_gather_into_tensor(output, source)
                times.append((t0, time.time() - t0))
                exact &= bool(torch.equal(output, expected))
            store.set("ts-live/a-done", b"1")
            out["times"] = times
        else:
            gate, feed = attach(comm, windows_fetcher(client))
            calls = 0
            while not store.check(["ts-live/a-done"]):
                if not spec.b_bytes:
                    time.sleep(0.05)
                    continue
                comm.all_gather_into_tensor(output, source)
                exact &= bool(torch.equal(output, expected))
                calls += 1
            feed.stop()
            seqs = sorted({seq for _, _, seq in sends})
            gated_seqs = set(seqs)
            # what the gate enforced per collective (the check's reference), and what its version's windows
            # turned out to be (they differ only where they reached the gate after the collective ran)
            out.update(sends=sends, calls=calls, held=gate.held, held_sends=gate.held_sends, waited_s=gate.waited_s,
                       windows={seq: windows_field(gate.enforced.get(seq)) for seq in seqs},
                       version_windows={seq: windows_field(gate.windows_for(seq)) for seq in seqs},
                       fetch_failures=gate.fetch_failures,
                       version_of={seq: version for seq, _, version in comm.history if seq in gated_seqs},
                       versions=sorted({v for _, _, v in comm.history if v is not None}))
        out["exact"] = exact
        out["swaps"] = len(comm.swaps)
        # every rank leaves together: rank 0 (of a) hosts the store b's ranks are still reading
        store.set(f"ts-live/left/{rank}", b"1")
        store.wait([f"ts-live/left/{r}" for r in range(world)])
        return out
    finally:
        comm.close()
        client.close()


def sends_outside(sends: list[tuple[float, float, int]], windows: dict[int, list | None]) -> tuple[int, int]:
    """(gated sends, those posted outside their collective's windows): a send logged as posted between
    ``entered`` and ``returned`` is outside when no instant of that interval was inside a window — then
    it was certainly posted outside; robust to the logging thread being descheduled on a loaded machine,
    where a fixed tolerance on one timestamp is not."""
    gated = outside = 0
    parsed: dict[int, SendWindows | None] = {seq: windows_of(field) for seq, field in windows.items()}
    for entered, returned, seq in sends:
        gate = parsed.get(seq)
        if gate is None:
            continue
        gated += 1
        if not (gate.is_open(entered) or gate.next_open(entered) <= returned):
            outside += 1
    return gated, outside


def run_ts_live(spec: TsLiveSpec = TsLiveSpec()) -> TsLiveResult:
    """The two jobs on 4 spawned gloo ranks and the controller service here (module docstring)."""
    tenancy = TenancyController(_topology(), spec.phases[0][0], time_shared=("b",), guard_s=spec.guard_s)
    for name, priority, size in (("a", 1, spec.a_bytes), ("b", 0, spec.b_bytes)):
        tenancy.register(TenantJob(name, PLACEMENT[name], JobProfile(Collective.ALLGATHER, 2 * max(size, 4)), priority))
    manager = TenancyManager(tenancy)
    service = ControllerService(manager, "tcp://127.0.0.1:*", check_interval_s=0.02).start()
    result = TsLiveResult()
    try:
        texts = {name: manager.latest(name, Collective.ALLGATHER)[1] for name in PLACEMENT}
        import threading

        done = threading.Event()

        def switch() -> None:  # phases timed from a's first collective the controller saw
            while manager.busy_intervals == 0 and not done.wait(0.05):
                pass
            for policy, seconds in spec.phases:
                manager.set_policy(policy)
                result.phases.append((policy, time.time()))
                if done.wait(seconds) or seconds <= 0:
                    break

        switcher = threading.Thread(target=switch, daemon=True)
        switcher.start()
        values = run_ranks(_rank, 4, service.address, service.secret.hex, texts, spec, timeout_s=spec.timeout_s)
        done.set()
        switcher.join(timeout=5)
        result.a = [v for v in values if v["job"] == "a"]
        result.b = [v for v in values if v["job"] == "b"]
        result.replans, result.busy_intervals = manager.replans, manager.busy_intervals
        result.busy = list(tenancy.busy.get("a", []))
        return result
    finally:
        service.stop()


def a_times_by_phase(result: TsLiveResult, *, settle_s: float = 0.5) -> dict[str, list[float]]:
    """``a``'s collective times (s) by the policy in force when each started, per iteration the slower
    of its two ranks (the collective ends when both have their data); the first ``settle_s`` after each
    switch is left out (``b``'s ranks take the new plan at their next agreement)."""
    by_policy: dict[str, list[float]] = {}
    ranks = [rank["times"] for rank in result.a]
    for iteration in zip(*ranks, strict=True):
        start = min(at for at, _ in iteration)
        seconds = max(took for _, took in iteration)
        current = [(policy, at) for policy, at in result.phases if at <= start]
        if not current or start - current[-1][1] < settle_s:
            continue
        by_policy.setdefault(current[-1][0], []).append(seconds)
    return by_policy
