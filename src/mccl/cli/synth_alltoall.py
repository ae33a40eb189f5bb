"""``mccl synth alltoall``: the AllToAll schedule by column generation (mccl-paper §4.2).

Registers on the ``synth`` group of :mod:`mccl.cli.synth`. ``--msccl-xml`` also writes
the schedule as MSCCL XML (:func:`mccl.schedule.to_msccl_xml`).
"""

from __future__ import annotations

from pathlib import Path

import click

from mccl.cli.common import console, load_topology_arg
from mccl.cli.synth import _fault_option, _out, _ranks, _ranks_option, _report, _topology_option, synth_group
from mccl.schedule import Collective, load_schedule, to_msccl_xml, validate
from mccl.synth import AllToAllOptions, optimize

__all__ = ["alltoall"]


def _steps(text: str | None) -> int | str | None:
    if text is None or text == "auto":
        return text
    try:
        value = int(text) if len(text) <= 6 else -1
    except ValueError:
        raise click.BadParameter(f"expected a positive integer or 'auto', got {text!r}", param_hint="'--max-steps'") from None
    if value < 1:
        raise click.BadParameter(f"expected a positive integer or 'auto', got {text!r}", param_hint="'--max-steps'")
    return value


@synth_group.command("alltoall")
@_topology_option
@_fault_option
@click.option("--warm", "warm", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Previous AllToAll schedule (JSON) to warm-start from.")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds for column generation; the best schedule found by then is written with its gap.")
@click.option("--chunks", type=click.IntRange(1, 64), default=10, show_default=True,
              help="Units per (source, destination) block; a block gets at most this many chunks.")
@click.option("--max-steps", default=None, help="Steps per path: a positive integer, or 'auto' (App. D search).")
@click.option("--grouping", type=click.Choice(["tensor", "host"]), default="tensor", show_default=True,
              help="Commodity blocks of the master: one per source (paper) or per (source, destination host).")
@click.option("--msccl-xml", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the schedule as MSCCL XML (msccl-executor-nccl / RCCL).")
@_ranks
@_out
def alltoall(topology: str, faults: tuple[str, ...], warm: Path | None, time_limit: float | None, chunks: int,
             max_steps: str | None, grouping: str, msccl_xml: Path | None, ranks: str | None, out: Path) -> None:
    """AllToAll by column generation (HiGHS), rounded to whole chunks."""
    fabric = load_topology_arg(topology, faults)
    previous = load_schedule(warm) if warm is not None else None
    result = optimize(fabric, Collective.ALLTOALL, _ranks_option(ranks), previous=previous,
                      options=AllToAllOptions(chunks=chunks, time_limit_s=time_limit, max_steps=_steps(max_steps),
                                              grouping=grouping))
    schedule, stats = result.schedule, result.stats
    validate(schedule, fabric)
    _report(schedule, out, {msccl_xml: to_msccl_xml(schedule)} if msccl_xml is not None else None)
    if msccl_xml is not None:
        console.print(f"wrote {msccl_xml}: MSCCL XML")
    console.print(f"LP bound {result.bound_gbs:.2f} GB/s; gap {100 * (result.gap or 0.0):.2f}% "
                  f"(rounding {100 * stats.rounding_gap:.2f}%); {stats.columns} columns, "
                  f"{stats.iterations} simplex iterations, {stats.solve_time_s:.2f} s"
                  + ("" if result.optimal else " (stopped by the time limit)"))
