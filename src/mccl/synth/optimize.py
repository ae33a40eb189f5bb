"""``optimize()``: the one entry point the controller, the CLI and the experiments call.

It looks the method up in :mod:`.registry` (by default the collective's optimal one:
AllGather / ReduceScatter by spanning-tree packing, AllToAll by column generation,
AllReduce as ReduceScatter + AllGather), resolves its typed options and runs it.
``previous`` is what is being replaced: the :class:`~mccl.synth.result.SynthesisResult`
kept from the last synthesis (a warm start from its solver state) or a schedule read
from a file (a warm start from its routes).
"""

from __future__ import annotations

from collections.abc import Sequence

from mccl.schedule import Collective, Schedule
from mccl.synth.registry import run_method
from mccl.synth.result import SynthesisResult
from mccl.topology import Topology

__all__ = ["optimize"]


def optimize(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    *,
    method: str | None = None,
    previous: SynthesisResult | Schedule | None = None,
    options: object | None = None,
    **overrides: object,
) -> SynthesisResult:
    """A schedule for ``collective`` on ``topology`` by ``method`` (default: the optimal one), with
    its bound, gap and warm state.

    ``options``: the method's options class (see :mod:`mccl.synth.options`); ``overrides``:
    its fields by name (``chunks=4``). Raises :class:`~mccl.errors.SynthesisUnavailable` when no
    such method makes the collective, :class:`~mccl.errors.InvalidOptions` for options it lacks.
    """
    return run_method(topology, collective, ranks, method=method, previous=previous, options=options, **overrides)
