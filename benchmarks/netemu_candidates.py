"""Which AllGather runs fastest on the emulated fabric: the loop's schedules beside shallower and fewer-chunk ones,
healthy and with rank 0's NIC halved, at the executor's slice and a finer one (needs root; issue 15, deliverable 3).

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/netemu_candidates.py                 # 3 runs, ~10 min
    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/netemu_candidates.py --runs 1 --fabrics 0.5 --slices 16384

Why. ``mccl demo``'s AllGather (256 KiB per rank, the tree packing with 4 trees per source) is re-synthesized
when rank 0's NIC is halved, and the model promises the new schedule 1.6x the old one's rate on that fabric
(320 against 200 Gbit/s of the bottleneck), yet it measured no faster (BENCHMARKS.md: "recovered" 6.2–7.2 MB/s
against "degraded" 6.8–7.4 since the fifth session). This runs the candidates side by side, in one fabric and one
set of ranks, so their ranking is read under the same load.

The candidates (``--candidates``; ``made-for:shape``): ``healthy:`` synthesized for the nominal topology,
``fault:`` for the topology with rank 0's NIC links at the demo's fault factor, 0.5 (what the controller re-synthesizes
for, as ``benchmarks/netemu.py`` does); shapes ``packing-c<k>`` (``allgather.treepack``, at most k trees per source — the
demo's is ``packing-c4``), ``rail``, ``host-rail`` and ``latency_aware`` (``treepack.depth`` restricted to that
candidate). Per fabric state (``--fabrics``: the factor of rank 0's NIC, both ways, set before the ranks start) and
slice size (``--slices``: the executor's pipelining grain, :mod:`mccl.schedule.slicing`, the same on every rank),
every rank runs every candidate ``--repeats`` times with telemetry on and off (``netemu_telemetry.py``'s ranks;
the first call of each is a warm-up); a call's time is the slowest rank's. Printed per candidate: the median over
the calls and runs (ms, MB/s of nccl-tests algbw), the model — the schedule's steady state on the fabric as run
(``steady_state_algbw`` of its link loads, ÷ scale × TCP goodput, as ``mccl demo``'s "model" column) — and
model ÷ measured (the share of the model's rate it reached). ``--ag-bytes``: the AllGather's input per rank (the
demo's 256 KiB by default). Writes ``benchmarks/results/netemu_candidates<tag>.csv`` (one row per run and
candidate); the printed tables of the runs BENCHMARKS.md cites are in ``benchmarks/results/netemu_candidates/``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from netemu_telemetry import _rank, nic_scaled  # noqa: E402  (benchmarks/ is on sys.path)
from results_io import write_csv  # noqa: E402

from mccl.experiments.netemu import EmulatedFabric, FabricPlan, unsupported_reason
from mccl.experiments.netemu.demo import NetemuConfig
from mccl.experiments.netemu.ranks import run_ranks_in_fabric
from mccl.experiments.netemu.shaping import GOODPUT

RESULTS = Path(__file__).resolve().parent / "results"
CANDIDATES = ("healthy:packing-c4", "fault:packing-c4", "healthy:packing-c2", "fault:packing-c2",
              "healthy:packing-c1", "healthy:rail", "fault:latency_aware")
DEPTH_SHAPES = ("rail", "host-rail", "latency_aware")


def build(name: str, topology, fault, size_bytes: float):  # noqa: ANN001, ANN201  (Topology -> Schedule)
    """The schedule ``name`` (module docstring) for ``topology`` (healthy) or ``fault``."""
    from mccl.synth import optimize
    from mccl.synth.options import DepthOptions, TreePackOptions

    made_for, _, shape = name.partition(":")
    if made_for not in ("healthy", "fault"):
        raise ValueError(f"a candidate is healthy:<shape> or fault:<shape>, not {name!r}")
    target = topology if made_for == "healthy" else fault
    if shape.startswith("packing-c") and shape[len("packing-c"):].isdigit():
        chunks = int(shape[len("packing-c"):])
        return optimize(target, "allgather", options=TreePackOptions(chunks=chunks)).schedule
    if shape in DEPTH_SHAPES:
        return optimize(target, "allgather", method="treepack.depth",
                        options=DepthOptions(size_bytes=size_bytes, chunks=4, candidates=(shape,))).schedule
    raise ValueError(f"unknown shape {shape!r} in {name!r}: packing-c<k>, {', '.join(DEPTH_SHAPES)}")


def model_ms(schedule, topology, config: NetemuConfig) -> float:  # noqa: ANN001
    """The schedule's steady-state time of one call on ``topology`` at the emulated rates (module docstring)."""
    from mccl.schedule import link_load
    from mccl.schedule.accounting import steady_state_algbw

    algbw_gbs = steady_state_algbw(link_load(schedule, len(topology.links)), topology.capacities_gbps,
                                   schedule.n_ranks)
    return config.ag_bytes * schedule.n_ranks / (algbw_gbs * 1e9 / config.scale * GOODPUT) * 1e3


