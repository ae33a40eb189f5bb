"""``optimize()``: the one entry point the controller and the simulator call.

It picks the synthesizer for a collective: AllGather and ReduceScatter by
spanning-tree packing, AllToAll by column generation, AllReduce as ReduceScatter +
AllGather. ``previous`` is the schedule being replaced (for a warm start).
Until a synthesizer lands, its collective raises :class:`SynthesisError` saying so.
"""

from __future__ import annotations

from collections.abc import Sequence

from mccl.errors import SynthesisError
from mccl.schedule import Collective, Schedule
from mccl.synth.alltoall import synthesize as synthesize_alltoall
from mccl.topology import Topology

__all__ = ["optimize"]


def optimize(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    *,
    previous: Schedule | None = None,
    **options: object,
) -> Schedule:
    """A throughput-optimized schedule for ``collective`` on ``topology`` (validated shape)."""
    collective = Collective(collective)
    if collective is Collective.ALLGATHER:
        from mccl.synth.treepack import synthesize

        return synthesize(topology, ranks, previous=previous, **options)  # type: ignore[arg-type]
    if collective is Collective.REDUCESCATTER:
        from mccl.synth.treepack import synthesize_reducescatter

        return synthesize_reducescatter(topology, ranks, previous=previous, **options)  # type: ignore[arg-type]
    if collective is Collective.ALLTOALL:
        return synthesize_alltoall(topology, ranks, previous=previous, **options)  # type: ignore[arg-type]
    raise SynthesisError(f"{collective.value} synthesis is not available yet")
