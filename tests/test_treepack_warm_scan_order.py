"""The warm start's compiled grouping of a previous schedule not grouped by chunk (warmscan.group_by_chunk,
gather_routes) against the numpy expressions they replace."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mccl.synth.treepack.forest import segments
from mccl.synth.treepack.warmscan import gather_routes, group_by_chunk


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=0, max_size=60), st.booleans(), st.integers(0, 2**31 - 1))
def test_grouping_and_route_gathers_equal_numpy(chunks, reverse, seed):
    chunk = np.array(chunks, dtype=np.int32)
    order = group_by_chunk(chunk, 7)
    assert np.array_equal(order, np.argsort(chunk, kind="stable"))
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 5, size=len(chunk))
    route_offsets = np.zeros(len(chunk) + 1, dtype=np.int64)
    np.cumsum(lengths, out=route_offsets[1:])
    route_links = rng.integers(0, 100, size=int(route_offsets[-1])).astype(np.int32)
    offsets, links = gather_routes(route_offsets, route_links, order, reverse)
    expected = segments(route_links, route_offsets[:-1][order], lengths[order].astype(np.int64), reverse=reverse)
    assert np.array_equal(links, expected) and links.dtype == np.int32
    assert np.array_equal(offsets, np.r_[0, np.cumsum(lengths[order])])
