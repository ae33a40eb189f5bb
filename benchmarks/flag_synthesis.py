"""Benchmark: the AllToAll flag's own synthesis at 8 ranks, warm from the registered schedule's routes
(before) vs from the solver state the controller adopted for it (after) — issue 15, eighth session.

The reaction benchmark's AllToAll set-up (``rail_optimized(1,2,4)``, 2 chunks per block): the ranks register
the schedule they synthesized, without its result, so the first flag's synthesis (and every speculation
before it) started from that schedule's routes. The controller now adopts its own nominal result
(:func:`mccl.control.ahead.warm_synthesis` ``adopt=``) and the registration takes its solver state.

Each trial is one measured fabric as the manager makes it (``min(nominal, …)``: GPU 0's NIC at
``--fault`` × nominal both ways, every other link at a uniform random 0.9–1.0 × nominal, the noise of the
EWMA's readings); both sides run on it, interleaved, in this process: ``optimize(measured, previous=…)``
and ``prepare_update`` (what the reaction's ``synthesis_cpu_ms`` counts). Reported: the CPU time of
each (``time.thread_time``, medians), the per-stage CPU (cProfile timed by ``thread_time``) over all trials (profiled runs,
so slower than unprofiled), the LP optimum and the rounded algbw of each side (every schedule
validated).

    PYTHONPATH=src:benchmarks python benchmarks/flag_synthesis.py --trials 20
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from pathlib import Path

import numpy as np
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.control import ControlConfig, ScheduleManager
from mccl.control.ahead import warm_synthesis
from mccl.control.prepared import prepare_update
from mccl.experiments.demo import synth_options
from mccl.schedule import Collective, validate
from mccl.synth import SynthesisResult, optimize
from mccl.topology import Topology, parse_topology

STAGES = {  # cProfile function name → stage
    "solve": "column generation (solve)",
    "seed_from_schedule": "  seeded from the routes",
    "seed_columns": "  multiplicative-weights columns",
    "run_generation": "  master + pricing rounds",
    "repair": "repair (from the state)",
    "deep_dive": "rounding (deep_dive)",
    "schedule_from_placement": "lowering to the IR",
    "prepare_update": "prepare_update (validation, maps)",
}


def measured(topology: Topology, fault: float, rng: np.random.Generator) -> Topology:
    """GPU 0's NIC at ``fault`` × nominal, every other link 0.9–1.0 × nominal (the manager's capacities never
    exceed nominal, :func:`mccl.control.drift.measured_capacities`)."""
    capacities = topology.capacities_gbps * rng.uniform(0.9, 1.0, len(topology.links))
    for index, link in enumerate(topology.links):
        if (link.src, link.dst) in (("gpu0", "tor0.0"), ("tor0.0", "gpu0")):
            capacities[index] = topology.capacities_gbps[index] * fault
    return topology.with_capacities(capacities, name=f"{topology.name}+measured")


def flag_synthesis(on: Topology, previous: SynthesisResult, registered, options, profile: cProfile.Profile | None
                   ) -> tuple[float, SynthesisResult]:
    """One flag's synthesis and prepared update; (CPU seconds, result)."""
    cpu = time.thread_time()
    if profile is not None:
        profile.enable()
    result = optimize(on, Collective.ALLTOALL, previous=previous, options=options)
    prepare_update(registered, result, on)
    if profile is not None:
        profile.disable()
    return time.thread_time() - cpu, result


def stage_seconds(profile: cProfile.Profile) -> dict[str, float]:
    """Cumulative seconds per stage name of ``STAGES`` in ``profile``."""
    seconds = dict.fromkeys(STAGES, 0.0)
    for (_, _, name), row in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        if name in seconds:
            seconds[name] += row[3]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--fault", type=float, default=0.5, help="GPU 0's NIC, × nominal")
    parser.add_argument("--csv", type=Path, default=Path("benchmarks/results/flag_synthesis.csv"))
    args = parser.parse_args()
    if args.trials < 1 or not 0 < args.fault <= 1:
        parser.error(f"--trials must be at least 1 and --fault in (0, 1], got {args.trials} and {args.fault}")
    if not args.csv.parent.is_dir():
        parser.error(f"--csv: folder {args.csv.parent} does not exist")
    topology = parse_topology("rail_optimized(1,2,4)")
    options = synth_options(2)
    manager = ScheduleManager(topology, ControlConfig(synth_options=options))
    warm_synthesis(topology, ["alltoall"], options, adopt=manager.adopt)
    registered = optimize(topology, Collective.ALLTOALL, options=options[Collective.ALLTOALL]).schedule.with_meta(
        version=1)
    manager.register("job", registered)
    adopted = manager.active_result("job", Collective.ALLTOALL)
    if adopted is None:
        raise SystemExit("the controller did not adopt the registered schedule's result")
    sides = {"before": registered, "after": adopted}
    profiles = {side: cProfile.Profile(time.thread_time) for side in sides}  # CPU, not wall
    rng = np.random.default_rng(0)
    rows = []
    for trial in range(args.trials):
        on = measured(topology, args.fault, rng)
        for side, previous in (sides.items() if trial % 2 == 0 else reversed(sides.items())):
            seconds, result = flag_synthesis(on, previous, registered, options[Collective.ALLTOALL], None)
            validate(result.schedule, on)
            flag_synthesis(on, previous, registered, options[Collective.ALLTOALL], profiles[side])
            stats = result.schedule.meta
            rows.append({"trial": trial, "side": side, "cpu_ms": seconds * 1e3,
                         "lp_gbs": stats.stat("lp_gbs"), "algbw_gbs": result.achieved_gbs,
                         "repaired": stats.stat("repaired", 0.0), "restarted": stats.stat("restarted", 0.0),
                         "fallback": stats.stat("warm_fallback", 0.0)})
    write_csv(args.csv, rows)
    print(f"{args.trials} trials, GPU 0's NIC at {args.fault} × nominal; CPU ms (median) and per-stage CPU ms per "
          "synthesis (cProfile, profiled runs)")
    for side in sides:
        mine = [row for row in rows if row["side"] == side]
        stages = stage_seconds(profiles[side])
        print(f"{side:>7}: {statistics.median(r['cpu_ms'] for r in mine):6.1f} ms CPU; LP "
              f"{statistics.median(r['lp_gbs'] for r in mine):.3f} GB/s, rounded "
              f"{statistics.median(r['algbw_gbs'] for r in mine):.3f}; repaired {sum(r['repaired'] for r in mine):.0f}"
              f", restarted {sum(r['restarted'] for r in mine):.0f}, fell back {sum(r['fallback'] for r in mine):.0f}")
        for name, label in STAGES.items():
            print(f"         {label:<36} {stages[name] / args.trials * 1e3:7.2f} ms")
    by_trial = {(row["trial"], row["side"]): row["cpu_ms"] for row in rows}
    ratios = [by_trial[trial, "before"] / by_trial[trial, "after"] for trial in range(args.trials)]
    print(f"same-trial CPU ratio before/after: median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
