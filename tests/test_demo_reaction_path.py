"""The one demo driver's configuration, and Fig. 13(b) computed from a run's marks (no processes)."""

from __future__ import annotations

import pytest

from mccl.errors import MCCLError
from mccl.experiments.demo import DemoConfig
from mccl.experiments.netemu.report import CollectiveRecord, NetemuReport
from mccl.experiments.reaction_path import reaction_path


def _report(trace: dict, telemetry: dict | None = None) -> NetemuReport:
    starts = {1: 100.0, 2: 101.0, 3: 101.97, 4: 102.030, 5: 102.06}
    records = tuple(CollectiveRecord("allgather", seq, 1 if seq < 4 else 2, start, 0.02, 0.01,
                                     "healthy" if seq < 2 else "degraded", True) for seq, start in starts.items())
    return NetemuReport(config={}, records=records, events=(), degraded_at=100.5, restored_at=None, tc_s=(0.0, 0.0),
                        swaps=(), predicted_v1={}, scale=1.0, goodput=1.0, nic_mbit=1.0, wall_s=1.0, teardown_s=0.0,
                        communicators={"allgather": "ag"}, telemetry=telemetry or {}, trace=trace)


def _trace(ranks: int = 2) -> dict:
    """Flag at 102.000; issued 102.004; encoded .005, pushed .006; ranks have it at .007/.008; rounds start there
    and agree after 10/12 ms (OOB 3/4 ms); both launch v2 (seq 4) at 102.030/102.031."""
    return {
        "reactions": [{"communicator": "ag", "collective": "allgather", "version": 1, "evidence_at": 101.990,
                       "flagged_at": 102.000, "synth_start": 102.001, "synth_end": 102.0012, "ahead": True,
                       "ahead_synth_s": 0.02, "guard_s": 0.0005, "issued_at": 102.004, "issued_version": 2,
                       "outcome": "issued"}],
        "deliveries": [{"communicator": "ag", "collective": "allgather", "version": 2, "encoded_at": 102.005,
                        "pushed_at": 102.006, "pushed_to": 2}],
        "received": [[("allgather", 2, 102.007)], [("allgather", 2, 102.008)]][:ranks],
        "swaps": [{"allgather": [(3, 2, 0.001, 0.005, 0.003, 0.010, 102.007)]},
                  {"allgather": [(3, 2, 0.001, 0.004, 0.004, 0.012, 102.008)]}][:ranks],
        "switches": [{"allgather": [(4, 102.030, {"allgather": 2})]},
                     {"allgather": [(4, 102.031, {"allgather": 2})]}][:ranks],
        "prestage_hits": [{"allgather": 1}, {"allgather": 0}][:ranks],
        # rank 0 held its launch of seq 4 for 15 ms during the round; a hold before the flag is another round's
        "holds": [{"allgather": [(2, 101.5, 0.040), (4, 102.010, 0.015)]}, {"allgather": []}][:ranks],
    }


def test_the_reaction_path_is_split_into_fig13b_terms_from_every_ranks_marks():
    path = reaction_path(_report(_trace()), "allgather")
    assert path["version"] == 2 and path["ahead"] is True and path["prestaged"] == 1
    expected = {"decision": 10.0, "synthesis": 0.2, "guard": 0.5, "issue": 4.0, "encode": 1.0, "push": 1.0,
                "dispatch": 4.0, "swap": 12.0, "stage": 1.0, "ready": 5.0, "oob": 4.0, "activation": 20.0, "in_flight": 11.0,
                "detect_to_first": 31.0, "first_done": 50.0, "detection": 1500.0, "hold": 15.0}
    for term, value in expected.items():
        assert path[term] == pytest.approx(value, abs=1e-6), term


def test_a_rank_without_its_mark_leaves_the_term_open_rather_than_guessing():
    trace = _trace()
    trace["switches"][1] = {}  # rank 1 never launched on the new version
    path = reaction_path(_report(trace), "allgather")
    assert path["in_flight"] is None and path["detect_to_first"] is None and path["activation"] == pytest.approx(20.0)
    trace["reactions"][0]["outcome"] = "kept"  # nothing issued: no path at all
    assert reaction_path(_report(trace), "allgather")["version"] is None


