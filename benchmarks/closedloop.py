"""Benchmark: the controller on the flow-level simulator (issue 11, deliverable 2).

    .venv/bin/python benchmarks/closedloop.py --quick        # AllToAll only (~1 min on 2 shared cores)
    .venv/bin/python benchmarks/closedloop.py                # + AllGather (~3 min)
    .venv/bin/python benchmarks/closedloop.py --hosts 16 --evaluator fluid   # 128 GPUs, per-path rate model
    .venv/bin/python benchmarks/closedloop.py --predictor alpha-beta   # the guard predicts by α-β on the flow sim
    .venv/bin/python benchmarks/closedloop.py --delay 0 --seeds 0,1,2 --healthy 10 --persist 14 --after 14
        # the bars table of issue 11 (the tests' setting), 16 GPUs, three noise seeds
    .venv/bin/python benchmarks/closedloop.py --delay 0 --seeds 0,1,2 --healthy 10 --persist 14 --after 14 \
        --absolute-rates both --truth      # issue 11's Fail1 tie: the saturated reading off and on, same run
    .venv/bin/python benchmarks/closedloop.py --controller-cpu   # 8-GPU CPU per flagged collective, with the check
    .venv/bin/python benchmarks/closedloop.py --hosts 128 --evaluator fluid --collectives alltoall \
        --scenarios fail2 --out benchmarks/results/closedloop1024   # 1024 GPUs (issue 11 deliverable 2)

Every scenario of :mod:`mccl.experiments.loop_scenarios` on ``rail_optimized(1, hosts, 8)``:
the real ScheduleManager (α = 0.1, Γ = 0.2, α_level = 1) behind virtual executors with 5 %
log-normal noise; synthesis delays the swap by its measured wall time. Prints detection
time, synthesis time, time to the first collective on the new schedule, swaps (and the
bar's expectation), median algbw before / during / after; writes a CSV and one timeline
PNG per scenario under ``--out``.

``--controller-cpu`` (no loop): the 8-GPU bar "controller CPU per flagged collective ≤ 25 ms" with
the guard's explanation check running — ``benchmarks/control.py``'s chain (healthy → Fail2 →
healthy → Fail2, warm) whose telemetry also carries every rank's collective time (α-β of the active
schedule on the true fabric, so the measured fabric explains it), against the same chain without
collective times, in the same run; medians of ``--repeats``.

``--evaluator fluid`` evaluates every collective with the per-path rate model of
:mod:`mccl.experiments.closedloop_fluid` instead of the flow-level simulator (needed at 128+
GPUs: one flow-simulated 128-GPU collective costs ~25 s CPU). ``--predictor`` is the manager's
never-worse guard's predictor: by default the evaluator's own model (flow simulation for "flow",
α-β for "fluid"; why: :func:`mccl.experiments.loop_scenarios.run_scenario`). ``--delay 0`` runs the
tests' reproducible setting (no synthesis delay, no extra compute gap); ``--seeds 0,1,2`` repeats each
scenario with other telemetry noise. The guard's
decisions (which schedule won, predicted speedups) are printed and written to the CSV.

``--absolute-rates on|off|both``: the controller's ``absolute_rates`` (the link that slowed a collective read
at its traffic before a re-synthesis, :mod:`mccl.control.saturation`); on is the scenarios' default since the
seventh session (``DEFAULT_CONFIG``); both runs every row twice, off then on. ``--truth``: for the first swap
issued during the change, one collective of the version it replaced and of the version it issued on the
*true* faulted fabric, by the evaluator's own model (``LoopOutcome.first_swap_on_truth``): the "never worse
than what it replaces" figure (active / issued > 1: the swap won).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.control.guard import AlphaBeta  # noqa: E402
from mccl.experiments.closedloop_sim import TelemetryModel  # noqa: E402
from mccl.experiments.loop_scenarios import (  # noqa: E402
    DEFAULT_CONFIG,
    EXPECTED_SWAPS,
    LOOP_SCENARIOS,
    run_scenario,
    simulated_predictor,
)
from mccl.experiments.plotting import plot_report  # noqa: E402
from mccl.experiments.report import ScenarioReport  # noqa: E402


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1e3:.1f}"


def _predictor(name: str, evaluator: str) -> object:
    """The guard's predictor for ``--predictor`` (None: the manager's α-β default, or run_scenario's choice)."""
    if name == "sim":
        return simulated_predictor()
    if name == "alpha-beta" and evaluator == "flow":
        return AlphaBeta()
    return None


