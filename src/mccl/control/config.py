"""The controller's settings (:class:`ControlConfig`), checked where they are written.

How to choose ``alpha`` and ``gamma`` from the collective rate and the noise: see
``src/mccl/experiments/README.md`` ("Choosing α and Γ")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mccl.errors import ControllerError, InvalidOptions, SynthesisUnavailable
from mccl.schedule import Collective
from mccl.synth.registry import method_for

__all__ = ["ControlConfig"]


@dataclass(frozen=True, kw_only=True)
class ControlConfig:
    """``alpha``: EWMA smoothing factor (§3.2; paper prototype 0.012 at one sample per chunk
    on GPUs — here a sample is a whole saturated window, so larger values fit). ``gamma``: the
    drift threshold Γ on max δ_a. ``warmup``: collectives in each version's reference window (a link
    sampled fewer than ⌈warmup/2⌉ times in it gets no reference, :mod:`mccl.control.ewma`).
    ``settle_collectives``: first collectives of a communicator whose samples are ignored.
    ``methods``: the synthesizer per collective (default: :func:`mccl.synth.optimize`'s choice);
    ``alpha_level``: a second, faster EWMA of the same samples that the synthesizer's
    measured topology is taken from (None: the detection EWMA itself). Why: a slow ``alpha``
    filters microbursts but has moved only about Γ when it flags a deep change, so a schedule
    made from a slow estimate would be made for a partial depth; with ``alpha_level`` it is made
    for the current level. ``synth_options``: that method's options object per collective (e.g.
    ``{Collective.ALLTOALL: AllToAllOptions(chunks=4)}``): each collective gets only its own.
    ``guard``: compare every re-synthesized schedule with the active one and the NCCL-style
    baseline before a swap and keep the fastest (:mod:`.guard`); ``guard_tolerance``: how much
    faster (relative) the active one or the baseline must be predicted to win over the candidate;
    ``guard_size_bytes``: the collective size S compared at when neither the registration nor
    telemetry gives one. ``max_events``: how many of its most recent :class:`~mccl.control.records.Event`
    records the manager keeps (a long-running service must not grow without bound).
    ``schedule_format``: how the schedules the ranks fetch are encoded — "binary" (the binary file
    in its text form, :mod:`mccl.schedule.binary`: ~30× cheaper to encode at 512 GPUs) or "json"
    (the readable file); the ranks read either. ``absolute_rates``: the ranks' path rates and collective times
    are in the topology's units (the flow simulator and the rate model, whose topology is the fabric; not the
    emulated fabric, 1/20000 of its topology, nor hardware in general): then the link that slowed a collective
    is read at the traffic it carries now before a re-synthesis (:mod:`.saturation`)."""

    alpha: float = 0.3
    gamma: float = 0.2
    alpha_level: float | None = None
    warmup: int = 3
    settle_collectives: int = 3
    methods: Mapping[Collective, str] = field(default_factory=lambda: MappingProxyType({}))
    synth_options: Mapping[Collective, object] = field(default_factory=lambda: MappingProxyType({}))
    guard: bool = True
    guard_tolerance: float = 0.01
    guard_size_bytes: float = float(2**30)
    max_events: int = 10_000
    schedule_format: str = "binary"
    absolute_rates: bool = False

    def __post_init__(self) -> None:
        # Non-finite or out-of-range values are refused where they are written: gamma = nan or inf
        # would silently switch the drift test off (every comparison with it is False).
        for name, low, high in (("alpha", 0.0, 1.0), ("gamma", 0.0, float("inf"))):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or not low < value <= high:
                raise ControllerError(f"{name} must be a finite number in ({low:g}, {high:g}], got {value!r}")
        if self.alpha_level is not None and (isinstance(self.alpha_level, bool) or not isinstance(
                self.alpha_level, int | float) or not 0.0 < self.alpha_level <= 1.0):
            raise ControllerError(f"alpha_level must be None or a number in (0, 1], got {self.alpha_level!r}")
        for name, low in (("warmup", 1), ("settle_collectives", 0), ("max_events", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ControllerError(f"{name} must be an integer >= {low}, got {value!r}")
        for name in ("guard", "absolute_rates"):  # a string ("false") or a number would read as on
            if not isinstance(getattr(self, name), bool):
                raise ControllerError(f"{name} must be True or False, got {getattr(self, name)!r}")
        tolerance = self.guard_tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0.0 <= tolerance < 1.0:
            raise ControllerError(f"guard_tolerance must be a number in [0, 1), got {tolerance!r}")
        size = self.guard_size_bytes
        if isinstance(size, bool) or not isinstance(size, int | float) or not (0.0 < size < math.inf):
            raise ControllerError(f"guard_size_bytes must be a positive finite number of bytes, got {size!r}")
        if self.schedule_format not in ("binary", "json"):
            raise ControllerError(f"schedule_format must be 'binary' or 'json', got {self.schedule_format!r}")
        for name in ("methods", "synth_options"):
            given = getattr(self, name)
            object.__setattr__(self, name, MappingProxyType({Collective(key): value for key, value in given.items()}))
        for kind, options in self.synth_options.items():
            # A wrong options class fails here, where it is written, not at the first re-synthesis.
            # A method nothing registers is left to re-synthesis, which reports it as "unavailable".
            try:
                method = method_for(kind, self.methods.get(kind))
            except SynthesisUnavailable:
                continue
            if options is not None and not isinstance(options, method.options):
                raise InvalidOptions(method.name, None, f"expected {method.options.__name__} for {kind.value}, "
                                                         f"got {type(options).__name__}")
