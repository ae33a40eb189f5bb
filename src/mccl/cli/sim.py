"""``mccl sim``: run a named scenario of the papers on the flow-level simulator, print its table."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from mccl.cli.common import console, format_size
from mccl.experiments.mccs_scenarios import MCCS_SCENARIOS
from mccl.experiments.scenarios import PIPELINED_SCENARIOS, SCENARIOS

__all__ = ["sim_command"]


@click.command("sim")
@click.argument("scenario", type=click.Choice(sorted({*SCENARIOS, *MCCS_SCENARIOS})), default="fig2")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory to save the scenario's PNG plot in.")
@click.option("--slices", type=click.IntRange(1, 1024), default=None,
              help="fig2, fig9: every chunk moves as this many slices one after another (literal model; default: "
                   "the executor's slicing and streams); 1 forwards whole chunks only (store and forward). "
                   "fig14: run groups of up to 64 GPUs on the flow simulator with this many slices (default: "
                   "alpha-beta everywhere).")
def sim_command(scenario: str, out_dir: Path | None, slices: int | None) -> None:
    """Simulate a paper scenario (default: fig2, mccl-paper Fig. 2): fig2, fig9, mccs-reversal; loop-*: the
    controller on the simulator through a fault that starts, persists and clears (16 GPUs); fig14: training
    time of Llama-3.1-405B and DeepSeek-V3 at 128-2048 GPUs under Fail1/2/3 (alpha-beta); mccs-order, -sizes,
    -tenants, -training, -crossrack: MCCS §5 side by side; mccs-gray: tenancy policies and the gray-failure loop."""
    if slices is not None and scenario not in PIPELINED_SCENARIOS:
        raise click.UsageError(f"--slices applies to {', '.join(PIPELINED_SCENARIOS)}, not {scenario}")
    if scenario in MCCS_SCENARIOS:
        _print_mccs(MCCS_SCENARIOS[scenario](), out_dir)
        return
    report = SCENARIOS[scenario](**({} if slices is None else {"slices": slices}))
    if hasattr(report, "cells"):  # a report with its own table (fig14: training time, not algbw)
        _print_own_table(report, out_dir)
        return
    size = format_size(report.rows[0].size_bytes) if report.rows else "-"
    table = Table(title=f"{report.title} (flow-level simulation; S = {size} per rank)")
    for column in ("fabric state", "collective", "schedule", "algbw (GB/s)", "busbw (GB/s)", "speedup", "note",
                   "critical chain"):
        table.add_column(column, justify="right" if "GB/s" in column or column == "speedup" else "left")
    for row in report.rows:
        table.add_row(row.scenario, row.collective.value, row.schedule,
                      "-" if row.algbw_gbs is None else f"{row.algbw_gbs:.2f}",
                      "-" if row.busbw_gbs is None else f"{row.busbw_gbs:.2f}",
                      "-" if row.speedup is None else f"{row.speedup:.2f}x", row.note, row.chain)
    console.print(table)
    for when, what in report.events:
        console.print(f"  t = {when:g} s: {what}")
    if out_dir is not None:
        from mccl.experiments.plotting import plot_report

        console.print(f"plot: {plot_report(report, out_dir)}")


def _print_own_table(report, out_dir: Path | None) -> None:  # type: ignore[no-untyped-def]
    """A report that carries ``columns`` and ``cells`` (and plots itself): print them as they are."""
    table = Table(title=report.title)
    for column in report.columns:
        table.add_column(column)
    for cells in report.cells:
        table.add_row(*cells)
    console.print(table)
    if out_dir is not None:
        console.print(f"plot: {report.plot(out_dir)}")


def _print_mccs(report, out_dir: Path | None) -> None:  # type: ignore[no-untyped-def]
    """An MCCS comparison: the figures side by side, the detail, what was assumed, the events."""
    _print_own_table(report, out_dir)
    if report.comparisons and report.detail:
        detail = Table()
        for column in report.detail_columns:
            detail.add_column(column)
        for row in report.detail:
            detail.add_row(*row)
        console.print(detail)
    for when, what in report.events:
        console.print(f"  t = {when:.2f} s: {what}")
    for assumption in report.assumptions:
        console.print(f"  assumed: {assumption}")
