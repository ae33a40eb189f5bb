"""Hot swap, fail-static and telemetry on real gloo groups (one spawn of 4 ranks for all swap cases).

A controller here is a real process serving schedule files over a socket; it kills
itself mid-run, as a crashed controller would.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import warnings
from dataclasses import replace
from multiprocessing.connection import Client, Listener

import pytest

from mccl.runtime.launch import run_ranks
from mccl.schedule import Transfers, dumps_schedule, loads_schedule
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import naive_ring, nccl_ring
from mccl.topology import single_switch

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]  # gloo ranks in processes of their own

N = 4


def _wait_for(predicate, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class SocketSource:
    """A ScheduleSource talking to the test controller process (the ZeroMQ client's stand-in)."""

    def __init__(self, address):
        self.address = address
        self.connection = None

    def poll(self):
        from mccl.errors import ControllerError

        try:
            if self.connection is None:
                self.connection = Client(self.address)
            if not self.connection.poll(0):
                return None
            return loads_schedule(self.connection.recv())
        except (OSError, EOFError) as error:
            raise ControllerError(f"controller at {self.address} unreachable: {type(error).__name__} {error}") from error


def _controller(address, payload, clients):
    """Send one schedule to every client, then die without goodbye (SIGKILL) a little later."""
    with Listener(address) as listener:
        connections = [listener.accept() for _ in range(clients)]
        for connection in connections:
            connection.send(payload)
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)


def _check_ag(comm, rank, n, salt):
    import torch
    import torch.distributed as dist

    x = (torch.arange(17, dtype=torch.float32) + 31 * rank + salt) % 101
    out, ref = torch.empty(n * 17), torch.empty(n * 17)
    comm.all_gather_into_tensor(out, x)
    dist.all_gather_into_tensor(ref, x)
    return torch.equal(out, ref)


