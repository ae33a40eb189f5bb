"""The options of every registered synthesizer: one frozen, keyword-only class per method.

Each class checks its own values when it is made, so a wrong option fails where it is
written, with :class:`~mccl.errors.InvalidOptions` naming the method and the field,
not deep inside a solver. :func:`mccl.synth.optimize` takes an instance of the
method's class (``options=``) and/or field overrides as keywords; an unknown
keyword is an ``InvalidOptions`` listing the fields the method has.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from mccl.errors import InvalidOptions

__all__ = [
    "CGOptions",
    "TreePackOptions",
    "DepthOptions",
    "AllToAllOptions",
    "RingOptions",
    "DirectOptions",
    "ComposedOptions",
    "option_names",
    "resolve_options",
]

TREEPACK_MAX_CHUNKS = 10  # mccl-paper §6: "up to ten chunks"
ALLTOALL_MAX_CHUNKS = 64  # beyond this a block's chunks are too small to schedule sensibly


def option_names(options_type: type) -> tuple[str, ...]:
    """The fields an options class accepts, in declaration order."""
    return tuple(item.name for item in fields(options_type))


def _integer_in(method: str, name: str, value: object, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f">= {low}"
        raise InvalidOptions(method, name, f"must be an integer {span}, got {value!r}")


@dataclass(frozen=True)
class CGOptions:
    """Knobs of the column-generation loop (defaults measured on rail-optimized fabrics)."""

    tolerance: float = 1e-7  # stop when 1 - z_RMP / bound <= tolerance
    reduced_cost_tolerance: float = 1e-9  # add a tree when its reduced cost < -this (α_c sum to 1); = HiGHS dual tolerance
    smoothing: float = 0.5  # Wentges λ; 0 prices at the RMP's duals only
    diversity: int = 2  # extra randomly tie-broken trees per tensor per round
    max_rounds: int = 10_000
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class TreePackOptions:
    """Spanning-tree packing (AllGather, ReduceScatter; :mod:`mccl.synth.treepack`).

    ``chunks``: the most trees (chunks) per source, 1…10; the rounding picks the best k ≤ it.
    ``latency_aware``: prefer shallow trees (mccl-paper Appendix C) at equal throughput.
    """

    chunks: int = TREEPACK_MAX_CHUNKS
    latency_aware: bool = False

    def __post_init__(self) -> None:
        _integer_in("treepack", "chunks", self.chunks, 1, TREEPACK_MAX_CHUNKS)


DEPTH_CANDIDATES = ("packing", "latency_aware", "rail", "host-rail")


@dataclass(frozen=True, kw_only=True)
class DepthOptions:
    """AllGather trees chosen by estimated completion time at the job's size (:mod:`mccl.synth.treepack.depth`).

    ``size_bytes``: the AllGather's size S (nccl-tests: the output buffer per rank) the choice is
    made for; the default, 16 MiB, is a mid-size bucket where depth already costs a third of the
    time on 16 GPUs. ``candidates``: which to weigh, of ``packing`` (the optimal packing),
    ``latency_aware`` (its App. C shallow variant), ``rail`` and ``host-rail`` (depth-2 / depth-3
    trees from the host and rail structure). ``chunks``: most trees per source of the packings.
    """

    size_bytes: float = float(16 << 20)
    candidates: tuple[str, ...] = DEPTH_CANDIDATES
    chunks: int = TREEPACK_MAX_CHUNKS

    def __post_init__(self) -> None:
        method = "treepack.depth"
        if isinstance(self.size_bytes, bool) or not isinstance(self.size_bytes, int | float) or not self.size_bytes > 0:
            raise InvalidOptions(method, "size_bytes", f"must be a positive number of bytes, got {self.size_bytes!r}")
        if not isinstance(self.candidates, tuple) or not self.candidates:
            raise InvalidOptions(method, "candidates", f"must be a non-empty tuple, got {self.candidates!r}")
        unknown = [name for name in self.candidates if name not in DEPTH_CANDIDATES]
        if unknown:
            raise InvalidOptions(method, "candidates", f"unknown {unknown!r}; choose from {', '.join(DEPTH_CANDIDATES)}")
        _integer_in(method, "chunks", self.chunks, 1, TREEPACK_MAX_CHUNKS)


@dataclass(frozen=True, kw_only=True)
class AllToAllOptions:
    """Column generation with rounding (AllToAll; :mod:`mccl.synth.alltoall`).

    ``chunks``: K, most chunks per (source, destination) block. ``time_limit_s``: budget for
    the column generation; the best schedule by then comes with its proven gap.
    ``max_steps``: None (unbounded), m ≥ 1 transfers per path, or "auto" (App. D search).
    ``grouping``: commodity blocks, "tensor" (one per source) or "host".
    ``seed_rounds`` / ``warm_seed_rounds``: multiplicative-weights rounds of first columns,
    cold / on top of the previous routes when warm from a schedule file.
    ``warm_pivots``: simplex pivots a warm start from a schedule's routes may spend before
    it falls back to the cold path (None: 2 per master row). ``cg``: the loop's knobs.
    """

    chunks: int = 10
    time_limit_s: float | None = None
    max_steps: int | str | None = None
    grouping: str = "tensor"
    seed_rounds: int = 8
    warm_seed_rounds: int = 1
    warm_pivots: int | None = None
    cg: CGOptions = field(default_factory=CGOptions)

    def __post_init__(self) -> None:
        method = "alltoall.cg"
        _integer_in(method, "chunks", self.chunks, 1, ALLTOALL_MAX_CHUNKS)
        if self.time_limit_s is not None and not (isinstance(self.time_limit_s, int | float) and self.time_limit_s > 0):
            raise InvalidOptions(method, "time_limit_s", f"must be a positive number of seconds, got {self.time_limit_s!r}")
        if self.max_steps is not None and self.max_steps != "auto":
            _integer_in(method, "max_steps", self.max_steps, 1)
        if self.grouping not in ("tensor", "host"):
            raise InvalidOptions(method, "grouping", f"must be 'tensor' or 'host', got {self.grouping!r}")
        _integer_in(method, "seed_rounds", self.seed_rounds, 1)
        _integer_in(method, "warm_seed_rounds", self.warm_seed_rounds, 0)
        if self.warm_pivots is not None:
            _integer_in(method, "warm_pivots", self.warm_pivots, 1)
        if not isinstance(self.cg, CGOptions):
            raise InvalidOptions(method, "cg", f"must be a CGOptions, got {type(self.cg).__name__}")


@dataclass(frozen=True, kw_only=True)
class RingOptions:
    """Ring baselines (naive, NCCL-style rail rings, MCCS locality-aware; :mod:`mccl.synth.ring`).

    ``chunks``: chunks per block and ring. ``channels``: rings (NCCL channels); None = GPUs per
    host. The naive ring has one channel.
    """

    chunks: int = 1
    channels: int | None = None

    def __post_init__(self) -> None:
        _integer_in("ring", "chunks", self.chunks, 1)
        if self.channels is not None:
            _integer_in("ring", "channels", self.channels, 1)


@dataclass(frozen=True, kw_only=True)
class DirectOptions:
    """NCCL-style direct AllToAll (:mod:`mccl.synth.direct`).

    ``chunks``: chunks per block. ``pxn``: relay cross-rail sends over the NVSwitch, as NCCL's PXN.
    """

    chunks: int = 1
    pxn: bool = True

    def __post_init__(self) -> None:
        _integer_in("alltoall.direct", "chunks", self.chunks, 1)


@dataclass(frozen=True, kw_only=True)
class ComposedOptions:
    """AllReduce as ReduceScatter then AllGather (:mod:`mccl.synth.compose`).

    ``reducescatter`` / ``allgather``: the registered methods of the two phases, with their
    options (None: the method's defaults).
    """

    reducescatter_method: str = "treepack"
    allgather_method: str = "treepack"
    reducescatter: object | None = None
    allgather: object | None = None


def resolve_options(method: str, options_type: type, options: object | None, overrides: dict[str, object]) -> Any:
    """``options`` (default: the class's defaults) with ``overrides`` applied, checked.

    ``options`` must be an instance of ``options_type``; every override must be one of its
    fields. Either mistake is an :class:`InvalidOptions` naming the method and what it accepts."""
    if options is None:
        options = options_type()
    elif not isinstance(options, options_type):
        raise InvalidOptions(method, None, f"expected {options_type.__name__}, got {type(options).__name__}")
    if not overrides:
        return options
    accepted = option_names(options_type)
    for name in overrides:
        if name not in accepted:
            raise InvalidOptions(method, name, f"not an option of {method!r}; it has {', '.join(accepted)}")
    return replace(options, **overrides)
