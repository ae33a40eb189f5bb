"""Benchmark: route pinning by source port on the kernel-emulated spine-leaf (issue 16, deliverable 3). Root only.

    .venv/bin/python benchmarks/mccs_routes.py                 # 5 repeats, 1.5 s flows
    .venv/bin/python benchmarks/mccs_routes.py --repeat 9 --seconds 2
    .venv/bin/python benchmarks/mccs_routes.py --gloo --repeat 3   # two tenants' gloo jobs, pinned by host pair

A routed 2-leaf × 2-spine fabric in network namespaces (:mod:`mccl.experiments.netemu.routes`;
200 Mbit/s host links, 100 Mbit/s uplinks). Two flows cross from leaf 0 to leaf 1 at once
(host 0 → 2, host 1 → 3), three ways, each repeat:

* **pinned apart** — the routes FFA chose (one per spine), sent from their routes' source ports;
* **collided** — both pinned to one spine (what ECMP does to two flows half of the time);
* **ECMP** — ephemeral source ports, the leaves' 5-tuple hash decides (which spines: from the
  uplinks' ``tc -s`` byte counters).

Reports the aggregate Mbit/s of each (median over repeats), apart / collided, and how many ECMP
trials collided. Writes ``--out``/mccs_routes.csv.

``--gloo``: two tenants' gloo jobs instead (job a on hosts 0–2, job b on 1–3; AllReduces of
``--mib`` MiB), pinned by host pair (:mod:`mccl.experiments.netemu.gloopin`): apart (one spine
each) and collided (both on spine 0) alternately, ``--repeat`` times each, under the same processes;
each job's time per phase, medians, collided / apart. Writes ``--out``/mccs_routes_gloo.csv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.control.tenancy.assign import ffa_assign  # noqa: E402
from mccl.control.tenancy.flows import Flow as PolicyFlow  # noqa: E402
from mccl.control.tenancy.flows import candidate_routes  # noqa: E402
from mccl.experiments.netemu.fabric import unsupported_reason  # noqa: E402
from mccl.experiments.netemu.routes import Flow, RoutedFabric, RoutedSpineLeaf, pinned_port, run_flows  # noqa: E402
from mccl.topology import spine_leaf  # noqa: E402


def _gloo(args: argparse.Namespace) -> None:
    import os
    import time

    from mccl.experiments.netemu.fabric import BASE_PREFIX
    from mccl.experiments.netemu.gloopin import GlooJob, PairPinning, run_gloo_jobs

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    jobs = [GlooJob("a", (0, 2), int(args.mib * (1 << 20)), args.iterations),
            GlooJob("b", (1, 3), int(args.mib * (1 << 20)), args.iterations)]
    cases = {"apart": ((0, 2, 0), (1, 3, 1)), "collided": ((0, 2, 0), (1, 3, 0))}
    order = [name for _ in range(args.repeat) for name in cases]
    with RoutedFabric(RoutedSpineLeaf(f"{BASE_PREFIX}{os.getpid()}-g")) as fabric:
        pinning = PairPinning(fabric)
        phases = run_gloo_jobs(fabric, jobs, [pinning.phase(*cases[name]) for name in order])
    seconds = {(name, job.name): [phase["seconds"][job.name] for case, phase in zip(order, phases, strict=True)
                                  if case == name] for name in cases for job in jobs}
    shares = [min(phase["uplinks"][(0, 0)], phase["uplinks"][(0, 1)]) / max(1, sum(
        phase["uplinks"][(0, k)] for k in range(2))) for case, phase in zip(order, phases, strict=True)]
    print(f"two tenants' gloo jobs, {args.iterations} AllReduces of {args.mib:g} MiB per phase, {args.repeat} "
          f"phases each way; {started}, load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    rows = []
    for job in jobs:
        apart = statistics.median(seconds[("apart", job.name)])
        collided = statistics.median(seconds[("collided", job.name)])
        print(f"  job {job.name}: apart {apart:.3f} s, collided {collided:.3f} s, collided / apart {collided / apart:.2f}x")
        rows.append({"job": job.name, "apart_s": f"{apart:.4f}", "collided_s": f"{collided:.4f}",
                     "collided_over_apart": f"{collided / apart:.3f}", "repeats": args.repeat})
    apart_share = statistics.median(s for case, s in zip(order, shares, strict=True) if case == "apart")
    collided_share = statistics.median(s for case, s in zip(order, shares, strict=True) if case == "collided")
    print(f"  the lesser leaf-0 uplink's share of the bytes: apart {100 * apart_share:.1f} %, "
          f"collided {100 * collided_share:.1f} %; results exact: {all(p['exact'] for p in phases)}")
    write_csv(args.out / "mccs_routes_gloo.csv", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5, help="each flow's sending time")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results", help="CSV folder")
    parser.add_argument("--gloo", action="store_true", help="two tenants' gloo jobs pinned by host pair")
    parser.add_argument("--mib", type=float, default=1.0, help="--gloo: MiB per AllReduce")
    parser.add_argument("--iterations", type=int, default=4, help="--gloo: AllReduces per job and phase")
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason is not None:
        raise SystemExit(f"cannot run: {reason}")
    if args.gloo:
        return _gloo(args)
    topology = spine_leaf(2, 2, 1, 2, 200, 100)
    pairs = (("a", "gpu0", "gpu2"), ("b", "gpu1", "gpu3"))
    chosen, _ = ffa_assign([PolicyFlow(job, s, d, 1.0, 200.0, candidate_routes(topology, s, d)) for job, s, d in pairs],
                           topology.capacities_gbps)
    routes = [chosen[pair] for pair in pairs]
    totals: dict[str, list[float]] = {"pinned apart": [], "collided": [], "ECMP": []}
    uplink_share: list[float] = []
    ecmp_collisions = 0
    with RoutedFabric(RoutedSpineLeaf.from_topology(topology)) as fabric:
        for repeat in range(args.repeat):
            runs = {"pinned apart": [Flow(0, 2, pinned_port(topology, routes[0], 2 * repeat)),
                                     Flow(1, 3, pinned_port(topology, routes[1], 2 * repeat + 1))],
                    "collided": [Flow(0, 2, pinned_port(topology, routes[0], 32 + 2 * repeat)),
                                 Flow(1, 3, pinned_port(topology, routes[0], 33 + 2 * repeat))],
                    "ECMP": [Flow(0, 2), Flow(1, 3)]}
            for name, flows in runs.items():
                before = fabric.uplink_bytes()
                results = run_flows(fabric, flows, args.seconds)
                after = fabric.uplink_bytes()
                sent = [after[(0, k)] - before[(0, k)] for k in range(2)]
                totals[name].append(sum(result.mbit for result in results))
                if name == "ECMP" and min(sent) < 0.05 * sum(sent):
                    ecmp_collisions += 1
                if name == "pinned apart":
                    uplink_share.append(min(sent) / sum(sent))
    rows = []
    print(f"2 flows leaf0 -> leaf1, {args.seconds:g} s each, {args.repeat} repeats (median aggregate Mbit/s; "
          f"uplinks 100 Mbit/s = 95.6 goodput)")
    for name, values in totals.items():
        median = statistics.median(values)
        print(f"  {name:13} {median:7.1f}  (min {min(values):.1f}, max {max(values):.1f})")
        rows.append({"case": name, "median_mbit": f"{median:.2f}", "min_mbit": f"{min(values):.2f}",
                     "max_mbit": f"{max(values):.2f}", "repeats": len(values)})
    ratio = statistics.median(totals["pinned apart"]) / statistics.median(totals["collided"])
    print(f"  pinned apart / collided: {ratio:.2f}x; ECMP collided {ecmp_collisions} of {args.repeat}; "
          f"pinned apart: the lesser uplink carried {100 * statistics.median(uplink_share):.1f} % of leaf0's bytes")
    rows.append({"case": "apart/collided", "median_mbit": f"{ratio:.3f}", "repeats": args.repeat,
                 "ecmp_collided": ecmp_collisions})
    write_csv(args.out / "mccs_routes.csv", rows,
              columns=["case", "median_mbit", "min_mbit", "max_mbit", "repeats", "ecmp_collided"])


if __name__ == "__main__":
    main()
