"""``mccl sim``: run a named scenario of the papers and print its table."""

from __future__ import annotations

import click
from rich.table import Table

from mccl.cli.common import console, format_size
from mccl.sim.scenarios import SCENARIOS

__all__ = ["sim_command"]


@click.command("sim")
@click.argument("scenario", type=click.Choice(sorted(SCENARIOS)), default="fig2")
def sim_command(scenario: str) -> None:
    """Evaluate a paper scenario (default: fig2, mccl-paper Fig. 2) with the analytic model."""
    rows = SCENARIOS[scenario]()
    table = Table(title=f"scenario {scenario} (analytic α-β model; S = {format_size(rows[0].size_bytes)} per rank)")
    for column in ("fabric state", "collective", "schedule", "algbw (GB/s)", "busbw (GB/s)", "note"):
        table.add_column(column, justify="right" if "GB/s" in column else "left")
    for row in rows:
        table.add_row(row.scenario, row.collective.value, row.schedule,
                      "-" if row.algbw_gbs is None else f"{row.algbw_gbs:.2f}",
                      "-" if row.busbw_gbs is None else f"{row.busbw_gbs:.2f}", row.note)
    console.print(table)
