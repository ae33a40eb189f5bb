"""``mccl topo build|show|check``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from mccl.cli.common import console, load_topology_arg, write_outputs
from mccl.topology import NodeKind, Topology, dumps_topology, load_topology

__all__ = ["topo_group"]

MAX_GPU_ROWS = 64


@click.group("topo")
def topo_group() -> None:
    """Build, show and check fabrics."""


@topo_group.command("build", short_help="Write a fabric (a builder call, faults applied) to a file.")
@click.argument("spec")
@click.option("--fault", "faults", multiple=True, help="Fail1|Fail2|Fail3, SRC->DST=GBPS, SRC<->DST*FACTOR (repeatable).")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="File to write (.yaml or .json).")
def build(spec: str, faults: tuple[str, ...], out: Path) -> None:
    """Write the topology SPEC (e.g. 'rail_optimized(1,2,8)') to a file."""
    topology = load_topology_arg(spec, faults)
    write_outputs({out: dumps_topology(topology, "json" if out.suffix.lower() == ".json" else "yaml")})
    counts = topology.summary()
    console.print(f"wrote {out}: {topology.name}, {counts.get('gpu', 0)} GPUs, {counts['links']} links")


def _link_classes(topology: Topology) -> Table:
    classes: Counter[tuple[str, str, float, float]] = Counter()
    for link in topology.links:
        classes[(topology.node(link.src).kind.value, topology.node(link.dst).kind.value, link.gbps, link.latency_us)] += 1
    table = Table(title="directed links by class")
    for column in ("from", "to", "Gbit/s", "latency µs", "count"):
        table.add_column(column, justify="right" if column in ("Gbit/s", "latency µs", "count") else "left")
    for (src, dst, gbps, latency), count in sorted(classes.items()):
        table.add_row(src, dst, f"{gbps:g}", f"{latency:g}", str(count))
    return table


def _gpu_table(topology: Topology) -> Table:
    table = Table(title="GPUs")
    for column in ("GPU", "host", "rail", "rack", "segment", "pod", "intra-host out/in Gbit/s", "NIC", "NIC out/in Gbit/s"):
        table.add_column(column)
    for gpu in topology.gpus[:MAX_GPU_ROWS]:
        node = topology.node(gpu)
        intra, nic = "-", ("-", "-")
        for link_id in topology.out_links[gpu]:
            link = topology.links[link_id]
            back = topology.links_between(link.dst, gpu)
            back_gbps = f"{topology.links[back[0]].gbps:g}" if back else "-"
            kind = topology.node(link.dst).kind
            if kind is NodeKind.NVSWITCH:
                intra = f"{link.gbps:g}/{back_gbps}"
            else:
                nic = (link.dst, f"{link.gbps:g}/{back_gbps}")
        table.add_row(gpu, node.host or "-", "-" if node.rail is None else str(node.rail), node.rack or "-",
                      node.segment or "-", node.pod or "-", intra, *nic)
    if len(topology.gpus) > MAX_GPU_ROWS:
        table.caption = f"first {MAX_GPU_ROWS} of {len(topology.gpus)} GPUs"
    return table


@topo_group.command("show")
@click.argument("topology")
@click.option("--fault", "faults", multiple=True, help="Faults to apply first (repeatable).")
def show(topology: str, faults: tuple[str, ...]) -> None:
    """Print a fabric: a file or a builder call such as 'rail_optimized(1,2,8)'."""
    fabric = load_topology_arg(topology, faults)
    counts = fabric.summary()
    hosts = {fabric.node(gpu).host for gpu in fabric.gpus}
    console.print(Text.assemble((fabric.name, "bold"), f": {counts.get('gpu', 0)} GPUs on {len(hosts)} hosts, "
                  + ", ".join(f"{count} {kind}" for kind, count in counts.items() if kind not in ("gpu", "links"))
                  + f", {counts['links']} directed links"))
    console.print(_gpu_table(fabric))
    console.print(_link_classes(fabric))


@topo_group.command("check")
@click.argument("file", type=click.Path(path_type=Path))
def check(file: Path) -> None:
    """Read a topology file and report the first problem (exit 2), or a summary."""
    fabric = load_topology(file)
    counts = fabric.summary()
    console.print(f"ok: {file}: {fabric.name}, {counts.get('gpu', 0)} GPUs, {counts['links']} directed links; "
                  "every GPU reaches every other")
