"""The ``mccl`` command. Bad input ends in one line on stderr and exit code 2."""

from __future__ import annotations

import sys

import click

from mccl import __version__
from mccl.cli.control import controller_command, controller_status_command, demo_command
from mccl.cli.evaluate import eval_command
from mccl.cli.provider import provider_group
from mccl.cli.sim import sim_command
from mccl.cli.synth import synth_group
from mccl.cli.synth_allgather import allgather as _allgather  # noqa: F401 - registers `synth allgather`
from mccl.cli.synth_alltoall import alltoall as _alltoall  # noqa: F401  (registers `synth alltoall`)
from mccl.cli.topo import topo_group
from mccl.errors import MCCLError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mccl")
def cli() -> None:
    """mccl: collective schedules kept matched to the network a job really has."""


cli.add_command(topo_group)
cli.add_command(synth_group)
cli.add_command(eval_command)
cli.add_command(sim_command)
cli.add_command(controller_command)
cli.add_command(controller_status_command)
cli.add_command(demo_command)
cli.add_command(provider_group)


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="mccl", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("mccl: aborted", err=True)
        return 130
    except click.ClickException as error:
        click.echo(f"mccl: {error.format_message()}", err=True)
        return 2
    except MCCLError as error:
        click.echo(f"mccl: error: {error}", err=True)
        return 2
    except OSError as error:
        click.echo(f"mccl: error: {error}", err=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