def test_one_config_for_both_fabrics_refuses_what_cannot_run():
    pacer = DemoConfig.pacer(8)
    assert (pacer.fabric, pacer.ranks, pacer.kinds, pacer.max_recovered) == ("pacer", 8, ("allgather",), 0)
    assert DemoConfig().fabric == "netemu" and DemoConfig().ranks == 8
    with pytest.raises(MCCLError, match="4 or 8 ranks"):
        DemoConfig.pacer(6)
    for bad, match in (({"fabric": "loopback"}, "fabric"), ({"fault_factor": 0.0}, "fault_factor"),
                       ({"kinds": ("allreduce",)}, "streams"), ({"hosts": 1}, "hosts")):
        with pytest.raises(MCCLError, match=match):
            DemoConfig(**bad).check()


def test_the_ranks_cpu_in_the_path_and_who_got_the_version_by_digest():
    trace = _trace()
    trace["swaps"] = [{"allgather": [(3, 2, 0.001, 0.005, 0.003, 0.010, 102.007, 0.0012)]},
                      {"allgather": [(3, 2, 0.001, 0.004, 0.004, 0.012, 102.008, 0.0021)]}]
    trace["take_cpu"] = [[("allgather", 2, 0.00005, True), ("allgather", 1, 0.9, False)],
                         [("allgather", 2, 0.0004, False)]]
    path = reaction_path(_report(trace), "allgather")
    assert path["swap_cpu"] == pytest.approx(2.1) and path["receive_cpu"] == pytest.approx(0.4)
    assert path["activations"] == 1  # rank 0 by an ``activate`` frame, rank 1 the whole schedule
    old = reaction_path(_report(_trace()), "allgather")  # a trace without them (earlier runs' dumps)
    assert old["swap_cpu"] is None and old["receive_cpu"] is None and old["activations"] is None


def test_a_swap_priority_that_is_no_number_of_steps_is_refused_by_name():
    for bad in (-1, 40, 2.5):
        with pytest.raises(MCCLError, match="swap_priority"):
            DemoConfig(swap_priority=bad).check()
    DemoConfig(swap_priority=10).check()


def _samples(ends: dict[int, list[float]], seq: int = 3) -> dict[int, list[tuple]]:
    """Each rank's telemetry samples of collective ``seq`` ending at ``ends[rank]``, and noise that must not count:
    a later collective's sample and another stream's (the ranks' ``(kind, link, rank, bytes, s, end, seq)``)."""
    return {rank: [("allgather", "inter", rank, 4096, 0.001, end, seq) for end in times]
            + [("allgather", "inter", rank, 4096, 0.001, 102.050, seq + 1), ("alltoall", "inter", rank, 4096, 0.001,
                                                                              102.040, seq)]
            for rank, times in ends.items()}


def test_the_wait_after_the_agreement_is_split_into_the_collective_still_running_and_the_gap_between_two():
    # K = 3 (the rounds' switch point); agreed at 102.020, the last rank launched seq 4 at 102.031 (in flight 11 ms)
    still_running = reaction_path(_report(_trace(), _samples({0: [102.015, 102.024], 1: [102.022]})), "allgather")
    assert still_running["running"] == pytest.approx(4.0) and still_running["between"] == pytest.approx(7.0)
    assert still_running["detect_to_ready"] == pytest.approx(24.0) and still_running["in_flight"] == pytest.approx(11.0)
    done_before = reaction_path(_report(_trace(), _samples({0: [102.010], 1: [102.012]})), "allgather")
    assert done_before["running"] == pytest.approx(0.0) and done_before["between"] == pytest.approx(11.0)
    assert done_before["detect_to_ready"] == pytest.approx(done_before["activation"])  # 20 ms: only the reaction's
    assert done_before["detect_to_first"] == pytest.approx(31.0)  # the bar itself is unchanged
    for partial in ({0: [102.010]}, {0: [102.010], 1: []}, {}):  # a rank without a sample of K: left open
        path = reaction_path(_report(_trace(), _samples(partial)), "allgather")
        assert path["running"] is None and path["between"] is None and path["detect_to_ready"] is None
