"""``mccl synth allgather``: throughput-optimal AllGather by spanning-tree packing (cold or warm)."""

from __future__ import annotations

from pathlib import Path

import click

from mccl.cli.common import console, load_topology_arg, write_outputs
from mccl.cli.synth import synth_group
from mccl.schedule import Collective, dumps_schedule, load_schedule, to_msccl_xml, validate
from mccl.synth import TreePackOptions, optimize
from mccl.synth.options import TREEPACK_MAX_CHUNKS as MAX_CHUNKS

__all__ = ["allgather"]


@synth_group.command("allgather")
@click.option("--topology", "topology", required=True, help="File or builder call, e.g. 'rail_optimized(1,2,8)'.")
@click.option("--fault", "faults", multiple=True, help="Faults to apply (repeatable), e.g. Fail2.")
@click.option("--warm", "warm", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Previous schedule (JSON) to warm-start from.")
@click.option("--chunks", type=click.IntRange(1, MAX_CHUNKS), default=MAX_CHUNKS, show_default=True,
              help="Most chunks (trees) per source.")
@click.option("--latency-aware", is_flag=True, help="Prefer shallow trees (small messages).")
@click.option("--ranks", default=None, help="Comma-separated GPU ids, rank order (default: all GPUs).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Schedule file (JSON).")
@click.option("--msccl-xml", "xml", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the MSCCL XML algorithm here.")
def allgather(topology: str, faults: tuple[str, ...], warm: Path | None, chunks: int, latency_aware: bool,
              ranks: str | None, out: Path, xml: Path | None) -> None:
    """AllGather by optimal spanning-tree packing (ForestColl-style; mccl-paper §4.1)."""
    fabric = load_topology_arg(topology, faults)
    previous = load_schedule(warm) if warm is not None else None
    chosen = None if ranks is None else [gpu.strip() for gpu in ranks.split(",") if gpu.strip()]
    result = optimize(fabric, Collective.ALLGATHER, chosen, previous=previous,
                      options=TreePackOptions(chunks=chunks, latency_aware=latency_aware))
    schedule, stats = result.schedule, result.stats
    validate(schedule, fabric)
    write_outputs({out: dumps_schedule(schedule), **({xml: to_msccl_xml(schedule)} if xml is not None else {})})
    meta = schedule.meta
    cut = ", ".join(f"{c.link}({fabric.links[c.link].src}->{fabric.links[c.link].dst})" for c in meta.bottleneck_cut[:6])
    more = f" ... ({len(meta.bottleneck_cut)} links)" if len(meta.bottleneck_cut) > 6 else ""
    console.print(f"wrote {out}: allgather by {meta.synthesizer} on {meta.topology}, {schedule.n_ranks} ranks, "
                  f"{stats.trees_per_source} chunks per source, {len(schedule.transfers)} transfers, "
                  f"max depth {stats.max_depth}")
    console.print(f"optimum {result.bound_gbs:.2f} GB/s algbw; achieved {result.achieved_gbs:.2f} GB/s "
                  f"(rounding loss {100 * stats.rounding_gap:.3f}%); solve time {stats.solve_time_s:.3f} s")
    if previous is not None and stats.kept_fraction is not None:
        console.print(f"warm start kept {100 * stats.kept_fraction:.1f}% of the previous trees' links")
    console.print(f"bottleneck cut [{cut}{more}]")
    if xml is not None:
        console.print(f"wrote {xml}: MSCCL XML")
