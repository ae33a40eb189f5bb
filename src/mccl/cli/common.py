"""Shared pieces of the ``mccl`` command: argument types and output helpers.

The console never interprets rich markup (``markup=False``): names, paths and schedule
fields come from users, and ``[/x]`` in one would otherwise raise ``MarkupError``
(or restyle the output). Styling is done with ``rich.text.Text`` where wanted.
Every file a command writes goes through :func:`write_outputs`: all of a command's
files are written to temporary files first and renamed into place only when all of
them were written, so a failed command leaves no new file and never damages an old one.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console

from mccl.errors import MCCLError
from mccl.topology import Topology, apply_faults, parse_topology
from mccl.topology.fileformat import new_file_mode

__all__ = ["parse_size", "format_size", "console", "load_topology_arg", "SizeParam", "FiniteFloat", "write_outputs"]

# Wide enough for nccl-tests-style tables when the output is a file or a pipe.
console = Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 140)
MAX_SIZE = 1 << 50  # 1 PiB: above any buffer a collective moves

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``128MB`` → bytes. K/M/G are binary (as in nccl-tests' ``-b 128M``); ``MiB`` works too."""
    match = _SIZE.match(text)
    if not match and text.strip().startswith("-"):
        raise MCCLError(f"size must be positive, got {text[:40]!r}")
    if not match:
        raise MCCLError(f"cannot read size {text!r}; use bytes or a K/M/G suffix, e.g. 128MB")
    value = float(match[1]) * _UNITS[match[2].lower()]
    if not math.isfinite(value) or value > MAX_SIZE:
        raise MCCLError(f"size {text[:40]!r} is larger than {MAX_SIZE} bytes (1 PiB)")
    if value <= 0:
        raise MCCLError(f"size must be positive, got {text!r}")
    if value != int(value):
        raise MCCLError(f"size {text!r} is not a whole number of bytes")
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


class FiniteFloat(click.ParamType):
    """A finite float in ``[low, high]`` (click's FloatRange lets NaN through: every comparison with it is False)."""

    name = "number"

    def __init__(self, low: float = -math.inf, high: float = math.inf) -> None:
        self.low, self.high = low, high

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{str(value)[:40]!r} is not a number", param, ctx)
        if not math.isfinite(number) or not self.low <= number <= self.high:
            self.fail(f"{str(value)[:40]!r} is not a finite number in [{self.low:g}, {self.high:g}]", param, ctx)
        return number


def write_outputs(files: dict[Path, str | bytes]) -> None:
    """Write every file of a command, or none (see module docstring). OSError names the file that failed."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            payload = data.encode() if isinstance(data, str) else data
            directory = path.parent if str(path.parent) else Path(".")
            try:
                descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
            except OSError as error:  # name the file asked for, not the temporary one beside it
                raise OSError(error.errno, f"cannot write {path}: {error.strerror}") from None
            staged.append((temporary, path))
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, new_file_mode())
        for temporary, path in staged:
            os.replace(temporary, path)
    except BaseException:
        for temporary, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        raise


def load_topology_arg(text: str, faults: tuple[str, ...] = ()) -> Topology:
    """A topology from a file or a builder call, with ``--fault`` options applied."""
    return apply_faults(parse_topology(text), list(faults))
