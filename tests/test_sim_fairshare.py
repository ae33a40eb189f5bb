"""Max-min fair sharing on hand-computed cases and against a one-level-at-a-time reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mccl.sim import max_min_rates


def _csr(routes):
    offsets = np.zeros(len(routes) + 1, dtype=np.int64)
    np.cumsum([len(route) for route in routes], out=offsets[1:])
    links = np.concatenate([np.asarray(route, dtype=np.int64) for route in routes]) if routes else np.zeros(0, int)
    return offsets, links


def _reference(routes, capacity, caps=None):
    """Textbook progressive filling: raise every unfrozen rate by the smallest increment
    that saturates a link (or reaches a cap), freeze, repeat."""
    capacity = np.asarray(capacity, dtype=float)
    n = len(routes)
    caps = np.full(n, np.inf) if caps is None else np.asarray(caps, dtype=float)
    rates = np.zeros(n)
    frozen = np.array([len(route) == 0 for route in routes])
    rates[frozen] = caps[frozen]
    while not frozen.all():
        used = np.zeros(len(capacity))
        counts = np.zeros(len(capacity))
        for f, route in enumerate(routes):
            for link in route:
                used[link] += rates[f]
                if not frozen[f]:
                    counts[link] += 1
        with np.errstate(divide="ignore", invalid="ignore"):
            headroom = np.where(counts > 0, (capacity - used) / counts, np.inf)
        increment = min(headroom.min(), (caps - rates)[~frozen].min())
        rates[~frozen] += increment
        saturated = headroom <= increment * (1 + 1e-12) + 1e-12
        for f, route in enumerate(routes):
            if not frozen[f] and (any(saturated[link] for link in route) or rates[f] >= caps[f] * (1 - 1e-12)):
                frozen[f] = True
    return rates


def test_two_flows_sharing_a_link_get_half_each():
    share = max_min_rates(*_csr([[0], [0]]), np.array([10.0]))
    assert share.rates.tolist() == [5.0, 5.0]
    assert share.bottleneck.tolist() == [0, 0]


def test_bertsekas_gallager_example():
    # Links 0..2 of capacity 1; flow A crosses all three, B link 0, C link 1, D link 2 twice shared with E.
    routes = [[0, 1, 2], [0], [1], [2], [2]]
    rates = max_min_rates(*_csr(routes), np.ones(3)).rates
    # link 2 carries A, D, E: 1/3 each; then A is frozen at 1/3 and B, C get 2/3.
    assert rates == pytest.approx([1 / 3, 2 / 3, 2 / 3, 1 / 3, 1 / 3])


def test_caps_and_empty_routes():
    routes = [[0], [0], []]
    share = max_min_rates(*_csr(routes), np.array([10.0]), caps=np.array([2.0, np.inf, 7.0]))
    assert share.rates.tolist() == [2.0, 8.0, 7.0]
    assert share.bottleneck.tolist() == [-1, 0, -1]


def test_a_route_crossing_a_link_twice_counts_twice():
    rates = max_min_rates(*_csr([[0, 0], [0]]), np.array([9.0])).rates
    assert rates == pytest.approx([3.0, 3.0])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_matches_textbook_progressive_filling(data):
    n_links = data.draw(st.integers(1, 6))
    routes = data.draw(st.lists(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=4, unique=True),
                                min_size=1, max_size=10))
    capacity = np.array(data.draw(st.lists(st.floats(0.5, 100.0), min_size=n_links, max_size=n_links)))
    caps = np.array(data.draw(st.lists(st.one_of(st.just(np.inf), st.floats(0.1, 50.0)),
                                       min_size=len(routes), max_size=len(routes))))
    got = max_min_rates(*_csr(routes), capacity, caps).rates
    assert got == pytest.approx(_reference(routes, capacity, caps), rel=1e-9, abs=1e-9)
    load = np.zeros(n_links)
    for f, route in enumerate(routes):
        load[route] += got[f]
    assert np.all(load <= capacity * (1 + 1e-9))  # feasible


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_zone_local_recompute_matches_a_full_solve(data):
    """FlowTable re-solves only the zones an event touched; the rates must equal a full solve."""
    from mccl.sim.flows import FlowTable

    n_links = data.draw(st.integers(2, 8))
    routes = data.draw(st.lists(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=3, unique=True),
                                min_size=2, max_size=12))
    capacity = np.array(data.draw(st.lists(st.floats(1.0, 100.0), min_size=n_links, max_size=n_links)))
    table = FlowTable(n_links, step_priority=1.0)
    table.add_routes(*_csr(routes))
    offsets, links = _csr(routes)
    count = len(routes)
    table.add(0, np.arange(count), np.full(count, 1e6), np.diff(offsets), links, np.full(count, -1),
              np.zeros(count, dtype=np.int64), np.arange(count), 0.0)
    table.recompute(capacity, 0.0)
    gone = np.zeros(count, dtype=bool)
    gone[data.draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=count - 1, unique=True))] = True
    table.remove(gone)
    table.recompute(capacity, 1e-3)
    left = [route for route, g in zip(routes, gone, strict=True) if not g]
    expected = max_min_rates(*_csr(left), capacity).rates
    assert table.rate == pytest.approx(expected, rel=1e-9)
    usage = np.zeros(n_links)
    for rate, route in zip(expected, left, strict=True):
        usage[route] += rate
    assert table.link_rate == pytest.approx(usage, rel=1e-9, abs=1e-6)
