"""A world-1 job's collectives run in the service thread that read the request, as the copies they are.

Why. A job whose hosts are this service alone (world size 1: every job of a one-host provider, and the one the
single-host benchmarks measure) ran each collective through its gloo group: the session's thread handed the call
to gloo's worker thread and slept until that thread had run it — a wake-up per call beside the request's and the
reply's (eighth session, ``benchmarks/provider_threads.py``: the service's fast-path thread slept 1.6–1.8 times per
call, the tenant's in-process baseline 0.1–0.8). For one rank a collective is a copy of its input into its output
(AllGather, ReduceScatter, AllToAll) or nothing at all (AllReduce, every reduction: the one rank's buffer already is
the sum, product, min or max; ``avg`` divides it by 1). So :func:`run` does that, on the calling thread
(the copy is :func:`mccl.runtime.single.copy_collective`, shared with the runtime's world-1 transport). The 8 MiB
AllGather gains most: gloo's world-1 AllGather gathers into a flat tensor of its own (a fresh allocation, its
pages faulted in on every call) and then copies that into the output — two copies and a page-fault storm where the
collective is one copy.

What does not change. The buffers are the views :mod:`.checks` resolved and checked (the copy goes from one
checked view of the tenant's own memory to another; nothing else is read or written). A job runs directly only
what its gloo group has already run once (:class:`~.jobs.Job` keeps the (kind, dtype, reduction) gloo accepted):
gloo refuses some calls, and refuses them by breaking the group (int16, every collective: "Invalid scalar type"),
so the first call of each kind goes to gloo and fails or succeeds there as before. An input that overlaps the
output in part goes to gloo too, as before (``copy_`` refuses it; gloo's AllGather copies through its flat tensor). A job with a strategy or a control
channel never runs directly (its policy acts on the communicator). A session may turn it off
(``{"op": "direct", "on": false}``, :meth:`.shim.Shim.direct`): the benchmarks' same-run A/B of the two paths.
"""

from __future__ import annotations

import torch

from mccl.runtime.single import copy_collective

__all__ = ["run"]


def run(kind: str, tensors: list[torch.Tensor]) -> bool:
    """Run a world-1 collective on ``tensors`` (output first, as :meth:`.jobs.Job.run` takes them) by copying
    (:func:`mccl.runtime.single.copy_collective`, which the runtime's own world-1 groups use too); False when it
    cannot (input and output overlap in part: the caller runs it on gloo instead)."""
    return copy_collective(kind, tensors[0], tensors[-1])
