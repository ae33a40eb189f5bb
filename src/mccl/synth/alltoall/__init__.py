"""AllToAll by column generation (mccl-paper §4.2, Appendices D, F, G).

``synthesize(topology, ranks=None, *, previous=None, options=None, **overrides) ->
SynthesisResult``. Read in this order: :mod:`.pipeline` (the pipeline),
:mod:`.generation` (the loop), :mod:`.master`, :mod:`.pricing`, :mod:`.rounding`,
:mod:`.warm` (warm start from a schedule's routes), :mod:`.state` (warm restart from
the solver state a :class:`~mccl.synth.result.SynthesisResult` carries), :mod:`.repair`;
:mod:`.compact` is the arc-based LP that checks the column generation's optimum independently.
"""

from mccl.synth.alltoall.compact import compact_lp
from mccl.synth.alltoall.pipeline import lp_optimum, minimal_steps, synthesize

__all__ = ["compact_lp", "lp_optimum", "minimal_steps", "synthesize"]
