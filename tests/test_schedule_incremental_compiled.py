"""The compiled copy checks of a warm update (mccl.schedule.copykernel) against the numpy reference and the
full validation, on deliberately broken updates."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mccl.errors import InvalidSchedule
from mccl.schedule import Schedule, Transfers, validate
from mccl.schedule.incremental import (
    TransferOrigin,
    _claims_compiled,
    _copied_chunks,
    _copies_hold_up,
    _whole_compiled,
    validate_update,
)
from mccl.synth import optimize
from mccl.topology import fail1, fail2, rail_optimized

DAMAGES = ("claim elsewhere", "claim twice", "claim outside", "copy sender", "copy step", "copy link",
           "new link", "new step", "new receiver", "chunk")


@pytest.fixture(scope="module", params=[("allgather", fail2), ("alltoall", fail2), ("allgather", fail1)],
                ids=["allgather-fail2", "alltoall-fail2", "allgather-fail1"])
def warm(request):
    """(topology, healthy result, warm result) on a 16-GPU rail-optimized fabric."""
    kind, fault = request.param
    topology = rail_optimized(1, 2, 8)
    healthy = optimize(topology, kind)
    return topology, healthy, optimize(fault(topology), kind, previous=healthy)


def _damaged(schedule: Schedule, source: np.ndarray, damage: str, rng: np.random.Generator,
             n_previous: int, n_links: int) -> tuple[Schedule, np.ndarray]:
    """The schedule and claims with one damage (random place); most damages break the schedule or a claim."""
    columns = {name: np.array(getattr(schedule.transfers, name)) for name in
               ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links")}
    source = np.array(source)
    copied, fresh = np.flatnonzero(source >= 0), np.flatnonzero(source < 0)
    i = int(rng.choice(copied if damage.startswith(("claim", "copy")) or not len(fresh) else fresh))
    start = int(columns["route_offsets"][i])
    if damage == "claim elsewhere":
        source[i] = (source[i] + int(rng.integers(1, n_previous))) % n_previous
    elif damage == "claim twice":
        source[i] = source[int(rng.choice(copied[copied != i]))]
    elif damage == "claim outside":
        source[i] = n_previous + int(rng.integers(0, 3))
    elif damage in ("copy sender", "new receiver"):
        column = "sender" if damage == "copy sender" else "receiver"
        columns[column][i] = (columns[column][i] + int(rng.integers(1, schedule.n_ranks))) % schedule.n_ranks
    elif damage in ("copy step", "new step"):
        columns["step"][i] = max(0, int(columns["step"][i]) + int(rng.choice([-1, 1])))
    elif damage in ("copy link", "new link"):
        columns["route_links"][start] = (columns["route_links"][start] + int(rng.integers(1, n_links))) % n_links
    elif damage == "chunk":
        columns["chunk"][i] = (columns["chunk"][i] + int(rng.integers(1, len(schedule.chunks)))) % len(schedule.chunks)
    return replace(schedule, transfers=Transfers(**columns)), source


def _outcome(check) -> str:
    try:
        check()
    except InvalidSchedule as error:
        return str(error)
    return "valid"


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_broken_update_is_refused_as_the_full_validation_refuses_it(warm, damage):
    """Compiled and numpy copy checks agree (claims hold / chunks copied whole), and the incremental
    validation passes exactly what the full one passes, naming the same first violation."""
    topology, healthy, repaired = warm
    previous = healthy.schedule
    rng = np.random.default_rng(sum(map(ord, damage)))
    refused = 0
    for _ in range(6):
        schedule, source = _damaged(repaired.schedule, repaired.origin.source, damage, rng,
                                    len(previous.transfers), len(topology.links))
        origin = TransferOrigin(previous.transfers, source)
        numpy_claims = _copies_hold_up(schedule.transfers, previous.transfers, source)
        compiled_claims = _claims_compiled(schedule, previous, source)
        assert (numpy_claims is None) == (compiled_claims is None)
        in_range = bool(np.all((schedule.transfers.chunk >= 0) & (schedule.transfers.chunk < len(schedule.chunks))))
        if numpy_claims is not None and in_range:
            assert np.array_equal(_copied_chunks(schedule, previous, numpy_claims),
                                  _whole_compiled(schedule, previous, source))
        full = _outcome(lambda schedule=schedule: validate(schedule, topology))
        for compiled in (True, False):
            assert _outcome(lambda schedule=schedule, origin=origin, compiled=compiled: validate_update(
                schedule, topology, previous, origin, compiled=compiled)) == full
        refused += full != "valid"
    if damage.startswith("claim"):
        assert refused == 0  # the schedule itself is intact: a false claim only costs the full validation
    else:
        assert refused  # the damages do break schedules (the comparison above is not vacuous)


def test_the_compiled_checks_accept_the_true_claims(warm):
    """On the undamaged update both engines keep every claim and find the same whole chunks."""
    topology, healthy, repaired = warm
    previous, schedule = healthy.schedule, repaired.schedule
    source = np.asarray(repaired.origin.source, dtype=np.int64)
    claims = _copies_hold_up(schedule.transfers, previous.transfers, source)
    assert claims is not None and _claims_compiled(schedule, previous, source) is not None
    whole = _whole_compiled(schedule, previous, source)
    assert np.array_equal(whole, _copied_chunks(schedule, previous, claims)) and whole.any()
    fresh = validate_update(schedule, topology, previous, repaired.origin)
    assert fresh is not None and np.array_equal(fresh, source < 0)


def test_remembered_link_sums_are_kept_only_where_link_sums_would_keep_them(warm):
    """``Transfers.remember_link_sums``: a read-only weight (or None) is answered from memory, a writable
    weight is not remembered (its values may change), a wrong length is refused."""
    topology, _, repaired = warm
    old = repaired.schedule.transfers
    transfers = Transfers(old.chunk, old.sender, old.receiver, old.step, old.op, old.route_offsets, old.route_links)
    n_links = len(topology.links)
    marker = np.arange(n_links, dtype=float)  # not the true load: shows where the memory answers
    transfers.remember_link_sums(repaired.schedule.chunks.fraction, n_links, marker)
    assert np.array_equal(transfers.link_sums(repaired.schedule.chunks.fraction, n_links), marker)
    writable = np.array(repaired.schedule.chunks.fraction)
    transfers.remember_link_sums(writable, n_links, marker)
    assert not np.array_equal(transfers.link_sums(writable, n_links), marker)
    with pytest.raises(ValueError, match="links"):
        transfers.remember_link_sums(None, n_links + 1, np.zeros(n_links))


def test_a_previous_schedule_not_grouped_by_chunk_is_still_mostly_copied():
    """A registered schedule whose transfers are in step order (a file, another tool, an older lowering): the
    warm repair's claims do not depend on the previous order, so the update is as cheap to validate and map
    as from a schedule grouped by chunk (it was 73 % "new" at 512 GPUs when only ordered claims counted)."""
    from mccl.synth.treepack.forest import segments

    topology = rail_optimized(1, 2, 8)
    healthy = optimize(topology, "allgather").schedule
    old = healthy.transfers
    order = np.argsort(old.step, kind="stable")
    lengths = old.route_lengths[order].astype(np.int64)
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    by_step = replace(healthy, transfers=Transfers(old.chunk[order], old.sender[order], old.receiver[order],
                                                   old.step[order], old.op[order], offsets,
                                                   segments(old.route_links, old.route_offsets[:-1][order], lengths)))
    assert not np.all(np.diff(by_step.transfers.chunk) >= 0)
    validate(by_step, topology)
    grouped = optimize(fail2(topology), "allgather", previous=healthy)
    shuffled = optimize(fail2(topology), "allgather", previous=by_step)
    assert shuffled.achieved_gbs == grouped.achieved_gbs
    new_grouped = int(np.count_nonzero(grouped.origin.source < 0))
    new_shuffled = int(np.count_nonzero(shuffled.origin.source < 0))
    assert new_shuffled == new_grouped < len(shuffled.origin.source) // 2  # here k grows: 30 % new either way
    fresh = validate_update(shuffled.schedule, fail2(topology), by_step, shuffled.origin)
    assert fresh is not None and int(fresh.sum()) == new_shuffled
