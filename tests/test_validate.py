"""The validator: one hand-made broken schedule per rule, and properties on random fabrics."""

import contextlib
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import small_topologies
from mccl.errors import Infeasible, InvalidSchedule, TopologyError
from mccl.schedule import Chunks, Collective, Schedule, TransferList, TransferOp, Transfers, validate
from mccl.synth import allgather_cut_bound
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import naive_ring, nccl_ring
from mccl.topology import Router, single_switch


@pytest.fixture(scope="module")
def four():
    return single_switch(4, 100)


def _transfers(schedule, **columns):
    t = schedule.transfers
    data = {name: getattr(t, name).copy() for name in ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links")}
    data.update(columns)
    return replace(schedule, transfers=Transfers(**data))


def _without(schedule, index):
    """The schedule with transfer ``index`` removed."""
    t = schedule.transfers
    keep = np.arange(len(t)) != index
    lengths = t.route_lengths[keep]
    kept_links = np.concatenate([t.route_links[t.route_offsets[i]:t.route_offsets[i + 1]] for i in np.flatnonzero(keep)])
    return replace(schedule, transfers=Transfers(t.chunk[keep], t.sender[keep], t.receiver[keep], t.step[keep],
                                                 t.op[keep], np.concatenate([[0], np.cumsum(lengths)]), kept_links))


def _ring_allgather(four):
    return naive_ring(four, Collective.ALLGATHER)


def test_valid_schedules_pass(four):
    for collective in ("allgather", "reducescatter", "allreduce"):
        validate(naive_ring(four, collective), four)
    validate(direct_alltoall(four), four)


def test_rank_on_missing_gpu(four):
    schedule = _ring_allgather(four)
    with pytest.raises(InvalidSchedule, match="rank 3 is placed on 'gpu9'"):
        validate(replace(schedule, ranks=("gpu0", "gpu1", "gpu2", "gpu9")), four)
    with pytest.raises(InvalidSchedule, match="a switch, not a GPU"):
        validate(replace(schedule, ranks=("gpu0", "gpu1", "gpu2", "sw0")), four)
    with pytest.raises(InvalidSchedule, match="ranks 0 and 3 are both placed on 'gpu0'"):
        validate(replace(schedule, ranks=("gpu0", "gpu1", "gpu2", "gpu0")), four)


def test_chunk_fractions_must_cover_the_block(four):
    schedule = _ring_allgather(four)
    fraction = schedule.chunks.fraction.copy()
    fraction[2] = 0.5
    with pytest.raises(InvalidSchedule, match="chunks of block 2 cover 0.5 of it"):
        validate(replace(schedule, chunks=replace(schedule.chunks, fraction=fraction)), four)
    fraction[2] = -1
    with pytest.raises(InvalidSchedule, match="chunk 2 has fraction -1"):
        validate(replace(schedule, chunks=replace(schedule.chunks, fraction=fraction)), four)


def test_transfer_fields(four):
    schedule = _ring_allgather(four)
    with pytest.raises(InvalidSchedule, match="names a chunk that does not exist"):
        validate(_transfers(schedule, chunk=np.where(np.arange(len(schedule.transfers)) == 0, 99, schedule.transfers.chunk)), four)
    receiver = schedule.transfers.receiver.copy()
    receiver[0] = schedule.transfers.sender[0]
    with pytest.raises(InvalidSchedule, match="sends to its own rank"):
        validate(_transfers(schedule, receiver=receiver), four)
    op = schedule.transfers.op.copy()
    op[0] = TransferOp.REDUCE
    with pytest.raises(InvalidSchedule, match="is a reduce, which a allgather does not do"):
        validate(_transfers(schedule, op=op), four)


def test_route_with_missing_link(four):
    schedule = _ring_allgather(four)
    links = schedule.transfers.route_links.copy()
    links[0] = 999
    with pytest.raises(InvalidSchedule, match="uses link 999, which topology"):
        validate(_transfers(schedule, route_links=links), four)


def test_route_from_wrong_gpu_and_broken_route(four):
    schedule = _ring_allgather(four)
    links = schedule.transfers.route_links.copy()
    links[0] = four.link_between("gpu3", "sw0").id  # transfer 0 is gpu0 -> gpu1
    with pytest.raises(InvalidSchedule, match="does not start at the sender's GPU gpu0"):
        validate(_transfers(schedule, route_links=links), four)
    links = schedule.transfers.route_links.copy()
    links[1] = four.link_between("sw0", "gpu2").id
    with pytest.raises(InvalidSchedule, match="does not end at the receiver's GPU gpu1"):
        validate(_transfers(schedule, route_links=links), four)


def test_route_must_be_contiguous_and_switch_only():
    fabric = single_switch(3, 100)
    chunks = Chunks([0, 1, 2], [-1, -1, -1], [1, 1, 1])
    up, down = fabric.link_between("gpu0", "sw0").id, fabric.link_between("sw0", "gpu2").id
    into_gpu1, out_of_gpu1 = fabric.link_between("sw0", "gpu1").id, fabric.link_between("gpu1", "sw0").id
    broken = TransferList()
    broken.add(0, 0, 2, 0, [up, into_gpu1, down])  # ends at gpu1, then a link that starts at sw0
    with pytest.raises(InvalidSchedule, match="is not contiguous"):
        validate(Schedule(Collective.ALLGATHER, fabric.gpus, chunks, broken.freeze()), fabric)
    through_gpu = TransferList()
    through_gpu.add(0, 0, 2, 0, [up, into_gpu1, out_of_gpu1, down])
    with pytest.raises(InvalidSchedule, match="passes through GPU gpu1"):
        validate(Schedule(Collective.ALLGATHER, fabric.gpus, chunks, through_gpu.freeze()), fabric)


def _with_route(schedule, index, route):
    """The schedule with transfer ``index`` taking ``route`` (link ids) instead of its own."""
    t = schedule.transfers
    rebuilt = TransferList()
    for i in range(len(t)):
        rebuilt.add(int(t.chunk[i]), int(t.sender[i]), int(t.receiver[i]), int(t.step[i]),
                    route if i == index else list(t.route(i)), TransferOp(int(t.op[i])))
    return replace(schedule, transfers=rebuilt.freeze())


def test_route_that_visits_a_node_twice_is_refused():
    from mccl.topology import rail_optimized

    fabric = rail_optimized(1, 2, 2)  # gpu0, gpu1 on host 0; gpu2, gpu3 on host 1; rails tor0.0, tor0.1
    schedule = naive_ring(fabric, Collective.ALLGATHER)
    validate(schedule, fabric)
    t = schedule.transfers
    index = next(i for i in range(len(t)) if (int(t.sender[i]), int(t.receiver[i])) == (1, 2))

    def route(*nodes):
        return [fabric.link_between(a, b).id for a, b in zip(nodes, nodes[1:], strict=False)]

    # gpu1 -> gpu2 over the aggregation layer, bouncing back into tor0.0 once more (u -> v -> u)
    looping = route("gpu1", "tor0.1", "agg0", "tor0.0", "agg1", "tor0.0", "gpu2")
    message = r"transfer \d+ \(chunk \d+ .*rank 1 -> rank 2.* visits tor0.0 twice; a route must be a path"
    with pytest.raises(InvalidSchedule, match=message):
        validate(_with_route(schedule, index, looping), fabric)
    zigzag = route("gpu1", "tor0.1", "agg0", "tor0.0", "agg1", "tor0.1", "agg0", "tor0.0", "gpu2")
    with pytest.raises(InvalidSchedule, match="visits (tor0.1|agg0|tor0.0) twice"):
        validate(_with_route(schedule, index, zigzag), fabric)
    simple = route("gpu1", "tor0.1", "agg1", "tor0.0", "gpu2")  # a path of the same length as the ring's: fine
    validate(_with_route(schedule, index, simple), fabric)


def test_forwarding_before_holding(four):
    schedule = _ring_allgather(four)
    step = schedule.transfers.step.copy()
    step[1] = 0  # the second hop of chunk 0 now happens in the same step as the first
    with pytest.raises(InvalidSchedule, match="forwards chunk 0 .* before it holds it"):
        validate(_transfers(schedule, step=step), four)


def test_missing_delivery(four):
    schedule = _without(_ring_allgather(four), 2)  # drop the last hop of chunk 0
    with pytest.raises(InvalidSchedule, match=r"rank 3 \(gpu3\) never receives chunk 0 \(of source rank 0\)"):
        validate(schedule, four)


def test_duplicate_delivery(four):
    schedule = _ring_allgather(four)
    receiver = schedule.transfers.receiver.copy()
    # transfer 1 (gpu1 -> gpu2, chunk 0) rerouted back to gpu0, which already holds chunk 0
    receiver[1] = 0
    links = schedule.transfers.route_links.copy()
    links[3] = four.link_between("sw0", "gpu0").id
    with pytest.raises(InvalidSchedule, match="already holds that chunk"):
        validate(_transfers(schedule, receiver=receiver, route_links=links), four)


def test_reduction_counted_twice_and_missing_contribution(four):
    schedule = naive_ring(four, Collective.REDUCESCATTER)
    t = schedule.transfers
    receiver, links = t.receiver.copy(), t.route_links.copy()
    # chunk 0 (block 0): 1 -> 2 -> 3 -> 0. Send 3's partial back to 1 instead: 1's input counted twice.
    receiver[2] = 1
    links[5] = four.link_between("sw0", "gpu1").id
    with pytest.raises(InvalidSchedule, match="would add rank 1's contribution to that chunk twice"):
        validate(_transfers(schedule, receiver=receiver, route_links=links), four)
    with pytest.raises(InvalidSchedule, match=r"rank 0 \(gpu0\) ends without rank 3's contribution"):
        validate(_without(schedule, 2), four)


def test_allreduce_copy_that_loses_data(four):
    schedule = naive_ring(four, Collective.ALLREDUCE)
    t = schedule.transfers
    step = t.step.copy()
    # Move the first AllGather-phase copy of chunk 0 before the reduction finished.
    first_copy = int(np.flatnonzero((t.chunk == 0) & (t.op == TransferOp.COPY))[0])
    step[first_copy] = 0
    with pytest.raises(InvalidSchedule, match="overwrite the contribution|would add"):
        validate(_transfers(schedule, step=step), four)


def test_alltoall_relay_and_missing_block(four):
    schedule = direct_alltoall(four)
    validate(schedule, four)
    keep = ~((schedule.chunks.source == 1) & (schedule.chunks.destination == 2))
    with pytest.raises(InvalidSchedule, match=r"block rank 1 -> rank 2 has no chunks"):
        validate(replace(schedule, chunks=Chunks(schedule.chunks.source[keep], schedule.chunks.destination[keep],
                                                 schedule.chunks.fraction[keep])), four)


@given(small_topologies(), st.integers(1, 3), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_rings_on_random_fabrics_validate_and_respect_the_cut_bound(fabric, chunks, rng):
    gpus = list(fabric.gpus)
    rng.shuffle(gpus)
    ranks = gpus[: max(2, rng.randint(2, len(gpus)))]
    for collective in Collective:
        try:
            if collective is Collective.ALLTOALL:
                schedule = direct_alltoall(fabric, ranks, chunks=chunks)
            else:
                schedule = (nccl_ring if rng.random() < 0.5 else naive_ring)(fabric, collective, ranks, chunks=chunks)
        except Infeasible as error:
            # Legitimate only when two ranks really have no switch-only route between them.
            src, dst = re.search(r"from (\S+) to (\S+) through", str(error)).groups()
            with pytest.raises(TopologyError):
                Router(fabric).routes(src, dst)
            continue
        validate(schedule, fabric)
        if collective is Collective.ALLGATHER:
            assert schedule.meta.achieved_gbs <= allgather_cut_bound(fabric, ranks).algbw_gbs * (1 + 1e-9)


@given(small_topologies(), st.data())
@settings(max_examples=60, deadline=None)
def test_mutated_schedules_are_accepted_or_rejected_cleanly(fabric, data):
    """Random corruption never crashes the validator: it passes or raises InvalidSchedule."""
    try:
        schedule = naive_ring(fabric, data.draw(st.sampled_from([Collective.ALLGATHER, Collective.REDUCESCATTER])))
    except Infeasible:
        return
    t = schedule.transfers
    column = data.draw(st.sampled_from(["chunk", "sender", "receiver", "step", "route_links"]))
    values = getattr(t, column).copy()
    index = data.draw(st.integers(0, len(values) - 1))
    values[index] = data.draw(st.integers(-2, max(len(schedule.chunks), len(fabric.links)) + 2))
    with contextlib.suppress(InvalidSchedule):
        validate(_transfers(schedule, **{column: values}), fabric)


def test_steps_with_a_gap_are_refused(four):
    """Issue 13: steps {0, 2e9} passed validate() and hung every rank that installed it (the exchange
    driver loops over range(n_steps)); a gap is now refused, so drivers' work is bounded by transfers."""
    ring = naive_ring(four, "allgather")
    sparse = _transfers(ring, step=np.where(ring.transfers.step > 0, ring.transfers.step + 2_000_000_000 - 2,
                                            ring.transfers.step))
    with pytest.raises(InvalidSchedule, match="step 1 has no transfers but step 2000000000 does"):
        validate(sparse, four)
    validate(_transfers(ring, step=ring.transfers.step), four)  # the compact original is fine


def test_sparse_holdings_give_the_same_verdicts(four, monkeypatch):
    """Above ranks × chunks = 2²⁴ the copy replay keeps a sorted key set instead of a matrix; forced
    here on small schedules, every copy-collective check names the same violation."""
    import importlib

    monkeypatch.setattr(importlib.import_module("mccl.schedule.validate"), "_DENSE_HELD", 0)
    for check in (test_valid_schedules_pass, test_forwarding_before_holding, test_missing_delivery,
                  test_duplicate_delivery, test_alltoall_relay_and_missing_block):
        check(four)


def test_one_pass_copy_check_agrees_with_the_replay():
    """_copies_hold (the one-pass rules 5-6 validate() runs first) says True exactly when the step-by-step
    replay passes, on valid schedules and on random damage to them (a transfer dropped, doubled, moved to
    another step, sent by another rank)."""
    from mccl.schedule.validate import _copies_hold, _replay_copies
    from mccl.synth import optimize
    from mccl.topology import rail_optimized

    fabric = rail_optimized(1, 2, 4)
    rng = np.random.default_rng(11)
    verdicts = set()
    for kind in ("allgather", "alltoall"):
        schedule = optimize(fabric, kind).schedule
        t = schedule.transfers
        for trial in range(40):
            rows = np.arange(len(t))
            step, sender = t.step.copy(), t.sender.copy()
            what = trial % 4
            pick = int(rng.integers(len(t)))
            if what == 0:
                rows = np.delete(rows, pick)
            elif what == 1:
                rows = np.insert(rows, pick, pick)
            elif what == 2:
                step[pick] = max(0, step[pick] + int(rng.choice([-2, -1, 1, 2])))
            else:
                sender[pick] = int(rng.integers(schedule.n_ranks))
            routes = [t.route(i) for i in rows]
            offsets = np.concatenate([[0], np.cumsum([len(r) for r in routes])])
            damaged = replace(schedule, transfers=Transfers(
                t.chunk[rows], sender[rows], t.receiver[rows], step[rows], t.op[rows], offsets,
                np.concatenate(routes)))
            try:
                _replay_copies(damaged)
                passes = True
            except InvalidSchedule:
                passes = False
            assert _copies_hold(damaged) == passes, (kind, trial)
            verdicts.add(passes)
    assert verdicts == {True, False}
