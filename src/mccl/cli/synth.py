"""``mccl synth ring|direct``: make a schedule and write it to a file."""

from __future__ import annotations

from pathlib import Path

import click

from mccl.cli.common import console, load_topology_arg, write_outputs
from mccl.schedule import Collective, Schedule, dumps_schedule, validate
from mccl.synth import DirectOptions, RingOptions, optimize

__all__ = ["synth_group"]

_RINGS = ("locality", "naive", "nccl")  # registered as ring.<kind>


@click.group("synth")
def synth_group() -> None:
    """Synthesize schedules."""


def _report(schedule: Schedule, out: Path, also: dict[Path, str] | None = None) -> None:
    """Write the schedule (and ``also``: other outputs of the command) all or nothing, then describe it."""
    write_outputs({out: dumps_schedule(schedule), **(also or {})})
    meta = schedule.meta
    cut = ", ".join(f"{c.link}" for c in meta.bottleneck_cut[:8]) + (" ..." if len(meta.bottleneck_cut) > 8 else "")
    console.print(f"wrote {out}: {schedule.collective.value} by {meta.synthesizer} on {meta.topology}, "
                  f"{schedule.n_ranks} ranks, {len(schedule.chunks)} chunks, {len(schedule.transfers)} transfers, "
                  f"{schedule.transfers.n_steps} steps")
    console.print(f"steady-state algbw {meta.achieved_gbs:.2f} GB/s; bottleneck links [{cut}]")


def _ranks_option(text: str | None) -> list[str] | None:
    """``--ranks gpu0,gpu1,...`` as a list; a GPU named twice is a usage error naming it."""
    if text is None:
        return None
    gpus = [gpu.strip() for gpu in text.split(",") if gpu.strip()]
    twice = next((gpu for position, gpu in enumerate(gpus) if gpu in gpus[:position]), None)
    if twice is not None:
        raise click.BadParameter(f"GPU {twice!r} is given twice; each rank needs a GPU of its own",
                                 param_hint="'--ranks'")
    return gpus


_topology_option = click.option("--topology", "topology", required=True, help="File or builder call, e.g. 'rail_optimized(1,2,8)'.")
_fault_option = click.option("--fault", "faults", multiple=True, help="Faults to apply (repeatable).")
_ranks = click.option("--ranks", default=None, help="Comma-separated GPU ids, rank order (default: all GPUs).")
_out = click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Schedule file (JSON).")


@synth_group.command("ring")
@_topology_option
@_fault_option
@click.option("--collective", type=click.Choice(["allgather", "reducescatter", "allreduce"]), default="allgather")
@click.option("--kind", type=click.Choice(_RINGS), default="nccl", help="Ring construction.")
@click.option("--channels", type=click.IntRange(1, 1024), default=None, help="Rings (NCCL channels); default GPUs per host.")
@click.option("--chunks", type=click.IntRange(1, 1024), default=1, help="Chunks per block and ring.")
@_ranks
@_out
def ring(topology: str, faults: tuple[str, ...], collective: str, kind: str, channels: int | None, chunks: int,
         ranks: str | None, out: Path) -> None:
    """Ring schedules: NCCL-style rail rings, the naive rank-order ring, the locality-aware ring."""
    fabric = load_topology_arg(topology, faults)
    if kind == "naive" and channels not in (None, 1):
        raise click.UsageError("the naive ring has one channel")
    schedule = optimize(fabric, Collective(collective), _ranks_option(ranks), method=f"ring.{kind}",
                        options=RingOptions(chunks=chunks, channels=channels)).schedule
    validate(schedule, fabric)
    _report(schedule, out)


@synth_group.command("direct")
@_topology_option
@_fault_option
@click.option("--chunks", type=click.IntRange(1, 1024), default=1, help="Chunks per block.")
@click.option("--pxn/--no-pxn", default=True, help="Relay cross-rail sends over the NVSwitch, as NCCL's PXN does.")
@_ranks
@_out
def direct(topology: str, faults: tuple[str, ...], chunks: int, pxn: bool, ranks: str | None, out: Path) -> None:
    """NCCL-style AllToAll: direct all-pairs sends."""
    fabric = load_topology_arg(topology, faults)
    schedule = optimize(fabric, Collective.ALLTOALL, _ranks_option(ranks), method="alltoall.direct",
                        options=DirectOptions(chunks=chunks, pxn=pxn)).schedule
    validate(schedule, fabric)
    _report(schedule, out)
