"""The reaction path of Fig. 13(b) on the emulated fabric: detection → the first collective launched on the new version.

    PYTHONPATH=src .venv/bin/python benchmarks/reaction.py --runs 5                        # the bar (issue 15: ≤ 50 ms median)
    PYTHONPATH=src .venv/bin/python benchmarks/reaction.py --runs 3 --ab --before fourth   # and the fourth session's path
    PYTHONPATH=src .venv/bin/python benchmarks/reaction.py --runs 3 --fabric pacer         # without root
    PYTHONPATH=src .venv/bin/python benchmarks/reaction.py --runs 2 --ab --setup demo --tag _demo   # mccl demo's streams

Each run is ``mccl demo``'s loop (:mod:`mccl.experiments.demo`), fault phase only. The first collective on a new
version can only be launched once the one in flight has finished (Fig. 13 is a 16 MB-per-GPU AllGather at
200 Gbit/s: 0.2 ms; the demo's 256 KiB at 20 Mbit/s lasts 130–450 ms), so the bar is read on collectives that
are short while the NIC still is their bottleneck (``benchmarks/collective_floor.py`` chose them):

``ag,a2a`` (default: one run of each per ``--runs``): 8 ranks on 2 hosts, NICs at 40 Mbit/s (scale 10000), one
stream per run — AllGather 64 KiB per rank (4 chunks per source), or AllToAll 128 KiB per rank (2 chunks per
block) —, rank 0's NIC halved after 8
collectives, no torch cross-check (the known answer still checks every output), ``mccl demo``'s controller
(Γ 0.3, synthesis ahead at ½ Γ) with (eighth session) α 0.2 instead of 0.15 (:data:`SETUPS`: why) and the wider
band of speculation reuse (0.25 × nominal, judged by the guard: :mod:`mccl.control.ahead`, "The wider band"); the
fault phase ends 3 collectives after the swap (at most 20).
``demo``: ``mccl demo``'s own streams (AllGather 256 KiB and AllToAll 512 KiB per rank at 20 Mbit/s), fault phase
only — collectives of 150–450 ms: the wait for the one in flight dominates. ``short``: the fourth session's
set-up (16 KiB at 40 Mbit/s: CPU-bound, the fault hardly shows).

The path measured ("now", :data:`NOW`): candidates pushed and prepared before the flag
(:mod:`mccl.control.candidates`), the hot swap's ready wait by the store's event, the ranks' switch interval
1 ms, the controller 10 below the ranks' niceness (it stands for a machine of its own), and (sixth session) the
ranks' hold (``swap_hold_s`` 0.1: a launch during a swap round waits, once, for the round to end —
:mod:`mccl.runtime.hotswap`, "The hold"); the controller reuses a speculation whose drift only went further
(:mod:`mccl.control.ahead`); (seventh session) the swap thread, the clients' ZeroMQ I/O threads and the store's
server 10 steps of niceness above the ranks' collectives (:mod:`mccl.runtime.priority`), versions whose content a rank
held as a candidate sent as a digest (:mod:`mccl.control.candidates`), and the controller's synthesizers warmed before
telemetry (:func:`mccl.control.ahead.warm_synthesis`); (eighth session) a speculation within 0.25 × nominal of the
flag's capacities offered at the flag and issued where the guard chooses it. ``--ab``: every run
is followed by one of ``--before`` (:data:`BEFORE`: "fourth", the fourth session's path; "poll", the path
before issue 15's pushes; "fifth" = "no-hold", the fifth session's; "seventh", the seventh session's: α 0.15 and no
wider band; or one change taken back), and the ratio of the medians is printed.

Per run the terms of :mod:`mccl.experiments.reaction_path` (ms) for the first flag after the fault; the
medians over the runs that flagged. Writes ``benchmarks/results/reaction{tag}.csv``. (Ninth session) ``running`` and
``between`` split ``in_flight``: the collective on the old version still running on some rank after the agreement,
and the demo loop's own time between two collectives (every rank rebuilds all inputs to check its output, makes the
next one, then a barrier: 8 ranks on 2 cores) — measured, the second was nearly all of it; ``detect_to_ready`` is the
bar less that gap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.experiments.demo import DemoConfig, run_demo
from mccl.experiments.reaction_path import TERMS, reaction_path

RESULTS = Path(__file__).resolve().parent / "results"

SETUPS = {
    # the bar's set-up: short collectives (module docstring)
    "short": DemoConfig(kinds=("allgather",), ag_bytes=16 << 10, scale=10000.0, torch_check_every=0, healthy=8,
                        max_degraded=300, after_swap=3, max_recovered=0, alpha=0.5, gamma=0.2, alpha_level=1.0,
                        timeout_s=400.0),
    # the bar's set-up since the fifth session: one stream per run, NICs at 40 Mbit/s, sizes where the NIC is still
    # the bottleneck (benchmarks/collective_floor.py) while a collective lasts 30–90 ms. AllToAll in 2 chunks per
    # block (the demo: 4): less of the executor's CPU per collective; the AllGather keeps the demo's 4 chunks per
    # source: with 2 the guard kept the healthy schedule (the re-synthesis predicted slower at 64 KiB: no swap)
    # (eighth session) α 0.2, not `mccl demo`'s 0.15. Why detection took 12–14 collectives here and 6 in the demo's
    # streams: on these short collectives a part of every window is the executor's CPU, not the wire, so the halved
    # NIC reads shallower on its paths (measured under load, eighth session: 0.45–0.86 of their reference over
    # collectives 2–7 of the fault; the demo's streams' paths into rank 0: 0.51–0.57), and the drift test needs the
    # EWMA within Γ of that step f: k* = ln(1 − Γ/(1−f)) / ln(1−α) (src/mccl/experiments/README.md, "Choosing α and
    # Γ") is 9.6 collectives at α 0.15 and f 0.62 (5.6 at f 0.5: the demo's 6), plus the noisy paths that exonerate
    # the NIC's links (the best path through a link speaks for it): the 12–14 measured. At α 0.2, f 0.62: 7.0. What
    # α 0.2 still rides out: a burst of full depth for one collective, or of depth ≤ 0.83 for two ((1 − 0.8²)·0.83 =
    # Γ 0.3; α 0.15 rides two of full depth). Replays (benchmarks/reaction_replay.py), eighth session, 26 runs at load
    # 7–19: the first flag within 10 collectives in 21 of 26 at α 0.2 (α 0.15: 19), none before the fault (α 0.25: 2
    # of 13 AllGather runs flagged before it, so not taken) — BENCHMARKS.md. Seventh session: α 0.25's flags came
    # before a speculation they could reuse (0 of 4 ahead live); the wider band (NOW) lets a faster EWMA's flag reuse.
    # `--ab --before seventh` compares with α 0.15 and no band.
    "ag": DemoConfig(kinds=("allgather",), ag_bytes=64 << 10, scale=10000.0, torch_check_every=0, alpha=0.2,
                     healthy=8, max_degraded=20, after_swap=3, max_recovered=0, timeout_s=400.0),
    "a2a": DemoConfig(kinds=("alltoall",), a2a_bytes=128 << 10, scale=10000.0, chunks=2, torch_check_every=0,
                      alpha=0.2, healthy=8, max_degraded=20, after_swap=3, max_recovered=0, timeout_s=400.0),
    # `mccl demo`'s streams and controller, fault phase only: where the fault is visible on a loaded machine
    "demo": DemoConfig(max_recovered=0, torch_check_every=0, max_degraded=16, timeout_s=400.0),
}
# the paths an A/B compares with (``--before``): "poll", the demo before issue 15's pushes (the swap thread polls every
# 5 ms, the client answers on the poll after, no synthesis ahead); "fourth", the fourth session's path (pushes and
# synthesis ahead, but no candidates, the ready wait polled every 2 ms, Python's 5 ms switch interval); and each of
# the fifth session's changes alone taken back
BEFORE = {"poll": {"push": False, "speculate": None, "client_interval_s": 0.005, "swap_poll_s": 0.005,
                   "prestage": False, "ready_poll_s": 0.002, "switch_interval_s": None, "controller_nice": 0},
          "fourth": {"prestage": False, "ready_poll_s": 0.002, "switch_interval_s": None, "controller_nice": 0},
          "no-prestage": {"prestage": False}, "ready-poll": {"ready_poll_s": 0.002},
          "switch-5ms": {"switch_interval_s": None}, "controller-nice0": {"controller_nice": 0},
          # the fifth session's path: everything above but the sixth session's hold
          "fifth": {"swap_hold_s": None}, "no-hold": {"swap_hold_s": None},
          # the seventh session's path: everything above but the reaction threads' priority
          "sixth": {"swap_priority": None}, "no-priority": {"swap_priority": None},
          # (eighth session) the seventh session's controller: α 0.15, no wider band of reuse; and each alone
          "seventh": {"alpha": 0.15, "speculate_band": None}, "alpha-0.15": {"alpha": 0.15},
          "no-band": {"speculate_band": None},
          # the seventh session's A/B of a faster EWMA (its BENCHMARKS.md section names it)
          "alpha-0.25": {"alpha": 0.25},
          # (eleventh session) the ranks' heap not frozen before the stream (DemoConfig.gc_freeze)
          "no-gc-freeze": {"gc_freeze": False}}
# this session's path; the controller at 10 below the ranks' niceness (under this benchmark's nice 10: the default)
# and (sixth session) the ranks' hold: a launch during a swap round waits up to 100 ms, once, for the round to end
# and (seventh session) the reaction path's threads (swap thread, the clients' ZeroMQ I/O) 10 steps of niceness above
# the ranks' main threads: at the controller's niceness (mccl.runtime.priority)
# and (eighth session) the wider band of speculation reuse, judged by the guard (mccl.control.ahead)
NOW = {"prestage": True, "ready_poll_s": None, "switch_interval_s": 0.001, "controller_nice": -10, "swap_hold_s": 0.1,
       "swap_priority": 10, "speculate_band": 0.25}


def one_run(index: int, config: DemoConfig, label: str, dump: str | None = None) -> list[dict]:
    started = time.strftime("%H:%M:%S", time.gmtime())
    report = run_demo(config)
    if dump:  # the whole report, to look into a run (events, records, every rank's samples and marks)
        Path(f"{dump}_{index}_{label}_{'-'.join(config.kinds)}.json").write_text(json.dumps(asdict(report), default=str))
    return [_row(index, report, kind, label, started) for kind in config.kinds]


def _row(index: int, report: object, kind: str, label: str, started: str) -> dict:
    path = reaction_path(report, kind)
    stream = report.stream(kind)
    healthy = [r.seconds for r in stream if r.phase == "healthy"][2:]
    degraded = [r.seconds for r in stream if r.phase == "degraded"]
    row = {"run": index, "path": label, "collective": kind, "started_utc": started, "all_correct": report.all_correct,
           "detect_collectives": report.reaction(kind)["detect_collectives"],
           "collective_ms_healthy": round(statistics.median(healthy) * 1e3, 1) if healthy else None,
           "collective_ms_degraded": round(statistics.median(degraded) * 1e3, 1) if degraded else None,
           "outcomes": path["outcomes"], "version": path["version"], "ahead": path["ahead"],
           "speculations": report.controller_stats.get("speculations"),
           "synthesis_cpu_ms": None if path["synthesis_cpu"] is None else round(path["synthesis_cpu"], 2),
           "prestaged_ranks": path["prestaged"], "activated_ranks": path["activations"]}
    row.update({f"{term}_ms": None if path[term] is None else round(path[term], 2) for term in TERMS})
    print(row, flush=True)
    return row


def medians(rows: list[dict]) -> dict[str, float]:
    out = {}
    for term in (*TERMS, "synthesis_cpu", "collective_ms_healthy", "collective_ms_degraded"):
        key = term if term.startswith("collective") else f"{term}_ms"
        values = [row[key] for row in rows if row.get(key) is not None]
        if values:
            out[key] = round(statistics.median(values), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fabric", choices=("netemu", "pacer"), default="netemu")
    parser.add_argument("--ab", action="store_true", help="also the path before (--before), alternating, same run")
    parser.add_argument("--before", choices=tuple(BEFORE), default="fourth")
    parser.add_argument("--setup", default="ag,a2a", help=f"comma list of {tuple(SETUPS)}: one run of each per --runs")
    parser.add_argument("--tag", default="")
    parser.add_argument("--dump", default=None, help="write each run's whole report to DUMP_<run>_<path>.json")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    names = [name for name in args.setup.split(",") if name]
    unknown = [name for name in names if name not in SETUPS]
    if unknown or not names:
        parser.error(f"--setup takes a comma list of {tuple(SETUPS)}, got {args.setup!r}")
    configs = [replace(SETUPS[name], fabric=args.fabric, **NOW) for name in names]
    if args.fabric == "netemu":
        from mccl.experiments.netemu import unsupported_reason

        reason = unsupported_reason()
        if reason is not None:
            sys.exit(f"netemu: {reason} (try --fabric pacer)")
    rows = []
    for index in range(args.runs):
        for config in configs:
            rows += one_run(index, config, "now", args.dump)
            if args.ab:
                rows += one_run(index, replace(config, **BEFORE[args.before]), args.before, args.dump)
    write_csv(RESULTS / f"reaction{args.tag}.csv", rows)
    for kind in dict.fromkeys(kind for config in configs for kind in config.kinds):
        now = medians([row for row in rows if row["path"] == "now" and row["collective"] == kind])
        print(f"{kind} medians (now):", now)
        if args.ab:
            before = medians([row for row in rows if row["path"] == args.before and row["collective"] == kind])
            print(f"{kind} medians ({args.before}):", before)
            print(f"{kind} ratios {args.before} / now:", {key: round(before[key] / now[key], 2) for key in now
                                                          if key in before and now[key]})


if __name__ == "__main__":
    main()