def _hotswap(rank, n, controller_address):
    import torch
    import torch.distributed as dist

    import mccl
    from mccl.runtime import LocalScheduleSource, MemorySink, TelemetryConfig

    warnings.filterwarnings("ignore", category=FutureWarning)
    topology = single_switch(n, 100)
    old = naive_ring(topology, "allgather")
    new = nccl_ring(topology, "allgather", chunks=2).with_meta(version=1)
    report = {}

    # 1. a stream of collectives; the swap is requested at a different point on every rank
    comm = mccl.init(topology=topology, schedules=[old, direct_alltoall(topology)])
    exact = True
    for i in range(30):
        if i == 4 + 3 * rank:
            comm.stage(new)
        exact &= _check_ag(comm, rank, n, i)
    _wait_for(lambda: comm.swaps)
    for i in range(3):
        exact &= _check_ag(comm, rank, n, 100 + i)
    record = comm.swaps[0]
    report["stream"] = (exact, record.switch_after, record.adopted, list(comm.history), record.oob_s, record.total_s,
                        list(comm.switches), record.started_at)
    # swaps back to back, chunk counts changing each time, collectives flowing throughout
    for version in range(2, 6):  # odd versions as schedule-file text: the swap thread parses them
        staged = naive_ring(topology, "allgather", chunks=version).with_meta(version=version)
        comm.stage(dumps_schedule(staged) if version % 2 else staged)
        for i in range(6):
            exact &= _check_ag(comm, rank, n, 10 * version + i)
    _wait_for(lambda: len(comm.swaps) == 5)
    exact &= _check_ag(comm, rank, n, 1)
    report["repeated"] = (exact, comm.versions(), [r.switch_after for r in comm.swaps])
    comm.close()

    # 2. two communicators swap independently (each on its own long-lived transport group)
    group_a, group_b = dist.new_group(list(range(n))), dist.new_group(list(range(n)))
    comm_a = mccl.init(group_a, topology=topology, schedules=[old])
    comm_b = mccl.init(group_b, topology=topology, schedules=[old])
    exact = True
    for i in range(12):
        if i == 2 + rank:
            comm_a.stage(new)
        if i == 8:
            comm_b.stage(naive_ring(topology, "allgather", chunks=3).with_meta(version=5))
        exact &= _check_ag(comm_a, rank, n, i) and _check_ag(comm_b, rank, n, -i)
    _wait_for(lambda: comm_a.swaps and comm_b.swaps)
    exact &= _check_ag(comm_a, rank, n, 7) and _check_ag(comm_b, rank, n, 8)
    report["two"] = (exact, comm_a.versions(), comm_b.versions(), comm_a.swaps[0].switch_after,
                     comm_b.swaps[0].switch_after)
    comm_a.close()
    comm_b.close()

    # 3. one rank's staged schedule is invalid: rejected there, nobody adopts it
    comm = mccl.init(topology=topology, schedules=[old])
    broken = new.with_meta(version=2)
    if rank == 1:  # drop the last transfer: some rank never receives a chunk, the validator says which
        t = broken.transfers
        keep = len(t) - 1
        broken = replace(broken, transfers=Transfers(t.chunk[:keep], t.sender[:keep], t.receiver[:keep],
                                                     t.step[:keep], t.op[:keep], t.route_offsets[:keep + 1],
                                                     t.route_links[:t.route_offsets[keep]]))
    exact = _check_ag(comm, rank, n, 0)
    comm.stage(broken)
    _wait_for(lambda: comm.swaps)
    exact &= _check_ag(comm, rank, n, 1) and _check_ag(comm, rank, n, 2)
    report["invalid"] = (exact, comm.versions(), comm.swaps[0].rejected, list(comm.events))
    comm.close()

    # 4. the controller delivers a schedule, then dies: the executor keeps the last schedule
    source = SocketSource(controller_address)
    sink = MemorySink()
    comm = mccl.init(controller=source, topology=topology, schedules=[old], sink=sink,
                     telemetry=TelemetryConfig(threshold_inter=1, threshold_intra=1))
    exact = True
    _wait_for(lambda: comm.swaps or len(comm.history) > 400, 20)
    for i in range(10):
        exact &= _check_ag(comm, rank, n, i)
    _wait_for(lambda: comm.controller_lost, 20)
    for i in range(10):
        exact &= _check_ag(comm, rank, n, 50 + i)
    comm.flush_telemetry()
    samples = sink.samples
    report["controller"] = (exact, comm.versions(), comm.controller_lost, list(comm.events),
                            len(samples), {s.peer for s in samples}, comm.telemetry_dropped)
    comm.close()

    # 6. candidates (a synthesis ahead of the flag): prepared, never adopted; a version of the same content is
    # then staged from the prepared plan, one of other content as before
    from mccl.control.client import Candidate

    comm = mccl.init(topology=topology, schedules=[old])
    first, other = (naive_ring(topology, "allgather", chunks=c).with_meta(version=7) for c in (3, 4))
    comm.stage(Candidate(first, 7))
    _wait_for(lambda: comm.prestages)
    exact = _check_ag(comm, rank, n, 0)
    before = comm.versions()
    comm.stage(other.with_meta(version=2))  # not the candidate's content: staged the usual way
    _wait_for(lambda: len(comm.swaps) == 1)
    hits_other = comm.prestage_hits
    comm.stage(first.with_meta(version=3))  # the candidate's content under the issued version
    _wait_for(lambda: len(comm.swaps) == 2)
    for i in range(3):
        exact &= _check_ag(comm, rank, n, 200 + i)
    report["candidate"] = (exact, before, hits_other, comm.prestage_hits, comm.versions(),
                           [dict(s.adopted) for s in comm.swaps], len(comm.prestages))
    comm.close()

    # 7. the hold (mccl.runtime.hotswap, "The hold"): rank N-1 is asked 0.4 s after the others. Held (2 s at most),
    # the others wait at their next launch and the very next collective runs the new version everywhere; with a
    # 0.05 s hold they launch it on the old one after 0.05 s (once: the hold is per round) and K moves one later
    held = {}
    for version, hold_s in ((1, 2.0), (2, 0.05)):
        comm = mccl.init(topology=topology, schedules=[old])
        comm.swap_hold_s = hold_s
        exact = _check_ag(comm, rank, n, 0) and _check_ag(comm, rank, n, 1)
        asked_at = comm.seq
        if rank == n - 1:
            time.sleep(0.4)
        comm.stage(new.with_meta(version=version))
        time.sleep(0.1)  # the swap thread has taken it: the round is open
        for i in range(3):
            exact &= _check_ag(comm, rank, n, 300 + i)
        _wait_for(lambda comm=comm: comm.swaps)
        held[hold_s] = (exact, asked_at, comm.swaps[0].switch_after, [h[2] for h in comm.holds], comm.versions())
        comm.close()
    report["hold"] = held

    # 5. a local source closed (operator detached the controller) is also fail-static
    local = LocalScheduleSource()
    comm = mccl.init(controller=local, topology=topology, schedules=[old])
    local.close()
    _wait_for(lambda: comm.controller_lost, 10)
    report["closed"] = (comm.controller_lost, _check_ag(comm, rank, n, 3))
    comm.close()
    torch.distributed.barrier()
    return report


