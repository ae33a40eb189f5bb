"""The pure half of the runtime: chunk layout, per-rank plans (no ranks), and import hygiene (a fresh interpreter)."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mccl.runtime.plan import build_plan, chunk_layout
from mccl.schedule import validate
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import naive_ring, nccl_ring
from mccl.topology import rail_optimized, single_switch


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=7), st.integers(0, 5000), st.integers(1, 3))
def test_layout_covers_every_block_exactly(weights, elements, blocks):
    fractions = np.array(weights * blocks) / sum(weights)
    chunk_block = np.repeat(np.arange(blocks), len(weights))
    layout = chunk_layout(chunk_block, fractions, np.full(blocks, elements))
    for block in range(blocks):
        mine = np.flatnonzero(chunk_block == block)
        order = mine[np.argsort(layout.offset[mine], kind="stable")]
        assert layout.length[mine].sum() == elements
        ends = layout.offset[order] + layout.length[order]
        assert layout.offset[order][0] == 0
        assert np.all(layout.offset[order][1:] == ends[:-1])  # contiguous, no overlap, no gap
        assert np.all(layout.length >= 0)


def test_layout_follows_fractions_and_is_deterministic():
    fractions = np.array([0.2, 0.5, 0.3])
    layout = chunk_layout(np.zeros(3, dtype=np.int64), fractions, np.array([1001]))
    assert layout.length.tolist() == [200, 501, 300]  # rint(200.2)=200, rint(700.7)=701 -> 501, 300
    again = chunk_layout(np.zeros(3, dtype=np.int64), fractions, np.array([1001]))
    assert np.array_equal(layout.offset, again.offset)


def _pairs_agree(schedule):
    plans = [build_plan(schedule, rank) for rank in range(schedule.n_ranks)]
    for plan in plans:
        for op in plan.ops:
            peer_plan = plans[op.peer]
            twins = [o for o in peer_plan.ops if o.transfer == op.transfer]
            assert len(twins) == 1 and twins[0].is_send != op.is_send and twins[0].tag == op.tag
        # per peer, sends and receives are listed in the same order on both ends
        for peer in range(schedule.n_ranks):
            sent = [o.transfer for o in plan.ops if o.is_send and o.peer == peer]
            received = [o.transfer for o in plans[peer].ops if not o.is_send and o.peer == plan.rank]
            assert sent == received


def test_plans_match_sends_to_receives_per_peer():
    topology = rail_optimized(1, 2, 4)
    for schedule in (naive_ring(topology, "allgather", chunks=2), nccl_ring(topology, "reducescatter"),
                     direct_alltoall(topology, chunks=2), naive_ring(topology, "allreduce")):
        validate(schedule, topology)
        _pairs_agree(schedule)


def test_relays_and_dependencies():
    topology = rail_optimized(1, 2, 4)
    schedule = direct_alltoall(topology)  # PXN: cross-rail blocks relay through a same-host GPU
    plan = build_plan(schedule, 1)
    assert plan.relayed_chunks and plan.has_relays
    for op in plan.ops:
        if op.is_send and op.chunk in plan.relayed_chunks:
            assert op.deps and all(not plan.ops[d].is_send and plan.ops[d].chunk == op.chunk for d in op.deps)
    ring = build_plan(naive_ring(single_switch(4, 100), "reducescatter"), 0)
    forwarded = [op for op in ring.ops if op.is_send and op.step > 0]
    assert all(op.deps for op in forwarded)


@pytest.mark.multiprocess
def test_import_mccl_does_not_load_torch_and_init_is_lazy():
    code = ("import sys, mccl; assert 'torch' not in sys.modules; f = mccl.init; "
            "assert 'torch' in sys.modules and f.__module__ == 'mccl.runtime.api'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
