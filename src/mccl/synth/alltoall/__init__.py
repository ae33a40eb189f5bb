"""AllToAll by column generation (mccl-paper §4.2, Appendices D, F, G).

``synthesize(topology, ranks=None, *, previous=None, chunks=10, time_limit_s=None,
max_steps=None, ...) -> Schedule``. Read in this order: :mod:`.pipeline` (the
pipeline), :mod:`.generation` (the loop), :mod:`.master`, :mod:`.pricing`,
:mod:`.rounding`, :mod:`.warm` (warm start from a schedule's routes),
:mod:`.state` (warm restart from the solver state kept with a schedule made in
this process); :mod:`.compact` is the arc-based LP that checks the column
generation's optimum independently.
"""

from mccl.synth.alltoall.compact import compact_lp
from mccl.synth.alltoall.generation import CGOptions
from mccl.synth.alltoall.pipeline import lp_optimum, minimal_steps, synthesize

__all__ = ["CGOptions", "compact_lp", "lp_optimum", "minimal_steps", "synthesize"]