@pytest.fixture(scope="module")
def reports():
    address = ("127.0.0.1", _free_port())
    payload = dumps_schedule(nccl_ring(single_switch(N, 100), "allgather", chunks=2).with_meta(version=3))
    controller = mp.get_context("spawn").Process(target=_controller, args=(address, payload, N), daemon=True)
    controller.start()
    try:
        yield run_ranks(_hotswap, N, address, timeout_s=150)
    finally:
        controller.join(timeout=5)
        if controller.is_alive():
            controller.kill()


def _free_port():
    from mccl.runtime.launch import free_port

    return free_port()


def test_swap_mid_stream_switches_at_one_point_on_every_rank(reports):
    points = {report["stream"][1] for report in reports}
    assert len(points) == 1
    switch_after = points.pop()
    for report in reports:
        exact, _k, adopted, history, oob_s, total_s, switches, started_at = report["stream"]
        assert exact
        assert adopted == (("allgather", 1),)
        versions = [version for seq, _kind, version in history]
        assert versions == [0 if seq <= switch_after else 1 for seq, _kind, _v in history]
        assert [seq for seq, _kind, _v in history] == list(range(1, len(history) + 1))  # none dropped or duplicated
        assert 0 < oob_s <= total_s
        # the reaction path's last mark: the first launch on the adopted version, after the round began
        assert switches[0][0] == switch_after + 1 and switches[0][2] == {"allgather": 1}
        assert 0 < started_at < switches[0][1]
    assert switch_after >= 4 + 3 * (N - 1)  # not before the last rank was asked


def test_repeated_swaps_stay_exact(reports):
    assert len({tuple(report["repeated"][2]) for report in reports}) == 1
    for report in reports:
        exact, versions, _points = report["repeated"]
        assert exact and versions["allgather"] == 5


def test_two_communicators_swap_independently(reports):
    for report in reports:
        exact, versions_a, versions_b, _ka, _kb = report["two"]
        assert exact and versions_a == {"allgather": 1} and versions_b == {"allgather": 5}
    assert len({report["two"][3] for report in reports}) == 1
    assert len({report["two"][4] for report in reports}) == 1


def test_invalid_staged_schedule_is_rejected_and_old_one_stays(reports):
    for rank, report in enumerate(reports):
        exact, versions, rejected, events = report["invalid"]
        assert exact and versions == {"allgather": 0}
        if rank == 1:
            assert rejected and "never receives" in rejected and any("rejected" in event for event in events)
        else:
            assert rejected is None


def test_controller_killed_mid_run_is_fail_static(reports):
    for report in reports:
        exact, versions, lost, events, n_samples, peers, dropped = report["controller"]
        assert exact and lost
        assert versions == {"allgather": 3}  # what the controller sent before it died
        assert sum("controller lost" in event for event in events) == 1
        assert n_samples > 0 and peers and dropped == 0
        assert report["closed"] == (True, True)


def test_a_candidate_is_prepared_not_adopted_and_its_content_is_staged_from_the_plan(reports):
    for exact, before, hits_other, hits, versions, adopted, prestages in (r["candidate"] for r in reports):
        assert exact
        assert before == {"allgather": 0}  # the candidate was not adopted
        assert hits_other == 0 and hits == 1 and prestages == 1
        assert versions == {"allgather": 3} and adopted == [{"allgather": 2}, {"allgather": 3}]


def test_a_held_launch_waits_for_the_round_so_the_next_collective_runs_the_new_version(reports):
    """The hold moves when collectives launch, never which schedule runs one: K is agreed from what was launched."""
    for rank, report in enumerate(reports):
        long_hold, short_hold = report["hold"][2.0], report["hold"][0.05]
        exact, asked_at, switch_after, holds, versions = long_hold
        assert exact and versions == {"allgather": 1}
        assert switch_after == asked_at  # the collective after the request ran the new version on every rank
        if rank < N - 1:  # held until the late rank's round got there (~0.3 s), once
            assert len(holds) == 1 and 0.15 < holds[0] < 2.0
        exact, asked_at, switch_after, holds, versions = short_hold
        assert exact and versions == {"allgather": 2}
        assert switch_after == asked_at + 1  # the 0.05 s hold ran out: one more collective on the old version
        if rank < N - 1:
            assert len(holds) == 1 and 0.04 < holds[0] < 0.3
