"""``mccl controller`` (run the controller service), ``mccl controller-status`` (ask a running one) and
``mccl demo`` (the live closed loop).

Both import their libraries lazily: ``mccl demo`` loads torch, nothing else here does.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from mccl.cli.common import FiniteFloat, console, load_topology_arg

__all__ = ["controller_command", "controller_status_command", "demo_command"]


@click.command("controller")
@click.option("--topology", "topology_text", required=True, help="topology file or builder call, e.g. rail_optimized(1,2,8)")
@click.option("--fault", "faults", multiple=True, help="fault applied to the nominal topology (rarely wanted)")
@click.option("--bind", default="tcp://127.0.0.1:5555", show_default=True, help="ZeroMQ endpoint to bind")
@click.option("--alpha", default=0.3, show_default=True, type=FiniteFloat(), help="EWMA smoothing factor α (§3.2)")
@click.option("--gamma", default=0.2, show_default=True, type=FiniteFloat(), help="drift threshold Γ on max δ_a (Algorithm 1)")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), envvar="MCCL_CONTROL_SECRET_FILE",
              default=None, help="the job's control-plane secret (read if it exists, else created 0600); default: a "
                                 "fresh one in a private temporary file, removed on exit. Executors get it through "
                                 "MCCL_CONTROL_SECRET_FILE.")
@click.option("--insecure", is_flag=True, help="no authentication (loopback binds only)")
@click.option("--warm/--no-warm", default=True, show_default=True,
              help="while serving, synthesize AllGather and AllToAll once in the background (and warm, on faults of "
                   "the fabric), so that the first reaction loads no synthesizer kernels; a first run compiles "
                   "them (up to a minute)")
def controller_command(topology_text: str, faults: tuple[str, ...], bind: str, alpha: float, gamma: float,
                       secret_file: Path | None, insecure: bool, warm: bool) -> None:
    """Run the controller service until interrupted (executors connect with mccl.control.ControllerClient)."""
    from mccl.control import ControlConfig, ControllerService, ScheduleManager
    from mccl.control.ahead import warm_in_background
    from mccl.control.auth import is_loopback, new_secret, read_secret_file, write_secret_file

    _check_tcp_port(bind)
    if insecure and not is_loopback(bind):
        raise click.UsageError(f"--insecure serves loopback, ipc or inproc endpoints only, not {bind}")
    config = ControlConfig(alpha=alpha, gamma=gamma)  # refuses non-finite / out-of-range values before anything else
    topology = load_topology_arg(topology_text, faults)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scratch: Path | None = None
    secret = None
    if not insecure:
        if secret_file is not None and secret_file.exists():
            secret = read_secret_file(secret_file)
        else:
            if secret_file is None:
                scratch = Path(tempfile.mkdtemp(prefix="mccl-controller-"))  # 0700
                secret_file = scratch / "control.key"
            secret = write_secret_file(secret_file, new_secret()) and read_secret_file(secret_file)
        secret_file = secret_file.resolve()  # what executors started from another directory must be given
    try:
        manager = ScheduleManager(topology, config)
        service = ControllerService(manager, bind, secret=secret, authenticate=not insecure)
        mode = "UNAUTHENTICATED" if insecure else f"secret in {secret_file}"
        console.print(f"mccl controller for {topology.name} at {service.address} (α={alpha:g}, "
                      f"Γ={gamma:g}; {mode}); Ctrl-C stops", soft_wrap=True)
        if secret_file is not None:
            console.print(f"executors: export MCCL_CONTROL_SECRET_FILE={secret_file}", soft_wrap=True)
        if warm:  # the first speculation or flag would load (or, on a first run, compile) them on the check thread
            warm_in_background(manager, say=lambda text: console.print(text, soft_wrap=True))
        signal.signal(signal.SIGTERM, _interrupt)  # (what `kill` and service managers send: ends it as Ctrl-C does)
        try:
            service.serve_forever()
        except KeyboardInterrupt:
            console.print("stopped")
    finally:
        if scratch is not None:  # (before, a SIGTERM left the temporary secret file behind)
            shutil.rmtree(scratch, ignore_errors=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _check_tcp_port(endpoint: str) -> None:
    """A tcp endpoint's port must be 1-65535 or ``*`` (any free one): libzmq binds a random port for any
    other number without a word, so executors told the asked-for port would never reach the service."""
    if not endpoint.startswith("tcp://"):
        return
    port = endpoint.rsplit(":", 1)[-1] if endpoint.count(":") >= 2 else ""
    if port == "*" or (port.isdigit() and 1 <= int(port) <= 65535):
        return
    raise click.UsageError(f"--bind {endpoint}: a tcp endpoint needs a port of 1-65535 or '*' (tcp://HOST:PORT)")


@click.command("controller-status")
@click.option("--endpoint", default="tcp://127.0.0.1:5555", show_default=True, help="the controller's endpoint")
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              envvar="MCCL_CONTROL_SECRET_FILE", default=None, help="the job's control-plane secret")
@click.option("--timeout", "timeout_s", default=5.0, show_default=True, type=FiniteFloat(1e-3, 86400.0),
              help="seconds to wait (a negative or zero wait is refused: it waited forever)")
def controller_status_command(endpoint: str, secret_file: Path | None, timeout_s: float) -> None:
    """Ask a running controller for its status: its counters, and which path ran each rank's calls
    (an mccl schedule and its version, or delegated to the wrapped transport)."""
    from mccl.control import ControllerClient
    from mccl.control.auth import read_secret_file

    secret = read_secret_file(secret_file) if secret_file is not None else None
    client = ControllerClient(endpoint, "status", -1, secret=secret)
    try:
        reply = client.request("status", timeout_s=timeout_s)
    finally:
        client.close()
    stats = reply.get("stats", {})
    console.print(", ".join(f"{key} {value}" for key, value in stats.items()), soft_wrap=True)
    print_calls(reply.get("calls", {}))


def print_calls(calls: dict) -> None:
    """One table per communicator: a row per (operation, path), a column per rank."""
    for communicator, ranks in sorted(calls.items()):
        rank_ids = sorted(ranks, key=int)
        rows: dict[tuple[str, str], dict[str, int]] = {}
        for rank in rank_ids:
            for op, path, version, count in ranks[rank]:
                label = f"schedule v{version}" if path == "schedule" else path
                rows.setdefault((op, label), {})[rank] = count
        table = Table(title=f"calls of communicator {communicator} by path")
        table.add_column("operation")
        table.add_column("path")
        for rank in rank_ids:
            table.add_column(f"rank {rank}", justify="right")
        for (op, label), counts in sorted(rows.items()):
            table.add_row(op, label, *(str(counts.get(rank, 0)) for rank in rank_ids))
        console.print(table)
    if not calls:
        console.print("no rank has reported its calls")


@click.command("demo")
@click.option("--ranks", default=4, show_default=True, type=click.Choice(["4", "8"]), help="pacer: gloo ranks (GPUs)")
@click.option("--quick", is_flag=True, help="fewer collectives (for tests)")
@click.option("--alpha", default=None, type=FiniteFloat(), help="EWMA smoothing factor α [default: 0.5 pacer, 0.15 netemu]")
@click.option("--gamma", default=None, type=FiniteFloat(), help="drift threshold Γ [default: 0.2 pacer, 0.3 netemu]")
@click.option("--fabric", type=click.Choice(["netemu", "pacer"]), default="netemu", show_default=True,
              help="netemu: network namespaces + tc-shaped veths, 8 ranks on 2 hosts, AllGather + AllToAll (needs root "
                   "and iproute2; without them one line says so and the pacer runs); pacer: in-process paced sends")
@click.option("--out", default="plots", show_default=True, help="directory of the timeline PNG")
def demo_command(ranks: str, quick: bool, alpha: float | None, gamma: float | None, fabric: str, out: str) -> None:
    """The closed loop live: gloo ranks run collectives, a NIC degrades, the controller re-synthesizes."""
    from mccl.control import ControlConfig
    from mccl.experiments.demo import DemoConfig, run_demo
    from mccl.experiments.netemu.present import live_row, plot_timeline, print_summary

    # Checked here, before a fabric or a process starts: a bad α or Γ otherwise surfaced as the controller
    # subprocess's traceback (after the emulated fabric was built) and a "controller exited" line.
    ControlConfig(**{key: value for key, value in (("alpha", alpha), ("gamma", gamma)) if value is not None})
    if fabric == "netemu":
        from mccl.experiments.netemu.present import run_and_print

        if run_and_print(console, quick=quick, alpha=alpha, gamma=gamma, out=out):
            return
    knobs = {key: value for key, value in (("alpha", alpha), ("gamma", gamma)) if value is not None}
    if quick:
        knobs.update(healthy=10, after_swap=5, max_degraded=30)
    config = DemoConfig.pacer(int(ranks), **knobs)
    console.print(Text(f"pacer: {config.ranks} ranks on {config.topology_spec}, rank {config.fault_rank}'s NIC (gpu0 -> "
                       f"tor0.0) degraded to {config.fault_factor:g} of its rate (transmit side) after "
                       f"{config.healthy} collectives", style="dim"))
    report = run_demo(config, progress=lambda text: console.print(Text(text, style="dim")), on_collective=live_row(console))
    print_summary(console, report)
    console.print(f"timeline: {plot_timeline(report, out, 'pacer_demo')}")
