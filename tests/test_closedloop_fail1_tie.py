"""Issue 11, never worse than what it replaces: Fail1 AllGather's first swap on the flow loop.

The tree packing runs at ~0.49 of its bound in the flow simulator, so GPU 0's NVLink (true 800 Gbit/s
under Fail1) read ~1630 by the scale-free attribution and the re-synthesis was a predicted tie that ran
0.94-0.98x the version it replaced on the true fabric (seed 2: 0.936x). With the saturated reading
(mccl.control.saturation) that link is read at its traffic now (~807) and the first swap wins."""

from __future__ import annotations

import dataclasses

import pytest

from mccl.experiments.closedloop_sim import TelemetryModel
from mccl.experiments.loop_scenarios import DEFAULT_CONFIG, run_scenario


@pytest.mark.slow  # one short flow-simulated loop with flow-simulated guard predictions
def test_fail1_allgathers_first_swap_is_faster_on_the_true_fabric() -> None:
    outcome = run_scenario("fail1", "allgather", healthy=10, persist=6, after=0, synthesis_delay_s=0.0, min_gap_s=0.0,
                           model=TelemetryModel(seed=2), config=dataclasses.replace(DEFAULT_CONFIG, absolute_rates=True))
    outcome.loop.check()
    truth = outcome.first_swap_on_truth()
    assert truth is not None, [(d.chosen, d.explained) for d in outcome.guard]
    replaced_s, issued_s = truth
    assert replaced_s > 1.05 * issued_s, f"the first swap runs {replaced_s / issued_s:.3f}x the version it replaced"
    first = outcome.guard[0]
    assert first.trusted and abs(first.explained - 1.0) < 0.05  # the fabric it was made for explains the slowdown



@pytest.mark.slow  # the same short loop, two seeds (~10 s each at load 15)
@pytest.mark.parametrize("seed", [1, 11])
def test_fail1_allgathers_seeds_that_kept_v0_now_swap_and_win(seed: int) -> None:
    """Seeds 1 and 11 made no swap in the whole fault (eighth session). Seed 11's flag came at a check where the
    scale-free fabric explained the slowdown at r 0.796, outside Γ, so the reading of GPU 0's NVLink at its traffic
    (r 1.000: the link busy the whole collective) was dropped; the schedule made for the scale-free fabric ran slower
    on the true one and the guard kept v0. Seed 1's flag took a speculation made at such a check (the link read at
    1444 Gbit/s, 778 at the flag; true 800), the guard rightly predicted it slower, and the flag ended there. An exact
    reading is now adopted on its own (mccl.control.saturation.adopted) and a speculation made for a shallower
    fault that the guard does not choose is followed by the flag's own synthesis (mccl.control.manager_guard)."""
    outcome = run_scenario("fail1", "allgather", healthy=10, persist=6, after=0, synthesis_delay_s=0.0, min_gap_s=0.0,
                           model=TelemetryModel(seed=seed), config=dataclasses.replace(DEFAULT_CONFIG, absolute_rates=True))
    outcome.loop.check()
    truth = outcome.first_swap_on_truth()
    assert truth is not None, [(d.chosen, d.explained) for d in outcome.guard]
    replaced_s, issued_s = truth
    assert replaced_s > 1.05 * issued_s, f"the first swap runs {replaced_s / issued_s:.3f}x the version it replaced"
    issued = outcome.guard[-1]
    assert issued.chosen == "candidate" and issued.trusted and abs(issued.explained - 1.0) < 0.05