def controller_cpu_with_check(repeats: int) -> list[dict]:
    """See the module docstring (``--controller-cpu``). Swaps ``control.FabricTelemetry`` for a subclass
    that appends the ranks' ``"collective"`` samples, so ``control.Chain`` runs unchanged."""
    import control  # benchmarks/control.py

    from mccl.control.guard import alpha_beta_seconds
    from mccl.telemetry import COLLECTIVE, Sample

    plain = control.FabricTelemetry
    size = float(2**30)  # the guard's default size: the chain registers none

    class TimedTelemetry(plain):  # type: ignore[misc, valid-type]
        def __init__(self, topology, schedule, *args, **kwargs) -> None:
            super().__init__(topology, schedule, *args, **kwargs)
            self.schedule, self.truth = schedule, topology

        def set_truth(self, truth) -> None:
            super().set_truth(truth)
            self.truth = truth

        def round(self, seq: int, seconds: float = 0.01) -> list:
            took = alpha_beta_seconds(self.schedule, self.truth, size)
            return super().round(seq, seconds) + [Sample(COLLECTIVE, self.communicator, rank, -1, int(size), took, 0.0,
                                                         seq) for rank in range(self.schedule.n_ranks)]

    control._warm_up()
    topology = control.fabric(8)
    rows = []
    for collective in ("allgather", "alltoall"):
        synthesized = control.optimize(topology, collective).with_version(1)
        for label, telemetry in (("without collective times", plain), ("with the check", TimedTelemetry)):
            control.FabricTelemetry = telemetry
            try:
                steps = []
                for _ in range(repeats):  # healthy v1 -> Fail2: one flagged collective, warm synthesis
                    chain = control.Chain(topology, collective, synthesized.schedule, result=synthesized)
                    steps.append(chain.phase(control.fail2(topology)))
                    decision = chain.manager.guard.decisions[-1]
            finally:
                control.FabricTelemetry = plain
            row = {"collective": collective, "telemetry": label, "repeats": repeats, "path": steps[-1]["path"],
                   "explained": decision.explained, "trusted": decision.trusted}
            for key in ("ingest_cpu_s", "check_cpu_s", "synth_cpu_s", "dispatch_cpu_s", "total_cpu_s"):
                row[key] = statistics.median(step[key] for step in steps)
            rows.append(row)
            print(f"8 GPUs {collective} -> Fail2, {label}: total {row['total_cpu_s'] * 1e3:.2f} ms CPU (ingest "
                  f"{row['ingest_cpu_s'] * 1e3:.2f}, check {row['check_cpu_s'] * 1e3:.2f}, synthesis "
                  f"{row['synth_cpu_s'] * 1e3:.2f}, dispatch incl. guard {row['dispatch_cpu_s'] * 1e3:.2f}); "
                  f"explained {decision.explained:.3f}, median of {repeats}", flush=True)
    return rows


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
    parser.add_argument("--predictor", choices=("auto", "alpha-beta", "sim"), default="auto",
                        help="the guard's predictor (auto: the evaluator's own model — sim for flow, α-β for fluid)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/closedloop"))
    parser.add_argument("--delay", type=float, default=None,
                        help="simulated synthesis delay s and least compute gap (the tests' setting: 0; default: "
                             "the measured synthesis wall time, and a cold synthesis as the gap)")
    parser.add_argument("--seeds", default="0", help="telemetry noise seeds, e.g. 0,1,2 (one run per seed)")
    parser.add_argument("--no-collective-times", action="store_true",
                        help="ranks report no collective times: the guard's explanation check is skipped (before)")
    parser.add_argument("--controller-cpu", action="store_true", help="the 8-GPU CPU bar with the guard's check")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--absolute-rates", choices=("on", "off", "both"), default="on",
                        help="the controller's saturated reading (mccl.control.saturation); both: off, then on")
    parser.add_argument("--truth", action="store_true",
                        help="the first swap's replaced / issued version timed on the true faulted fabric")
    args = parser.parse_args()
    if args.controller_cpu:
        write_csv(args.out / "controller-cpu-8gpu-check.csv", controller_cpu_with_check(args.repeats))
        return
    kinds = (args.collectives or ("alltoall" if args.quick else "allgather,alltoall")).split(",")
    console = Console()
    table = Table(title=f"closed loop on rail_optimized(1,{args.hosts},8) (flow-level simulator, real controller)")
    for column in ("scenario", "collective", "absolute", "swaps (bar)", "detect ms (coll.)", "synth ms", "first new ms",
                   "clear: detect ms", "clear: synth ms", "clear: first new ms", "algbw before/during/after GB/s",
                   "ok", "guard", "wall s", "cpu s"):
        table.add_column(column)
    rows = []
    tag = ("-" + args.predictor if args.predictor != "auto" else "") + ("-nocheck" if args.no_collective_times else "")
    absolute = {"on": (True,), "off": (False,), "both": (False, True)}[args.absolute_rates]
    tag += "" if args.absolute_rates == "on" else f"-absolute-{args.absolute_rates}"
    runs = [(name, kind, int(seed), on) for name in args.scenarios.split(",") for kind in kinds
            for seed in args.seeds.split(",") for on in absolute]
    for name, kind, seed, on in runs:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            outcome = run_scenario(name, kind, hosts=args.hosts, healthy=args.healthy, persist=args.persist,
                                   after=args.after, evaluator=args.evaluator, model=TelemetryModel(seed=seed, collective_times=not args.no_collective_times),
                                   synthesis_delay_s=args.delay, min_gap_s=args.delay,
                                   predict=_predictor(args.predictor, args.evaluator),
                                   config=dataclasses.replace(DEFAULT_CONFIG, absolute_rates=on))
        except ValueError as error:  # e.g. no link off the cut has slack to lose
            table.add_row(name, kind, "on" if on else "off", "n/a", str(error), *["-"] * 10)
            continue
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        truth = outcome.first_swap_on_truth() if args.truth else None
        truth_text = "" if truth is None else (f"; first swap on the true fabric: replaced {truth[0] * 1e3:.3f} ms / "
                                               f"issued {truth[1] * 1e3:.3f} ms = {truth[0] / truth[1]:.3f}x")
        outcome.loop.check()  # raises when a collective was lost, run twice or on the wrong version
        start, clear = outcome.phases
        algbw = outcome.algbw_windows()
        ok = outcome.swaps == EXPECTED_SWAPS[name]
        guard = "; ".join(f"{d.chosen} ({' '.join(f'{k[0]}={v * 1e3:.2f}ms' for k, v in d.predicted_s.items())})"
                          for d in outcome.guard) or "-"
        table.add_row(name, kind, "on" if on else "off", f"{outcome.swaps} ({EXPECTED_SWAPS[name]})",
                      f"{_ms(start.detection_s)} ({start.detection_collectives})", _ms(start.synthesis_s),
                      _ms(start.first_new_s), _ms(clear.detection_s), _ms(clear.synthesis_s),
                      _ms(clear.first_new_s), " / ".join(f"{v:.1f}" for v in algbw), "yes" if ok else "NO",
                      guard, f"{wall:.1f}", f"{cpu:.1f}")
        trusted = "/".join("yes" if d.trusted else f"no ({d.explained:.2f})" for d in outcome.guard) or "-"
        rows.append({"scenario": name, "collective": kind, "seed": seed, "absolute_rates": on, "gpus": outcome.n_gpus,
                     "truth_replaced_s": truth[0] if truth else math.nan,
                     "truth_issued_s": truth[1] if truth else math.nan,
                     "swaps": outcome.swaps, "trusted": trusted,
                     "expected_swaps": EXPECTED_SWAPS[name], "collectives": len(outcome.loop.runs),
                     "detect_s": start.detection_s, "detect_collectives": start.detection_collectives,
                     "synth_s": start.synthesis_s, "first_new_s": start.first_new_s,
                     "clear_detect_s": clear.detection_s, "clear_synth_s": clear.synthesis_s,
                     "clear_first_new_s": clear.first_new_s, "algbw_before": algbw[0],
                     "algbw_during": algbw[1], "algbw_after": algbw[2], "wall_s": wall, "cpu_s": cpu,
                     "evaluator": args.evaluator, "predictor": args.predictor, "guard": guard})
        console.print(f"{name} {kind} seed {seed} absolute {'on' if on else 'off'}: trusted {trusted}; swaps {outcome.swaps} (bar {EXPECTED_SWAPS[name]}), detect "
                      f"{_ms(start.detection_s)} ms, synth {_ms(start.synthesis_s)} ms, first new "
                      f"{_ms(start.first_new_s)} ms; clear {_ms(clear.detection_s)} / {_ms(clear.synthesis_s)} / "
                      f"{_ms(clear.first_new_s)} ms; algbw {' / '.join(f'{v:.1f}' for v in algbw)}; guard {guard}; "
                      f"cpu {cpu:.1f} s{truth_text}")  # as it goes: a long run keeps what it finished
        write_csv(args.out / f"closedloop-{8 * args.hosts}gpu-{args.evaluator}-{'-'.join(kinds)}{tag}.csv", rows)
        timeline, events = outcome.timeline()
        report = ScenarioReport(f"loop-{name}-{kind}-{outcome.n_gpus}gpu-{args.evaluator}{tag}"
                                f"{'' if args.absolute_rates != 'both' else '-on' if on else '-off'}",
                                f"closed loop ({args.evaluator}), {name}, {kind}, rail_optimized(1,{args.hosts},8): "
                                "algbw per collective",
                                (), timeline, tuple(sorted(set(events))))
        plot_report(report, args.out)
    console.print(table)
    write_csv(args.out / f"closedloop-{8 * args.hosts}gpu-{args.evaluator}-{'-'.join(kinds)}{tag}.csv", rows)
    console.print(f"CSV and PNGs: {args.out}")


if __name__ == "__main__":
    main()
