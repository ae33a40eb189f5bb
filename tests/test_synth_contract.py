"""The contract every registered synthesizer keeps, checked over every builder and random small fabrics.

For each method of :data:`mccl.synth.METHODS` and each collective it makes: either a result whose
schedule passes ``validate`` and whose figures are consistent (achieved ≤ bound, gap = 1 − achieved /
bound, the method's name and options recorded), within an *independent* bound (the AllGather cut
bound by max-flow, on the reversed fabric for ReduceScatter; the arc-based compact LP for AllToAll;
for AllReduce the AllGather cut bound, which every AllReduce also obeys: a cut must carry a whole
buffer of partial sums into its side), or a clear :class:`~mccl.errors.MCCLError` — never another
exception. Optimal methods must reach the independent bound exactly (their LP / fractional optimum).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import BUILDER_CASES, small_topologies
from mccl.errors import InvalidOptions, MCCLError, SynthesisUnavailable
from mccl.schedule import Collective, validate
from mccl.synth import METHODS, SynthesisResult, allgather_cut_bound, methods_for, optimize
from mccl.synth.alltoall import compact_lp
from mccl.synth.treepack import reversed_topology
from mccl.topology import Topology

PAIRS = [(name, collective) for name, method in METHODS.items() for collective in method.collectives]
_TOLERANCE = 1e-6


def _independent_bound(topology: Topology, collective: Collective) -> float:
    if collective is Collective.ALLTOALL:
        return compact_lp(topology).algbw_gbs
    if collective is Collective.REDUCESCATTER:
        return allgather_cut_bound(reversed_topology(topology)).algbw_gbs
    return allgather_cut_bound(topology).algbw_gbs  # AllGather; AllReduce (see the module docstring)


def _check(result: SynthesisResult, topology: Topology, name: str, collective: Collective) -> None:
    validate(result.schedule, topology)
    assert result.method == name and result.schedule.collective is collective
    assert result.achieved_gbs == pytest.approx(result.schedule.meta.achieved_gbs, rel=1e-12)
    bound = _independent_bound(topology, collective)
    assert result.achieved_gbs <= bound * (1 + _TOLERANCE)
    if result.bound_gbs is not None:
        assert result.achieved_gbs <= result.bound_gbs * (1 + _TOLERANCE)
        assert result.gap == pytest.approx(max(0.0, 1 - result.achieved_gbs / result.bound_gbs), abs=1e-12)
    if METHODS[name].optimal:
        assert result.optimal and result.bound_gbs == pytest.approx(bound, rel=_TOLERANCE)
    else:
        assert result.bound_gbs is None and result.gap is None and not result.optimal


@pytest.mark.parametrize("topology", BUILDER_CASES, ids=lambda topology: topology.name)
@pytest.mark.parametrize(("name", "collective"), PAIRS, ids=[f"{name}-{kind.value}" for name, kind in PAIRS])
def test_every_method_on_every_builder(name: str, collective: Collective, topology: Topology) -> None:
    try:
        result = optimize(topology, collective, method=name)
    except MCCLError as error:
        assert not METHODS[name].optimal, f"an optimal method refused a builder's fabric: {error}"
        return
    _check(result, topology, name, collective)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=small_topologies(), pair=st.sampled_from(PAIRS))
def test_every_method_on_random_small_fabrics(topology: Topology, pair: tuple[str, Collective]) -> None:
    name, collective = pair
    try:
        result = optimize(topology, collective, method=name)
    except MCCLError:
        return  # e.g. a ring needs switch-only routes between neighbours; the message names the hop
    _check(result, topology, name, collective)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_warm_methods_accept_their_own_result_and_a_bare_schedule(name: str, hpn: Topology) -> None:
    """``previous`` may be a result (solver state) or its schedule (from a file); a method that does not
    warm-start ignores it. Both give a valid schedule with the same bound."""
    collective = METHODS[name].collectives[0]
    first = optimize(hpn, collective, method=name)
    again = optimize(hpn, collective, method=name, previous=first)
    from_schedule = optimize(hpn, collective, method=name, previous=first.schedule)
    for result in (again, from_schedule):
        validate(result.schedule, hpn)
        if first.bound_gbs is None:
            assert result.bound_gbs is None  # a baseline proves nothing, warm or not
        else:
            assert result.bound_gbs == pytest.approx(first.bound_gbs, rel=1e-9)


def test_unknown_methods_and_options_are_typed_errors(hpn: Topology) -> None:
    with pytest.raises(SynthesisUnavailable) as caught:
        optimize(hpn, "alltoall", method="treepack")
    assert caught.value.collective == "alltoall" and "alltoall.cg" in caught.value.available
    with pytest.raises(InvalidOptions) as wrong:
        optimize(hpn, "allgather", time_limit_s=1)
    assert wrong.value.method == "treepack" and wrong.value.option == "time_limit_s"
    with pytest.raises(InvalidOptions, match="expected TreePackOptions"):
        optimize(hpn, "allgather", options=METHODS["alltoall.cg"].options())
    assert set(methods_for("allreduce")) == {"allreduce.composed", "ring.naive", "ring.nccl", "ring.locality"}
