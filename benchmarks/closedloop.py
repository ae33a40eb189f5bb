"""Benchmark: the controller on the flow-level simulator (issue 11, deliverable 2).

    .venv/bin/python benchmarks/closedloop.py --quick        # AllToAll only (~1 min on 2 shared cores)
    .venv/bin/python benchmarks/closedloop.py                # + AllGather (~3 min)
    .venv/bin/python benchmarks/closedloop.py --hosts 16 --evaluator fluid   # 128 GPUs, per-path rate model
    .venv/bin/python benchmarks/closedloop.py --predictor sim   # the guard predicts by flow simulation
    .venv/bin/python benchmarks/closedloop.py --hosts 128 --evaluator fluid --collectives alltoall \
        --scenarios fail2 --out benchmarks/results/closedloop1024   # 1024 GPUs (issue 11 deliverable 2)

Every scenario of :mod:`mccl.experiments.loop_scenarios` on ``rail_optimized(1, hosts, 8)``:
the real ScheduleManager (α = 0.1, Γ = 0.2, α_level = 1) behind virtual executors with 5 %
log-normal noise; synthesis delays the swap by its measured wall time. Prints detection
time, synthesis time, time to the first collective on the new schedule, swaps (and the
bar's expectation), median algbw before / during / after; writes a CSV and one timeline
PNG per scenario under ``--out``.

``--evaluator fluid`` evaluates every collective with the per-path rate model of
:mod:`mccl.experiments.closedloop_fluid` instead of the flow-level simulator (needed at 128+
GPUs: one flow-simulated 128-GPU collective costs ~25 s CPU). ``--predictor sim`` gives the
manager's never-worse guard a flow-simulation predictor (default: its α-β model). The guard's
decisions (which schedule won, predicted speedups) are printed and written to the CSV.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.experiments.loop_scenarios import (  # noqa: E402
    EXPECTED_SWAPS,
    LOOP_SCENARIOS,
    run_scenario,
    simulated_predictor,
)
from mccl.experiments.plotting import plot_report  # noqa: E402
from mccl.experiments.report import ScenarioReport  # noqa: E402


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1e3:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="AllToAll only")
    parser.add_argument("--hosts", type=int, default=2, help="rail_optimized(1, HOSTS, 8)")
    parser.add_argument("--scenarios", default=",".join(LOOP_SCENARIOS))
    parser.add_argument("--collectives", default=None, help="allgather,alltoall (default both; --quick: alltoall)")
    parser.add_argument("--healthy", type=int, default=12)
    parser.add_argument("--persist", type=int, default=20)
    parser.add_argument("--after", type=int, default=20)
    parser.add_argument("--evaluator", choices=("flow", "fluid"), default="flow")
    parser.add_argument("--predictor", choices=("alpha-beta", "sim"), default="alpha-beta")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/closedloop"))
    args = parser.parse_args()
    kinds = (args.collectives or ("alltoall" if args.quick else "allgather,alltoall")).split(",")
    console = Console()
    table = Table(title=f"closed loop on rail_optimized(1,{args.hosts},8) (flow-level simulator, real controller)")
    for column in ("scenario", "collective", "swaps (bar)", "detect ms (coll.)", "synth ms", "first new ms",
                   "clear: detect ms", "clear: synth ms", "clear: first new ms", "algbw before/during/after GB/s",
                   "ok", "guard", "wall s", "cpu s"):
        table.add_column(column)
    rows = []
    for name in args.scenarios.split(","):
        for kind in kinds:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                outcome = run_scenario(name, kind, hosts=args.hosts, healthy=args.healthy, persist=args.persist,
                                       after=args.after, evaluator=args.evaluator,
                                       predict=simulated_predictor() if args.predictor == "sim" else None)
            except ValueError as error:  # e.g. no link off the cut has slack to lose
                table.add_row(name, kind, "n/a", str(error), *["-"] * 10)
                continue
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            outcome.loop.check()  # raises when a collective was lost, run twice or on the wrong version
            start, clear = outcome.phases
            algbw = outcome.algbw_windows()
            ok = outcome.swaps == EXPECTED_SWAPS[name]
            guard = "; ".join(f"{d.chosen} ({' '.join(f'{k[0]}={v * 1e3:.2f}ms' for k, v in d.predicted_s.items())})"
                              for d in outcome.guard) or "-"
            table.add_row(name, kind, f"{outcome.swaps} ({EXPECTED_SWAPS[name]})",
                          f"{_ms(start.detection_s)} ({start.detection_collectives})", _ms(start.synthesis_s),
                          _ms(start.first_new_s), _ms(clear.detection_s), _ms(clear.synthesis_s),
                          _ms(clear.first_new_s), " / ".join(f"{v:.1f}" for v in algbw), "yes" if ok else "NO",
                          guard, f"{wall:.1f}", f"{cpu:.1f}")
            rows.append({"scenario": name, "collective": kind, "gpus": outcome.n_gpus, "swaps": outcome.swaps,
                         "expected_swaps": EXPECTED_SWAPS[name], "collectives": len(outcome.loop.runs),
                         "detect_s": start.detection_s, "detect_collectives": start.detection_collectives,
                         "synth_s": start.synthesis_s, "first_new_s": start.first_new_s,
                         "clear_detect_s": clear.detection_s, "clear_synth_s": clear.synthesis_s,
                         "clear_first_new_s": clear.first_new_s, "algbw_before": algbw[0],
                         "algbw_during": algbw[1], "algbw_after": algbw[2], "wall_s": wall, "cpu_s": cpu,
                         "evaluator": args.evaluator, "predictor": args.predictor, "guard": guard})
            console.print(f"{name} {kind}: swaps {outcome.swaps} (bar {EXPECTED_SWAPS[name]}), detect "
                          f"{_ms(start.detection_s)} ms, synth {_ms(start.synthesis_s)} ms, first new "
                          f"{_ms(start.first_new_s)} ms; clear {_ms(clear.detection_s)} / {_ms(clear.synthesis_s)} / "
                          f"{_ms(clear.first_new_s)} ms; algbw {' / '.join(f'{v:.1f}' for v in algbw)}; guard {guard}; "
                          f"cpu {cpu:.1f} s")  # as it goes: a long run keeps what it finished
            write_csv(args.out / f"closedloop-{8 * args.hosts}gpu-{args.evaluator}-{'-'.join(kinds)}.csv", rows)
            timeline, events = outcome.timeline()
            report = ScenarioReport(f"loop-{name}-{kind}-{outcome.n_gpus}gpu-{args.evaluator}",
                                    f"closed loop ({args.evaluator}), {name}, {kind}, rail_optimized(1,{args.hosts},8): "
                                    "algbw per collective",
                                    (), timeline, tuple(sorted(set(events))))
            plot_report(report, args.out)
    console.print(table)
    write_csv(args.out / f"closedloop-{8 * args.hosts}gpu-{args.evaluator}-{'-'.join(kinds)}.csv", rows)
    console.print(f"CSV and PNGs: {args.out}")


if __name__ == "__main__":
    main()
