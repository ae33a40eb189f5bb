"""Benchmark: the prioritized job's collective time with and without TS under a competing job (issue 16).

    .venv/bin/python benchmarks/mccs_ts_live.py                      # 2 cycles of PFA / PFA+TS, 5 s each
    .venv/bin/python benchmarks/mccs_ts_live.py --cycles 3 --phase-s 6 --b-mib 8

Job ``a`` (priority 1: one AllGather of ``--a-mib`` MiB per rank every ``--period-s``) and job ``b``
(time-shared: AllGathers of ``--b-mib`` MiB per rank back to back) run on 2 gloo ranks each, on
loopback, with the real controller service (:mod:`mccl.experiments.mccs_ts_live`). In the same run
the controller alternates the policy between PFA (``b`` sends any time) and PFA+TS (``b`` sends only
in ``a``'s idle windows, computed from ``a``'s telemetry), ``--phase-s`` each. Reported: ``a``'s
collective time per policy (median over its iterations, the slower rank of each; wall clock — the
point is contention, which CPU time does not show), the ratio, and ``b``'s collectives per second
(what TS costs the borrower). On loopback the jobs share the CPUs and memory bandwidth, not a link:
the contention is that of this machine. Writes ``--out``/mccs_ts_live.csv.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.experiments.mccs_ts_live import TsLiveSpec, a_times_by_phase, run_ts_live  # noqa: E402


def b_rates(result, settle_s: float = 0.5) -> dict[str, float]:
    """``b``'s collectives per second under each policy (by the first send of each collective, rank 0)."""
    firsts: dict[int, float] = {}
    for at, _, seq in result.b[0]["sends"]:
        firsts.setdefault(seq, at)
    counts: dict[str, float] = {}
    spans: dict[str, float] = {}
    ends = [at for _, at in result.phases[1:]] + [max(firsts.values())]
    for (policy, start), end in zip(result.phases, ends, strict=True):
        counts[policy] = counts.get(policy, 0) + sum(1 for at in firsts.values() if start + settle_s <= at < end)
        spans[policy] = spans.get(policy, 0.0) + max(end - start - settle_s, 1e-9)
    return {policy: counts[policy] / spans[policy] for policy in counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=2, help="PFA then PFA+TS, this many times")
    parser.add_argument("--phase-s", type=float, default=5.0, help="seconds per policy phase")
    parser.add_argument("--period-s", type=float, default=0.3, help="a's iteration period")
    parser.add_argument("--a-mib", type=float, default=1.0, help="a's AllGather input per rank (MiB)")
    parser.add_argument("--b-mib", type=float, default=4.0, help="b's AllGather input per rank (MiB)")
    parser.add_argument("--alone", action="store_true", help="also run a alone (b idle), a separate run")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results", help="CSV folder")
    args = parser.parse_args()
    phases = tuple((policy, args.phase_s) for _ in range(args.cycles) for policy in ("pfa", "pfa+ts"))
    total = args.phase_s * len(phases) + 1.0
    spec = TsLiveSpec(period_s=args.period_s, iterations=math.ceil(total / args.period_s),
                      a_bytes=int(args.a_mib * 2**20) // 4 * 4, b_bytes=int(args.b_mib * 2**20) // 4 * 4,
                      phases=phases, timeout_s=600.0)
    began = time.time()
    result = run_ts_live(spec)
    if not all(rank["exact"] for rank in result.a + result.b):
        raise SystemExit("a result was not exact")
    times = a_times_by_phase(result)
    rates = b_rates(result)
    rows = []
    print(f"a: {args.a_mib:g} MiB AllGather every {args.period_s:g} s; b: {args.b_mib:g} MiB back to back; "
          f"{args.cycles} cycles of {args.phase_s:g} s per policy; {time.time() - began:.0f} s wall")
    print(f"{'policy':8} {'a iters':>7} {'a median ms':>11} {'a p90 ms':>8} {'b coll/s':>8}")
    for policy in ("pfa", "pfa+ts"):
        values = sorted(times.get(policy, []))
        if not values:
            raise SystemExit(f"no iteration of a under {policy}")
        median = statistics.median(values)
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        print(f"{policy:8} {len(values):7d} {median * 1e3:11.2f} {p90 * 1e3:8.2f} {rates.get(policy, 0.0):8.2f}")
        rows.append({"policy": policy, "a_iterations": len(values), "a_median_ms": f"{median * 1e3:.3f}",
                     "a_p90_ms": f"{p90 * 1e3:.3f}", "b_collectives_per_s": f"{rates.get(policy, 0.0):.3f}"})
    if args.alone:  # a reference, in a run of its own (b idles): what a takes with nobody competing
        alone = run_ts_live(TsLiveSpec(period_s=args.period_s, iterations=spec.iterations, a_bytes=spec.a_bytes,
                                       b_bytes=0, phases=(("pfa", 0.0),), timeout_s=600.0))
        values = sorted(v for vs in a_times_by_phase(alone).values() for v in vs)
        median = statistics.median(values)
        print(f"{'alone':8} {len(values):7d} {median * 1e3:11.2f} {'':8} {'':8}  (separate run, b idle)")
        rows.append({"policy": "a alone (separate run)", "a_iterations": len(values), "a_median_ms": f"{median * 1e3:.3f}",
                     "a_p90_ms": f"{values[min(len(values) - 1, int(0.9 * len(values)))] * 1e3:.3f}"})
    ratio = statistics.median(times["pfa"]) / statistics.median(times["pfa+ts"])
    print(f"a's collective time, PFA / PFA+TS: {ratio:.2f}x (replans {result.replans}, "
          f"busy intervals seen {result.busy_intervals})")
    for row in rows:
        row["ratio_pfa_over_ts"] = f"{ratio:.3f}"
    write_csv(args.out / "mccs_ts_live.csv", rows)


if __name__ == "__main__":
    main()
