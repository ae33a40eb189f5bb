"""Shared pieces of the ``mccl`` command: argument types and output helpers."""

from __future__ import annotations

import re
import sys

import click
from rich.console import Console

from mccl.errors import MCCLError
from mccl.topology import Topology, apply_faults, parse_topology

__all__ = ["parse_size", "format_size", "console", "load_topology_arg", "SizeParam"]

# Wide enough for nccl-tests-style tables when the output is a file or a pipe.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``128MB`` → bytes. K/M/G are binary (as in nccl-tests' ``-b 128M``); ``MiB`` works too."""
    match = _SIZE.match(text)
    if not match:
        raise MCCLError(f"cannot read size {text!r}; use bytes or a K/M/G suffix, e.g. 128MB")
    value = float(match[1]) * _UNITS[match[2].lower()]
    if value <= 0:
        raise MCCLError(f"size must be positive, got {text!r}")
    return int(value)


def format_size(size: float) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}B"


class SizeParam(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except MCCLError as error:
            self.fail(str(error), param, ctx)


def load_topology_arg(text: str, faults: tuple[str, ...] = ()) -> Topology:
    """A topology from a file or a builder call, with ``--fault`` options applied."""
    return apply_faults(parse_topology(text), list(faults))
