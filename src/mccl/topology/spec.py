"""Topologies and faults named by short text, as the CLI and scenario files take them.

A topology is either a file (YAML/JSON) or a builder call such as
``rail_optimized(1,2,8)``, ``spine_leaf(2,2,2,2,100,50)``, ``switch_ring(4,1,2,100)``
or ``single_switch(8,400)``, optionally followed by named faults:
``rail_optimized(1,2,8)+Fail2``.

A fault is ``Fail1`` / ``Fail2`` / ``Fail3`` (mccl-paper §6.1), or a degraded link:
``SRC->DST=GBPS`` (one direction), ``SRC<->DST=GBPS`` (a cable, both directions),
or ``*FACTOR`` instead of ``=GBPS`` (``gpu0<->tor0.0*0.5`` halves a cable).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

from mccl.errors import TopologyError
from mccl.topology.builders import rail_optimized, single_switch, spine_leaf, switch_ring
from mccl.topology.faults import FAULTS, degrade
from mccl.topology.fileformat import load_topology
from mccl.topology.model import Topology

__all__ = ["BUILDERS", "parse_topology", "parse_fault", "apply_faults"]

BUILDERS: dict[str, Callable[..., Topology]] = {
    "rail_optimized": rail_optimized,
    "spine_leaf": spine_leaf,
    "switch_ring": switch_ring,
    "single_switch": single_switch,
}

_MAX_ARGUMENT = 1e6  # builder arguments: counts (hosts, GPUs) and rates (Gbit/s)
_DEGRADE = re.compile(r"^\s*(?P<src>[^<>\-=*\s]+)\s*(?P<arrow><->|->)\s*(?P<dst>[^=*\s]+)\s*(?P<op>[=*])\s*(?P<value>[0-9.eE+-]+)\s*$")


def _call(text: str) -> Topology:
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise TopologyError(f"{text!r} is neither a topology file nor a builder call like rail_optimized(1,2,8)") from None
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Name) or tree.func.id not in BUILDERS:
        raise TopologyError(f"{text!r}: unknown topology builder; known: {', '.join(BUILDERS)}")
    try:
        args = [ast.literal_eval(arg) for arg in tree.args]
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in tree.keywords if kw.arg}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise TopologyError(f"{text!r}: builder arguments must be literal numbers") from None
    for value in [*args, *kwargs.values()]:
        # True is an int to Python, and rail_optimized(True, 2, 2) is not what anyone meant; 10**400
        # would overflow a float, nan compare False with every bound a builder checks
        if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) <= _MAX_ARGUMENT:
            raise TopologyError(f"{text[:80]!r}: builder arguments must be finite numbers up to {_MAX_ARGUMENT:g}, "
                                f"got {str(value)[:40]}")
    try:
        return BUILDERS[tree.func.id](*args, **kwargs)
    except (TypeError, ValueError, OverflowError) as error:
        raise TopologyError(f"{text!r}: {error}") from None


def parse_fault(text: str) -> Callable[[Topology], Topology]:
    """A function applying the fault that ``text`` names."""
    for name, fault in FAULTS.items():
        if name.lower() == text.strip().lower():
            return fault
    match = _DEGRADE.match(text)
    if not match:
        raise TopologyError(
            f"unknown fault {text!r}; use {', '.join(FAULTS)}, SRC->DST=GBPS, SRC<->DST=GBPS or SRC<->DST*FACTOR"
        )
    try:
        value = float(match["value"])
    except ValueError:
        raise TopologyError(f"fault {text!r}: {match['value']!r} is not a number") from None
    pair = (match["src"], match["dst"])
    duplex = match["arrow"] == "<->"
    if match["op"] == "=":
        return lambda topology: degrade(topology, pair, gbps=value, duplex=duplex)
    return lambda topology: degrade(topology, pair, factor=value, duplex=duplex)


def apply_faults(topology: Topology, faults: list[str] | tuple[str, ...]) -> Topology:
    for text in faults:
        topology = parse_fault(text)(topology)
    return topology


def parse_topology(text: str) -> Topology:
    """A topology from a file path or a builder call, with optional ``+Fault`` suffixes."""
    try:
        is_file = Path(text).is_file()
    except (OSError, ValueError):  # a name too long for a path, a NUL: not a file
        is_file = False
    if is_file:
        return load_topology(text)
    head, *faults = _split_faults(text)
    if not re.match(r"^\s*\w+\s*\(", head):
        raise TopologyError(f"{text!r}: no such topology file, and not a builder call like rail_optimized(1,2,8)")
    return apply_faults(_call(head), faults)


def _split_faults(text: str) -> list[str]:
    """Split ``builder(...)+F1+F2`` at the ``+`` signs outside parentheses, but not at the sign of an
    exponent (``gpu0<->tor0.0*1e+5``)."""
    parts, depth, current = [], 0, ""
    for index, char in enumerate(text):
        depth += char == "("
        depth -= char == ")"
        exponent = (index >= 2 and text[index - 1] in "eE" and (text[index - 2].isdigit() or text[index - 2] == ".")
                    and index + 1 < len(text) and text[index + 1].isdigit())
        if char == "+" and depth == 0 and not exponent:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts
