"""Collective times from the live runtime (issue 15): each rank reports each collective it ran on a
schedule as a ``"collective"`` sample, through the telemetry path, to the controller's clock.

The fast tests check the wire (a collective sample round-trips with its schedule tags; a malformed one
is refused with an error naming the field) and the size a rank reports (nccl-tests S); the
multiprocess test runs 2 gloo ranks reporting to a real service on loopback, whose manager's
``CollectiveClock`` must hold the schedule version's observed times and the job's size.
"""

from __future__ import annotations

import json
import time

import pytest

from mccl.control import ControlConfig, ControllerService, ScheduleManager
from mccl.control.protocol import decode, encode, samples_of, telemetry_message
from mccl.errors import ControllerError
from mccl.runtime.launch import run_ranks
from mccl.schedule import Collective
from mccl.telemetry import COLLECTIVE, INTER, Sample
from mccl.topology import single_switch

pytestmark = pytest.mark.timeout(60)

CLOCKED = Sample(COLLECTIVE, "job", 2, -1, 4096, 0.0125, 1.7e9, 9, "allgather", 3)


def test_a_collective_sample_round_trips_the_wire_with_its_schedule_tags():
    path = Sample(INTER, "job", 1, 2, 512, 0.001, 1.7e9, 9)
    message = json.loads(telemetry_message([path, CLOCKED]))
    assert len(message["samples"][0]) == 8 and len(message["samples"][1]) == 10  # untagged rows stay 8 fields
    assert samples_of(decode(telemetry_message([path, CLOCKED]))) == [path, CLOCKED]


GOOD_ROW = [COLLECTIVE, "job", 2, -1, 4096, 0.0125, 1.7e9, 9, "allgather", 3]


@pytest.mark.parametrize(("row", "phrase"), [
    ([*GOOD_ROW[:3], 1, *GOOD_ROW[4:]], "peer must be -1, got 1"),
    ([*GOOD_ROW[:4], 0, *GOOD_ROW[5:]], "bytes (the collective's size S) must be positive"),
    ([*GOOD_ROW[:5], 0.0, *GOOD_ROW[6:]], "seconds must be a number"),
    ([*GOOD_ROW[:8], 7, 3], "collective must be a string"),
    ([*GOOD_ROW[:9], -2], "version must be an integer in -1"),
    ([*GOOD_ROW[:9], True], "version must be an integer"),
    (GOOD_ROW[:9], "a list of 8 fields"),
    (["collectives", *GOOD_ROW[1:]], "kind must be 'inter', 'intra' or 'collective'"),
])
def test_a_malformed_collective_sample_is_named(row, phrase):
    samples_of(decode(encode("telemetry", samples=[GOOD_ROW])))  # the good row passes
    with pytest.raises(ControllerError, match="telemetry row") as error:
        samples_of(json.loads(encode("telemetry", samples=[row])))
    assert phrase in str(error.value)


def test_the_size_a_rank_reports_is_nccl_tests_s():
    import torch

    from mccl.runtime.buffers import all_gather_buffers, all_to_all_buffers
    from mccl.runtime.communicator import collective_size_bytes
    from mccl.runtime.plan import build_plan
    from mccl.synth.direct import direct_alltoall
    from mccl.synth.ring import naive_ring

    topology = single_switch(4, 100)
    gather = build_plan(naive_ring(topology, "allgather"), 1)
    mine = torch.zeros(6, dtype=torch.float64)
    assert collective_size_bytes(all_gather_buffers(gather, torch.zeros(24, dtype=torch.float64), mine)) == 24 * 8
    exchange = build_plan(direct_alltoall(topology), 1)
    send = torch.zeros(20, dtype=torch.int32)  # the send buffer, self block included (DESIGN.md, "Units")
    assert collective_size_bytes(all_to_all_buffers(exchange, torch.zeros(20, dtype=torch.int32), send,
                                                    None, None)) == 20 * 4
    uneven = all_to_all_buffers(exchange, torch.zeros(12, dtype=torch.int32), send, [1, 5, 2, 4], [5, 5, 5, 5])
    assert collective_size_bytes(uneven) == 20 * 4


# ---- two real ranks (2, not 4: each spawned rank imports torch, the test's main cost) ------------------------------------------------------------------------

VERSION = 3
ELEMENTS = 1 << 12  # per rank, float32: S = n ranks × 16 KiB
RANKS = 2


def _schedule():
    from mccl.synth.ring import naive_ring

    return naive_ring(single_switch(RANKS, 100), "allgather").with_meta(version=VERSION)


def _rank(rank, n, address, secret_hex, collectives):
    import torch

    import mccl
    from mccl.control import ControllerClient
    from mccl.runtime import TelemetryConfig

    client = ControllerClient(address, "clocked", rank, secret=secret_hex, timeout_s=30.0)
    comm = mccl.init(topology=single_switch(n, 100), schedules=[_schedule()], sink=client, name="clocked",
                     hot_swap=False, telemetry=TelemetryConfig(flush_interval_s=0.02))
    try:
        x = torch.full((ELEMENTS,), float(rank))
        out = torch.empty(n * ELEMENTS)
        for _ in range(collectives):
            comm.all_gather_into_tensor(out, x)
        assert torch.equal(out, torch.arange(n, dtype=torch.float32).repeat_interleave(ELEMENTS))
        comm.flush_telemetry()
        return comm.telemetry_dropped
    finally:
        comm.close()
        client.close()


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_controllers_clock_receives_every_ranks_collective_times():
    n, config = RANKS, ControlConfig()
    manager = ScheduleManager(single_switch(n, 100), config)
    manager.register("clocked", _schedule())
    service = ControllerService(manager, "tcp://127.0.0.1:*", check_interval_s=0.05).start()
    try:
        collectives = config.settle_collectives + config.warmup + 4
        assert run_ranks(_rank, n, service.address, service.secret.hex, collectives, timeout_s=200) == [0] * n
        clock = manager._comms["clocked"].clock
        deadline = time.monotonic() + 20
        while clock.observed(Collective.ALLGATHER, VERSION) is None:  # the last batches may still be in flight
            assert time.monotonic() < deadline, "the controller's clock got no collective times"
            time.sleep(0.02)
        reference, now = clock.observed(Collective.ALLGATHER, VERSION)
        assert 0 < reference < 10 and 0 < now < 10
        assert clock.size(Collective.ALLGATHER) == n * ELEMENTS * 4  # the size S the ranks reported
        assert manager.guard.size(None, manager._comms["clocked"].meter, Collective.ALLGATHER, _schedule(),
                                  clock) == (n * ELEMENTS * 4, "reported")
        assert clock.observed(Collective.ALLGATHER, VERSION + 1) is None  # tagged by version, not untagged
    finally:
        service.stop()
