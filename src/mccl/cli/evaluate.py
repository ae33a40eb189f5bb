"""``mccl eval``: an nccl-tests-style table for a schedule on a fabric (α-β model or flow simulator)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import click
from rich.table import Table

from mccl.cli.common import FiniteFloat, SizeParam, console, format_size, load_topology_arg, write_outputs
from mccl.experiments.scenarios import chain_summary
from mccl.schedule import Collective, load_schedule, validate
from mccl.sim import evaluate
from mccl.sim.engine import simulate_schedule
from mccl.sim.inputs import SimOptions
from mccl.synth import allgather_cut_bound

__all__ = ["eval_command"]

DEFAULT_SIZES = (2**20, 16 * 2**20, 128 * 2**20, 2**30)
BYTES_PER_ELEMENT = 4  # nccl-tests' count column, for float32


@click.command("eval")
@click.argument("schedule", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--topology", required=True, help="File or builder call the schedule runs on.")
@click.option("--fault", "faults", multiple=True, help="Faults to apply to the topology (repeatable).")
@click.option("--size", "sizes", type=SizeParam(), multiple=True,
              help="nccl-tests size S (AllGather: output per rank; AllToAll: send buffer per rank); repeatable.")
@click.option("--step-overhead-us", type=FiniteFloat(0.0, 1e9), default=0.0, help="Fixed software latency per step (µs).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the table as CSV.")
@click.option("--model", type=click.Choice(["alpha-beta", "flow"]), default="alpha-beta", show_default=True,
              help="alpha-beta: the analytic model (links at their steady-state load, perfect pipelining); flow: the "
                   "flow-level simulator (max-min fair sharing, chunk dependencies, the critical chain).")
@click.option("--slices", type=click.IntRange(1, 1024), default=None,
              help="flow model: every chunk moves as this many pipelined slices (default 4); 1 = store and forward.")
def eval_command(schedule: Path, topology: str, faults: tuple[str, ...], sizes: tuple[int, ...],
                 step_overhead_us: float, csv_path: Path | None, model: str, slices: int | None) -> None:
    """Estimate time, algbw and busbw of SCHEDULE on a fabric."""
    if model == "flow" and step_overhead_us:
        raise click.UsageError("--step-overhead-us belongs to the alpha-beta model")
    if model == "alpha-beta" and slices is not None:
        raise click.UsageError("--slices belongs to the flow model (--model flow)")
    if csv_path is not None and not (csv_path.parent if str(csv_path.parent) else Path(".")).is_dir():
        raise click.UsageError(f"--csv {csv_path}: no folder {csv_path.parent} to write it in")  # before the table
    plan = load_schedule(schedule)
    fabric = load_topology_arg(topology, faults)
    validate(plan, fabric)
    how = "α-β model" if model == "alpha-beta" else f"flow simulation, {slices or 4} slices per chunk"
    table = Table(title=f"{plan.collective.value} by {plan.meta.synthesizer} on {fabric.name} ({plan.n_ranks} ranks; "
                        f"{how})")
    for column in ("size (B)", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        table.add_column(column, justify="right")
    rows = []
    chains = []
    for size in sizes or DEFAULT_SIZES:
        result = evaluate(plan, fabric, size, step_overhead_us=step_overhead_us)
        if model == "flow":
            run = simulate_schedule(plan, fabric, size, options=SimOptions(slices=slices or 4))
            time_s, algbw, busbw = run.time_s, run.algbw_gbs, run.busbw_gbs
            chains.append(f"{format_size(size)}: {chain_summary(run, fabric)}")
        else:
            time_s, algbw, busbw = result.time_s, result.algbw_gbs, result.busbw_gbs
        rows.append((size, size // BYTES_PER_ELEMENT, "float", f"{time_s * 1e6:.1f}", f"{algbw:.2f}", f"{busbw:.2f}"))
        table.add_row(*(str(value) for value in rows[-1]))
    console.print(table)
    if chains:
        console.print("critical chain: " + "; ".join(chains))
    if csv_path is not None:
        handle = io.StringIO(newline="")
        writer = csv.writer(handle)
        writer.writerow(["size", "count", "type", "time_us", "algbw_gbs", "busbw_gbs"])
        writer.writerows(rows)
        write_outputs({csv_path: handle.getvalue()})
    links = ", ".join(f"{fabric.links[a].src}->{fabric.links[a].dst}" for a in result.bottleneck_links[:6])
    more = f" (+{len(result.bottleneck_links) - 6} more)" if len(result.bottleneck_links) > 6 else ""
    console.print(f"steady-state algbw {result.steady_state_algbw_gbs:.2f} GB/s, paced by {links}{more}")
    if plan.collective is Collective.ALLGATHER:
        bound = allgather_cut_bound(fabric, plan.ranks)
        console.print(f"AllGather cut bound on this fabric: {bound.algbw_gbs:.2f} GB/s algbw; this schedule reaches "
                      f"{100 * result.steady_state_algbw_gbs / bound.algbw_gbs:.1f}% of it (sizes: "
                      f"{', '.join(format_size(s) for s in sizes or DEFAULT_SIZES)})")
