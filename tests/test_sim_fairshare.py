"""Max-min fair sharing on hand-computed cases and against a one-level-at-a-time reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mccl.sim.fairshare import max_min_rates


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


def _full_solve(table, capacity):
    """The rates of a from-scratch weighted max-min solve of the table's live flows."""
    live = table.live()
    routes = [table.route[s, :table.length[s]].tolist() for s in live]
    hop = table.hop[live]
    oldest = np.append(table.h_oldest, 0)  # hop -1 reads the appended 0; its gap is 0 anyway
    gap = np.where(hop >= 0, table.step[live] - oldest[hop], 0)
    weights = table.wtab[np.minimum(gap, 4)]
    return live, max_min_rates(*_csr(routes), capacity, weights=weights).rates, routes


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_incremental_recompute_matches_a_full_solve(data):
    """FlowTable re-solves only the flows an event can reach (mccl.sim.kernels); after every
    event — flows starting and finishing, steps of one hop, a capacity change — its rates
    must equal a from-scratch weighted max-min solve, and its link loads their sums."""
    from mccl.sim.flows import FlowTable

    n_links = data.draw(st.integers(2, 8))
    capacity = np.array(data.draw(st.lists(st.floats(1.0, 100.0), min_size=n_links, max_size=n_links)))
    priority = data.draw(st.sampled_from([1.0, 10.0, 1e3]))
    table = FlowTable(n_links, step_priority=priority)
    route = st.lists(st.integers(0, n_links - 1), min_size=1, max_size=3, unique=True)
    for event in range(data.draw(st.integers(1, 12))):
        kind = data.draw(st.sampled_from(["add", "add", "remove", "capacity"]))
        if kind == "add":
            routes = data.draw(st.lists(route, min_size=1, max_size=6))
            offsets, links = _csr(routes)
            count = len(routes)
            hops = np.array(data.draw(st.lists(st.integers(-1, 2), min_size=count, max_size=count)))
            steps = np.array(data.draw(st.lists(st.integers(0, 5), min_size=count, max_size=count)))
            table.add(0, np.arange(count), np.full(count, 1e6), np.diff(offsets), links, np.full(count, -1),
                      steps, hops, float(event))
        elif kind == "remove" and len(table):
            live = table.live()
            gone = data.draw(st.lists(st.sampled_from(live.tolist()), min_size=1, max_size=len(live), unique=True))
            table.remove(np.array(gone))
        else:
            link = data.draw(st.integers(0, n_links - 1))
            capacity = capacity.copy()
            capacity[link] = data.draw(st.floats(0.5, 100.0))
            table.touch_links((link,))
        table.recompute(capacity, float(event))
        live, expected, routes = _full_solve(table, capacity)
        assert table.rate[live] == pytest.approx(expected, rel=1e-7, abs=1e-9)
        usage = np.zeros(n_links)
        for rate, links in zip(expected, routes, strict=True):
            usage[links] += rate
        assert table.link_rate == pytest.approx(usage, rel=1e-7, abs=1e-6)
        assert np.all(table.link_rate <= capacity * (1 + 1e-9))
