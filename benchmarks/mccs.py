"""Benchmark: the MCCS §5 results side by side with mccl's tenancy controller on the simulator (issue 16).

    .venv/bin/python benchmarks/mccs.py                 # every mccs-* scenario at its defaults (~3 min CPU)
    .venv/bin/python benchmarks/mccs.py --only mccs-order mccs-tenants --repeat 3

Runs each scenario of :data:`mccl.experiments.mccs_scenarios.MCCS_SCENARIOS` (the same as
``mccl sim mccs-*``), ``--repeat`` times, and prints every comparison with the paper: ours,
MCCS's figure, their ratio and whether it is within ±15 %; plus the CPU seconds per scenario
(``time.process_time``, median over the repeats: wall time means little on a shared machine).
The simulator is deterministic, so repeats only time it. Writes ``--out``/mccs.csv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_csv  # noqa: E402  (benchmarks/ is on sys.path)

from mccl.experiments.mccs_scenarios import MCCS_SCENARIOS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=sorted(MCCS_SCENARIOS), default=None, help="scenarios to run")
    parser.add_argument("--repeat", type=int, default=1, help="runs per scenario (CPU time: median)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results", help="CSV folder")
    args = parser.parse_args()
    console = Console()
    table = Table(title="MCCS §5 vs mccl (flow-level simulation, 2:1 spine-leaf)")
    for column in ("scenario", "figure", "mccl", "MCCS", "mccl / MCCS", "within ±15 %", "CPU s"):
        table.add_column(column)
    rows = []
    for name in args.only or list(MCCS_SCENARIOS):
        cpu = []
        for _ in range(max(1, args.repeat)):
            began = time.process_time()
            report = MCCS_SCENARIOS[name]()
            cpu.append(time.process_time() - began)
        seconds = statistics.median(cpu)
        if not report.comparisons:
            for cells in report.detail:
                table.add_row(name, " / ".join(f"{c}={v}" for c, v in zip(report.detail_columns, cells, strict=True)),
                              "", "", "", "", f"{seconds:.1f}")
                rows.append({"scenario": name, "figure": " / ".join(cells), "cpu_s": f"{seconds:.2f}"})
        for comparison in report.comparisons:
            label, ours, paper, ratio = comparison.cells()
            table.add_row(name, label, ours, paper, ratio, "yes" if comparison.within else "no", f"{seconds:.1f}")
            rows.append({"scenario": name, "figure": label, "mccl": comparison.ours, "mccs": comparison.paper,
                         "unit": comparison.unit, "relative": f"{comparison.relative:.3f}",
                         "within": comparison.within, "cpu_s": f"{seconds:.2f}"})
        for assumption in report.assumptions:
            console.print(f"[dim]{name} assumed: {assumption}[/dim]")
    console.print(table)
    write_csv(args.out / "mccs.csv", rows, ["scenario", "figure", "mccl", "mccs", "unit", "relative", "within", "cpu_s"])
    console.print(f"wrote {args.out / 'mccs.csv'}")


if __name__ == "__main__":
    main()
