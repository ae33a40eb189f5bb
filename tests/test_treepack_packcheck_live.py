"""Phase 3 at 2,048 GPUs (issue 17): the greedy over live arcs only, the check by one rooted cut — same trees."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mccl.synth.cutbound import CutChecker, max_rate
from mccl.synth.treepack import growkernel
from mccl.synth.treepack.arborescence import pack_arborescences
from mccl.synth.treepack.balance import split_switches
from mccl.synth.treepack.fabric import fabric_of
from mccl.synth.treepack.growkernel import FastGrower, host_index
from mccl.synth.treepack.packcheck import packs
from mccl.synth.treepack.rounding import best_integral_rate
from mccl.synth.treepack.treeset import TreeSet
from mccl.topology import fail3, rail_optimized

_NEVER = 1 << 40


@st.composite
def _graphs_and_plans(draw: st.DrawFn):
    """A random rank graph (3–9 ranks, units 0–6) and, per root, whether its trees are released again."""
    n = draw(st.integers(3, 9))
    pairs = [(u, v) for u in range(n) for v in range(n) if u != v]
    chosen = draw(st.lists(st.sampled_from(pairs), min_size=n, max_size=len(pairs), unique=True))
    tails = np.array([u for u, _ in chosen], dtype=np.int64)
    heads = np.array([v for _, v in chosen], dtype=np.int64)
    units = np.array(draw(st.lists(st.integers(0, 6), min_size=len(chosen), max_size=len(chosen))), dtype=np.int64)
    release = draw(st.lists(st.booleans(), min_size=2 * n, max_size=2 * n))
    return n, tails, heads, units, release


def _grow_all(n, tails, heads, units, release, k: int, every: int) -> list:
    """Grow every root twice over (2n growths); where ``release`` says, the oldest root still held gives its
    units back. Live arcs re-listed every ``every`` growths; the groups grown."""
    saved, growkernel._REFRESH_EVERY = growkernel._REFRESH_EVERY, every
    try:
        return _grow_with(n, tails, heads, units, release, k)
    finally:
        growkernel._REFRESH_EVERY = saved


def _grow_with(n, tails, heads, units, release, k: int) -> list:
    grower = FastGrower(n, tails, heads, False)
    residual = units.copy()
    grown_all, held = [], []
    for step, again in enumerate(release):
        grown = grower.grow_root(step % n, k, residual, np.zeros(len(tails), dtype=bool))
        grown_all.append(None if grown is None else (grown.multiplicity.tolist(), grown.arcs.tolist()))
        if grown is not None:
            held.append(grown)
        if again and len(held) > 1:  # an earlier root's units back, after later growths (a packer backing off)
            held.pop(0).release(residual)
            grower.released()
    return grown_all


@settings(max_examples=40, deadline=None)
@given(case=_graphs_and_plans(), k=st.integers(1, 3), every=st.integers(1, 3))
def test_live_arc_listing_grows_the_same_trees(case, k: int, every: int) -> None:
    """Listing only arcs with units left (re-listed every 1–3 growths, and after releases) takes the same
    arcs, split for split, as walking every arc (never re-listed)."""
    n, tails, heads, units, release = case
    assert _grow_all(n, tails, heads, units, release, k, every) == _grow_all(n, tails, heads, units, release, k,
                                                                              _NEVER)


def _logical(topology):
    fabric = fabric_of(topology, [node.id for node in topology.nodes if node.is_gpu])
    checker = CutChecker(fabric)
    integral = best_integral_rate(fabric, 10, max_rate(fabric, checker=checker).rate_gbps, checker)
    return fabric, split_switches(fabric, integral)


def _same(a: TreeSet, b: TreeSet) -> bool:
    return all(np.array_equal(getattr(a, name), getattr(b, name)) for name in ("root", "multiplicity", "arcs", "depth"))


@pytest.mark.parametrize("fault", [None, fail3])
def test_stalling_packing_same_trees_with_and_without_live_listing(fault, monkeypatch) -> None:
    """On the 32-GPU rail fabric (where the greedy stalls, releases and checks) the packing is the same
    whether the greedy re-lists live arcs every other growth (and after every release) or never."""
    topology = rail_optimized(1, 4, 8)
    fabric, split = _logical(fault(topology) if fault else topology)
    packed = []
    for every in (2, _NEVER):
        monkeypatch.setattr(growkernel, "_REFRESH_EVERY", every)
        trees, flows, _ = pack_arborescences(fabric.n_ranks, split.logical.units, split.k, groups=fabric.groups)
        packed.append(trees)
        assert np.all(trees.trees_per_root() == split.k)
    assert _same(*packed)


def test_check_after_the_rules_is_one_rooted_cut() -> None:
    """With the host rule off (hosts of one rank) and ranks left unproven, the check counts one solve (the
    rooted cut) however many ranks remain, and still fails where one rank cannot be reached."""
    topology = rail_optimized(1, 4, 8)
    fabric, split = _logical(topology)
    keys = list(split.logical.units)
    tails = np.array([u for u, _ in keys], dtype=np.int64)
    heads = np.array([v for _, v in keys], dtype=np.int64)
    units = np.array([split.logical.units[key] for key in keys], dtype=np.int64)
    n = fabric.n_ranks
    alone = host_index(n, None)
    untouched = np.zeros(n, dtype=np.int64)
    untouched[[3, 17, 30]] = split.k
    assert packs(n, tails, heads, units, untouched, alone) == (True, 1)
    short = units.copy()
    short[heads == 9] = 0
    assert packs(n, tails, heads, short, untouched, alone) == (False, 1)
