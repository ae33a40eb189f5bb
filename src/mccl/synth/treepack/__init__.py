"""AllGather / ReduceScatter by optimal spanning-tree packing (ForestColl-style; mccl-paper §4.1, §4.3).

``synthesize(topology, ranks=None, *, previous=None, options=None, **overrides)`` returns an
AllGather :class:`~mccl.synth.result.SynthesisResult`; see :mod:`.pipeline` for the phases.
"""

from mccl.synth.treepack.pipeline import reversed_topology, synthesize, synthesize_reducescatter

__all__ = ["reversed_topology", "synthesize", "synthesize_reducescatter"]
