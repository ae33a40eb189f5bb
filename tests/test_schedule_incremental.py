"""Validation of a warm re-synthesis only where it changed (mccl.schedule.incremental), and the manager's use of it."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest

from mccl.control.drift import merge_maps, overlay_map
from mccl.control.prepared import prepare_update
from mccl.errors import InvalidSchedule
from mccl.schedule import Schedule, Transfers, validate
from mccl.schedule.incremental import TransferOrigin, validate_update
from mccl.synth import optimize
from mccl.topology import fail2, rail_optimized


@pytest.fixture(scope="module")
def fabric():
    return rail_optimized(1, 4, 8)


@pytest.fixture(scope="module", params=["allgather", "alltoall"])
def warm(request, fabric):
    """(healthy result, warm Fail2 result) on a 32-GPU rail-optimized fabric."""
    healthy = optimize(fabric, request.param)
    return healthy, optimize(fail2(fabric), request.param, previous=healthy)


def _with(schedule: Schedule, **columns: np.ndarray) -> Schedule:
    """``schedule`` with some transfer columns replaced (copies)."""
    old = schedule.transfers
    fields = {name: np.array(getattr(old, name)) for name in
              ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links")}
    fields.update(columns)
    return replace(schedule, transfers=Transfers(**fields))


def test_a_warm_result_says_what_it_copied_and_only_the_rest_is_new(warm, fabric):
    healthy, repaired = warm
    origin = repaired.origin
    assert origin is not None and origin.previous is healthy.schedule.transfers
    copied = origin.source >= 0
    assert 0 < copied.sum() < len(copied)  # most of it kept, some of it changed
    new, old = repaired.schedule.transfers, healthy.schedule.transfers
    for i, j in zip(np.flatnonzero(copied)[::97].tolist(), origin.source[copied][::97].tolist(), strict=True):
        assert new[i].route == old[j].route and (new[i].sender, new[i].step) == (old[j].sender, old[j].step)
    fresh = validate_update(repaired.schedule, fabric, healthy.schedule, origin)
    assert fresh is not None and np.array_equal(fresh, ~copied)
    # The delta overlay map merged into the previous one is the new schedule's map merged into it.
    before = overlay_map(healthy.schedule, fabric)
    prepared = prepare_update(healthy.schedule, repaired, fabric)
    assert prepared.delta
    expected = merge_maps(before, overlay_map(repaired.schedule, fabric))
    got = merge_maps(before, prepared.coverage)
    assert np.array_equal(expected.offsets, got.offsets) and np.array_equal(expected.links, got.links)


def test_a_broken_new_chunk_is_named_as_the_full_validation_names_it(warm, fabric):
    """A new transfer that relays a chunk at step 0, before its sender holds it (rule 5, per chunk)."""
    healthy, repaired = warm
    schedule, origin = repaired.schedule, repaired.origin
    transfers = schedule.transfers
    fresh = np.flatnonzero(origin.source < 0)
    relayed = fresh[(transfers.sender[fresh] != schedule.chunks.source[transfers.chunk[fresh]])
                    & (transfers.step[fresh] > 0)]
    assert len(relayed)
    step = np.array(transfers.step)
    step[int(relayed[0])] = 0
    broken = _with(schedule, step=step)
    with pytest.raises(InvalidSchedule) as full:
        validate(broken, fabric)
    with pytest.raises(InvalidSchedule) as incremental:
        validate_update(broken, fabric, healthy.schedule, origin)
    assert "before it holds it" in str(full.value) and str(incremental.value) == str(full.value)


def test_a_copy_that_is_not_one_is_caught(warm, fabric):
    """A claimed copy whose route differs from the previous transfer's: the claim is dropped and the whole
    schedule validated — here the changed route breaks rule 4, so it is refused."""
    healthy, repaired = warm
    schedule, origin = repaired.schedule, repaired.origin
    copied = np.flatnonzero(origin.source >= 0)
    links = np.array(schedule.transfers.route_links)
    start = int(schedule.transfers.route_offsets[copied[0]])
    links[start] = (links[start] + 1) % len(fabric.links)
    broken = _with(schedule, route_links=links)
    with pytest.raises(InvalidSchedule) as full:
        validate(broken, fabric)
    with pytest.raises(InvalidSchedule) as incremental:
        validate_update(broken, fabric, healthy.schedule, TransferOrigin(healthy.schedule.transfers, origin.source))
    assert str(incremental.value) == str(full.value)


def test_a_whole_chunk_copied_under_another_source_is_checked_in_full(warm, fabric):
    """Relabelled chunks (the copies point at another chunk's transfers): no chunk passes as a copy."""
    healthy, repaired = warm
    schedule, origin = repaired.schedule, repaired.origin
    shifted = np.where(origin.source >= 0, (origin.source + 1) % len(healthy.schedule.transfers), -1)
    assert validate_update(schedule, fabric, healthy.schedule, TransferOrigin(healthy.schedule.transfers, shifted)) is None


def test_without_a_usable_origin_everything_is_validated(warm, fabric):
    healthy, repaired = warm
    stranger = TransferOrigin(repaired.schedule.transfers, repaired.origin.source)  # not the previous schedule's
    assert validate_update(repaired.schedule, fabric, healthy.schedule, stranger) is None
    assert validate_update(repaired.schedule, fabric, healthy.schedule, None) is None


@pytest.mark.parametrize("kind", ["allgather", "alltoall"])
def test_the_manager_validates_and_maps_only_what_a_warm_resynthesis_changed(kind, monkeypatch):
    """Through the manager (the healthy schedule registered with its result): the Fail2 re-synthesis is
    prepared as a delta, and the communicator's overlay map is what mapping the whole schedule gives."""
    import mccl.control.manager as manager_module
    from mccl.control import ControlConfig, ScheduleManager
    from test_control_manager import samples

    topology = rail_optimized(1, 2, 8)
    healthy = optimize(topology, kind).with_version(1)
    prepared = []

    def recording(previous, result, on):
        prepared.append(prepare_update(previous, result, on))
        return prepared[-1]

    monkeypatch.setattr(manager_module, "prepare_update", recording)
    manager = ScheduleManager(topology, ControlConfig(alpha=1.0, gamma=0.2, warmup=1, settle_collectives=1))
    manager.register("job", healthy.schedule, result=healthy)
    for seq in range(1, 4):
        manager.ingest(samples(16, seq))
    for seq in range(4, 7):
        manager.ingest(samples(16, seq, slow_rank=0))
    assert [event.kind for event in manager.step()] == ["flagged", "synthesized", "issued"]
    issued = manager.active_result("job", kind)
    assert issued.origin is not None and len(prepared) == 1 and prepared[0].delta
    coverage = manager._comms["job"].coverage
    expected = merge_maps(overlay_map(healthy.schedule, topology), overlay_map(issued.schedule, topology))
    assert np.array_equal(coverage.offsets, expected.offsets) and np.array_equal(coverage.links, expected.links)
    validate(issued.schedule, topology)


def _first_new(schedule: Schedule, origin: TransferOrigin) -> int:
    return int(np.flatnonzero(origin.source < 0)[0])


@pytest.mark.parametrize("damage", ["own rank", "reduce", "unknown op", "sender outside", "chunk outside"])
def test_rule_3_checked_on_the_new_transfers_names_what_the_full_validation_names(warm, fabric, damage):
    """Rule 3's per-transfer checks run only on the transfers that copy nothing (a copy's fields are a
    validated transfer's); the chunk index on every transfer. Either way the message is the full one's."""
    healthy, repaired = warm
    schedule, origin = repaired.schedule, repaired.origin
    transfers, i = schedule.transfers, _first_new(schedule, origin)
    columns: dict[str, np.ndarray] = {}
    if damage == "own rank":
        columns["receiver"] = np.array(transfers.receiver)
        columns["receiver"][i] = transfers.sender[i]
    elif damage in ("reduce", "unknown op"):
        columns["op"] = np.array(transfers.op)
        columns["op"][i] = 1 if damage == "reduce" else -3
    elif damage == "sender outside":
        columns["sender"] = np.array(transfers.sender)
        columns["sender"][i] = schedule.n_ranks
    else:  # a copied transfer's (renumbered) chunk index: checked on every transfer
        copied = int(np.flatnonzero(origin.source >= 0)[-1])
        columns["chunk"] = np.array(transfers.chunk)
        columns["chunk"][copied] = len(schedule.chunks)
    broken = _with(schedule, **columns)
    with pytest.raises(InvalidSchedule) as full:
        validate(broken, fabric)
    with pytest.raises(InvalidSchedule) as incremental:
        validate_update(broken, fabric, healthy.schedule, origin)
    assert str(incremental.value) == str(full.value)


def test_link_sums_are_remembered_only_for_read_only_weights(warm):
    """``Transfers.link_sums`` keeps its answer for an immutable weight array (the chunks' fractions): the
    same values, a copy the caller may change; a writable weight array is summed again every time."""
    _, repaired = warm
    schedule = repaired.schedule
    transfers, fraction, n_links = schedule.transfers, schedule.chunks.fraction, int(schedule.transfers.max_link()) + 1
    reference = np.bincount(transfers.route_links, minlength=n_links,
                            weights=np.repeat(fraction[transfers.chunk], transfers.route_lengths))
    first = transfers.link_sums(fraction, n_links)
    first[:] = -1.0  # the caller's copy
    assert np.array_equal(transfers.link_sums(fraction, n_links), reference)
    assert np.array_equal(transfers.link_sums(None, n_links), np.bincount(transfers.route_links, minlength=n_links))
    writable = np.array(fraction)
    assert np.array_equal(transfers.link_sums(writable, n_links), reference)
    writable *= 2.0
    assert np.allclose(transfers.link_sums(writable, n_links), 2.0 * reference)
    copied = pickle.loads(pickle.dumps(transfers))  # the memo is not pickled (it may hold another's fractions)
    assert "_link_sums" in transfers.__dict__ and "_link_sums" not in copied.__dict__ and copied == transfers


def test_the_guard_predicts_a_reversioned_schedule_from_its_cache(warm, fabric, monkeypatch):
    """The manager re-versions the candidate (``with_meta``) before activating it; the α-β predictor's cache
    is keyed by the transfers and chunks, so the activated version is not loaded again."""
    import mccl.control.guard as guard_module

    _, repaired = warm
    calls = []
    real = guard_module.link_load
    monkeypatch.setattr(guard_module, "link_load", lambda schedule, n: calls.append(schedule) or real(schedule, n))
    predict = guard_module.AlphaBeta()
    candidate = repaired.schedule
    seconds = predict(candidate, fabric, 1 << 28)
    assert predict(candidate.with_meta(version=7), fabric, 1 << 28) == seconds and len(calls) == 1
    other = replace(candidate, transfers=Transfers(*(np.array(getattr(candidate.transfers, name)) for name in (
        "chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links"))))
    assert predict(other, fabric, 1 << 28) == seconds and len(calls) == 2  # equal, but not the same transfers


def test_the_sorted_copy_check_still_agrees_with_the_replay(monkeypatch):
    """``_copies_hold`` indexes dense arrays by (chunk, rank) key up to ``_DENSE_KEYS`` keys and sorts the
    keys above; forced to sort here, the random-damage comparison with the replay (test_validate) holds."""
    import importlib

    from test_validate import test_one_pass_copy_check_agrees_with_the_replay

    monkeypatch.setattr(importlib.import_module("mccl.schedule.validate"), "_DENSE_KEYS", 0)
    test_one_pass_copy_check_agrees_with_the_replay()


def test_a_mostly_new_schedule_is_validated_in_full(warm, fabric):
    """When most transfers copy nothing, the claims are not checked: the full validation runs (it costs less
    than the claims, the chunk check and the copied-out rest), and the manager maps every route."""
    healthy, repaired = warm
    source = np.array(repaired.origin.source)
    source[: (len(source) + 1) // 2 + 1] = -1
    mostly_new = TransferOrigin(healthy.schedule.transfers, source)
    assert validate_update(repaired.schedule, fabric, healthy.schedule, mostly_new) is None
    step = np.array(repaired.schedule.transfers.step)
    step[-1] = step.max() + 2  # a gap in the steps: named as the full validation names it
    broken = _with(repaired.schedule, step=step)
    with pytest.raises(InvalidSchedule) as full:
        validate(broken, fabric)
    with pytest.raises(InvalidSchedule) as incremental:
        validate_update(broken, fabric, healthy.schedule, mostly_new)
    assert str(incremental.value) == str(full.value)
