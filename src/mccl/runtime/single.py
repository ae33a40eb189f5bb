"""Collectives of a group of one rank, run as the copies they are.

Why. For one rank a collective is a copy of its input into its output (AllGather, ReduceScatter, AllToAll) or
nothing at all (AllReduce: the one rank's buffer already is its sum, product, min or max). gloo still runs them as
collectives: the calling thread hands each call to gloo's worker thread and sleeps until it is done (a wake-up per
call), and its world-1 AllGather gathers into a flat tensor of its own (a fresh allocation, its pages faulted in
on every call) before copying that into the output — two copies where the collective is one (ninth session,
``benchmarks/provider_threads.py``: an 8 MiB AllGather 4978 µs of CPU per call through gloo, ~2400 as one copy).
A world-1 job is common (a one-host provider's tenants, a single-process run of a training script); the provider's
service (:mod:`mccl.provider.direct`) and the runtime's own world-1 transport (:class:`WorldOfOne`, used by
:class:`~mccl.runtime.transport.Transport`) both run them here.

What stays gloo's. A call runs here only once gloo has run the same (kind, dtype, reduction) on the group
(:class:`WorldOfOne` keeps what it vouched for): gloo refuses some calls (int16, every collective; ``avg`` and
``premul_sum``, every dtype; ``min`` on complex), and refusing them is gloo's to do, with its own error — a call
gloo would refuse must not start to succeed only because it is small. Shapes are checked on every call, not
vouched: a call whose output and input differ in dtype, device or length, or whose splits are not the whole
tensor, goes to gloo, which raises its usual error. An input that overlaps the output in part goes to gloo too
(``copy_`` refuses it; gloo copies through its flat tensor). NCCL groups never come here: their collectives are
ordered on NCCL's stream, a ``copy_`` on the current stream is not.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

__all__ = ["WorldOfOne", "copy_collective", "whole"]


def copy_collective(kind: str, output: torch.Tensor, source: torch.Tensor) -> bool:
    """Run a world-1 collective of ``kind`` (``all_gather``, ``reduce_scatter``, ``all_to_all``: a copy;
    ``all_reduce``: nothing, ``output`` is ``source``) by copying ``source`` into ``output``; False when this
    cannot be the whole of it (dtype, device or length differ; the two overlap in part): the caller runs gloo."""
    if kind == "all_reduce":  # one rank: the buffer is its own reduction
        return True
    if output.dtype != source.dtype or output.device != source.device or output.numel() != source.numel():
        return False
    if not (output.is_contiguous() and source.is_contiguous()):
        return False
    out_at, in_at, nbytes = output.data_ptr(), source.data_ptr(), source.nbytes
    if out_at == in_at:  # in place (the input is the output's own block): already the result
        return True
    if out_at < in_at + nbytes and in_at < out_at + nbytes:
        return False
    output.copy_(source)
    return True


def whole(splits: Sequence[int] | None, tensor: torch.Tensor) -> bool:
    """Whether AllToAll ``splits`` (rows of dim 0, torch's convention; empty: even) cover all of ``tensor``."""
    return not splits or (len(splits) == 1 and int(splits[0]) == (tensor.shape[0] if tensor.dim() else 1))


class WorldOfOne:
    """A world-1 gloo group's collectives as copies, once gloo has run each (kind, dtype, reduction) there.

    :meth:`run` takes the call's key, the copy and gloo's own call; ``calls`` counts the calls copied."""

    def __init__(self) -> None:
        self.vouched: set[Hashable] = set()  # (kind, dtype, reduction) gloo has run on this group
        self.calls = 0

    def run(self, key: Hashable, copy: Callable[[], bool], native: Callable[[], None]) -> None:
        """``copy()`` when gloo has run ``key`` here and the copy can be the whole call, else ``native()``
        (gloo's call, its errors its own), and ``key`` vouched for once that returned."""
        if key in self.vouched and copy():
            self.calls += 1
            return
        native()
        self.vouched.add(key)