def measure(names: list[str], factor: float, slice_bytes: int, repeats: int, nvlink: str,
            ag_bytes: int = NetemuConfig.ag_bytes) -> list[dict]:
    from mccl.schedule import dumps_schedule
    from mccl.topology import parse_topology

    config = NetemuConfig(ag_bytes=ag_bytes)
    topology = parse_topology(config.topology_spec)
    fault = nic_scaled(topology, config.fault_rank, config.fault_factor)
    size = float(config.ag_bytes * config.ranks)
    schedules = {name: build(name, topology, fault, size) for name in names}
    running_on = topology if factor == 1 else nic_scaled(topology, config.fault_rank, factor)
    texts = {name: dumps_schedule(schedule) for name, schedule in schedules.items()}
    plan = FabricPlan.from_topology(topology, scale=config.scale, nvlink=nvlink)
    with EmulatedFabric(plan) as built:
        if factor != 1:
            built.scale_nic(config.fault_rank, factor)
        outputs = run_ranks_in_fabric(_rank, built.plan, texts, config.topology_spec,
                                      {"allgather": config.ag_bytes // 4}, repeats, None, False, None,
                                      slice_bytes, timeout_s=900)
    rows = []
    for name, schedule in schedules.items():
        calls = [max(out[name]["calls"][i][1] for out in outputs) for i in range(1, repeats)]
        calls += [max(out[name]["off"][i] for out in outputs) for i in range(1, repeats)]
        measured = statistics.median(calls) * 1e3
        model = model_ms(schedule, running_on, config)
        rows.append({"ag_bytes": config.ag_bytes, "fabric_nic0": factor, "slice_bytes": slice_bytes, "nvlink": nvlink,
                     "candidate": name,
                     "synthesizer": schedule.meta.synthesizer, "chunks": len(schedule.chunks.fraction),
                     "transfers": len(schedule.transfers.chunk), "measured_ms": round(measured, 1),
                     "size_bytes": config.ag_bytes * config.ranks,
                     "algbw_mbs": round(config.ag_bytes * config.ranks / measured / 1e3, 2),
                     "model_ms": round(model, 1), "model_over_measured": round(model / measured, 3),
                     "calls": len(calls)})
    return rows


def summary(rows: list[dict]) -> str:
    lines = []
    groups = sorted({(row["fabric_nic0"], row["slice_bytes"]) for row in rows}, key=lambda g: (-g[0], -g[1]))
    for factor, slice_bytes in groups:
        mine = [row for row in rows if (row["fabric_nic0"], row["slice_bytes"]) == (factor, slice_bytes)]
        lines.append(f"rank 0's NIC x{factor:g}, slices {slice_bytes // 1024} KiB "
                     f"({len({row['run'] for row in mine})} runs; ms: median over runs [each run])")
        for name in dict.fromkeys(row["candidate"] for row in mine):
            runs = [row for row in mine if row["candidate"] == name]
            ms = statistics.median(row["measured_ms"] for row in runs)
            each = ", ".join(f"{row['measured_ms']:.0f}" for row in runs)
            lines.append(f"  {name:<22} {ms:7.1f} ms {runs[0]['size_bytes'] / ms / 1e3:6.2f} MB/s  model "
                         f"{runs[0]['model_ms']:6.1f} ms  model/measured {runs[0]['model_ms'] / ms:.2f}  [{each}]")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--fabrics", default="1,0.5", help="rank 0's NIC factor per fabric state (1: healthy)")
    parser.add_argument("--slices", default="65536,16384", help="the executor's slice sizes, bytes")
    parser.add_argument("--runs", type=int, default=3, help="fabrics built per (fabric state, slice size)")
    parser.add_argument("--repeats", type=int, default=6, help="calls per candidate and communicator (first: warm-up)")
    parser.add_argument("--nvlink", choices=("shaped", "unshaped"), default="shaped")
    parser.add_argument("--ag-bytes", type=int, default=NetemuConfig.ag_bytes,
                        help="the AllGather's input per rank (default: mccl demo's, 256 KiB)")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    names = [name for name in args.candidates.split(",") if name]
    try:
        factors = [float(value) for value in args.fabrics.split(",")]
        slices = [int(value) for value in args.slices.split(",")]
    except ValueError:
        parser.error("--fabrics takes numbers in (0, 1], --slices whole byte counts, comma-separated")
    if not all(0 < factor <= 1 for factor in factors) or not all(slice_bytes >= 1024 for slice_bytes in slices):
        parser.error("--fabrics takes numbers in (0, 1], --slices byte counts of at least 1024")
    if args.ag_bytes < 1024 or args.ag_bytes % 1024:
        parser.error(f"--ag-bytes must be a positive multiple of 1024, got {args.ag_bytes}")
    if args.runs < 1 or args.repeats < 2:
        parser.error("--runs must be at least 1 and --repeats at least 2 (the first call is a warm-up)")
    config = NetemuConfig()
    from mccl.topology import parse_topology

    topology = parse_topology(config.topology_spec)
    try:  # refuse an unknown candidate before any fabric is built
        for name in names:
            build(name, topology, topology, float(config.ag_bytes * config.ranks))
    except ValueError as error:
        parser.error(str(error))
    reason = unsupported_reason()  # (after the options: a bad one is refused on any machine)
    if reason:
        sys.exit(f"netemu_candidates: {reason}")
    rows = []
    for run in range(args.runs):  # runs outermost: a drift in the machine's load spreads over every cell
        for factor in factors:
            for slice_bytes in slices:
                started = time.perf_counter()
                got = measure(names, factor, slice_bytes, args.repeats, args.nvlink, args.ag_bytes)
                rows += [{**row, "run": run, "utc": time.strftime("%H:%M:%S", time.gmtime())} for row in got]
                print(f"[run {run + 1}/{args.runs}, NIC x{factor:g}, slices {slice_bytes}: "
                      f"{time.perf_counter() - started:.0f} s] "
                      + ", ".join(f"{row['candidate']} {row['measured_ms']:.0f}" for row in got), flush=True)
    print(summary(rows))
    write_csv(RESULTS / f"netemu_candidates{args.tag}.csv", rows)


if __name__ == "__main__":
    main()
