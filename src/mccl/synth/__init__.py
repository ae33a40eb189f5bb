"""Synthesizers: from a topology (and ranks) to a validated-shape Schedule with its proof.

One entry point, :func:`optimize`, over one registry (:mod:`.registry`): every method,
optimal (spanning-tree packing in :mod:`.treepack`, column generation in
:mod:`.alltoall`, AllReduce composed in :mod:`.compose`) or baseline (rings in
:mod:`.ring`, direct AllToAll in :mod:`.direct`), takes the same arguments and returns a
:class:`SynthesisResult`; each has a typed options class (:mod:`.options`). Bounds every
schedule must respect live in :mod:`.bounds`.
"""

from mccl.synth.bounds import CutBound, allgather_cut_bound
from mccl.synth.optimize import optimize
from mccl.synth.options import AllToAllOptions, ComposedOptions, DirectOptions, RingOptions, TreePackOptions
from mccl.synth.registry import METHODS, methods_for
from mccl.synth.result import SynthesisResult

__all__ = [
    "AllToAllOptions",
    "ComposedOptions",
    "CutBound",
    "DirectOptions",
    "METHODS",
    "RingOptions",
    "SynthesisResult",
    "TreePackOptions",
    "allgather_cut_bound",
    "methods_for",
    "optimize",
]
