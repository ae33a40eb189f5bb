"""AllGather / ReduceScatter by optimal spanning-tree packing (ForestColl-style; mccl-paper §4.1, §4.3).

``synthesize(topology, ranks=None, *, previous=None, chunks=10, latency_aware=False)``
returns an AllGather :class:`~mccl.schedule.Schedule`; see :mod:`.pipeline` for the phases.
"""

from mccl.synth.cutbound import MaxRate, max_rate
from mccl.synth.treepack.pipeline import MAX_CHUNKS, reversed_topology, synthesize, synthesize_reducescatter

__all__ = ["MAX_CHUNKS", "MaxRate", "max_rate", "reversed_topology", "synthesize", "synthesize_reducescatter"]
