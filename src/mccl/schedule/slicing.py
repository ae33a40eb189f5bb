"""How many slices the executor cuts every chunk of a call into: one rule for the runtime and the simulator.

The executor (:mod:`mccl.runtime.executor`) pipelines a schedule over a large buffer:
every chunk is cut into ``k`` equal slices that follow each other down the chunk's
path, a relay forwarding slice ``j`` while slice ``j + 1`` is still arriving, as NCCL
moves a channel's data in slices through its FIFOs and MSCCL runs an algorithm tile by
tile. The flow-level simulator (:mod:`mccl.sim`) must model the same ``k`` to predict
what the executor does, so the rule lives here, below both (DESIGN.md layering).

``k = min(max_slices, ceil(largest chunk bytes / slice_bytes))``, at least 1: slices of
about ``slice_bytes``, one ``k`` per call (the largest chunk's). Why 64 KiB and 128: a
tree of depth D pays about ``(D - 1) / k`` of its time to pipeline fill (issue 17); on the
healthy 2×8 HPN at 1 GiB (trees up to 10 deep, 11 MB chunks) 128 slices bring the tree
packing within 2% of its steady state, 16 slices leave it 11% short (BENCHMARKS.md,
2026-11-30 "healthy-fabric gap"). Smaller slices cost per-operation overhead in the
executor and events in the simulator; 64 KiB is NCCL's order of magnitude for a
pipelined step of the Simple protocol at its default buffer size divided over its steps.
"""

from __future__ import annotations

import math

from mccl.errors import MCCLError

__all__ = ["SLICE_BYTES", "MAX_SLICES", "slice_count"]

SLICE_BYTES = 64 * 1024
MAX_SLICES = 128


def slice_count(largest_chunk_bytes: float, slice_bytes: float = SLICE_BYTES, max_slices: int = MAX_SLICES) -> int:
    """Slices per chunk for a call whose largest chunk holds ``largest_chunk_bytes`` (see module docstring)."""
    if not (slice_bytes > 0 and math.isfinite(slice_bytes)):
        raise MCCLError(f"slice_bytes must be a positive number of bytes, got {slice_bytes}")
    if not (isinstance(max_slices, int) and max_slices >= 1):
        raise MCCLError(f"max_slices must be an integer >= 1, got {max_slices}")
    if not largest_chunk_bytes > 0:
        return 1
    # a hair of slack so that a size an exact multiple of slice_bytes gives the same k on both sides,
    # whether counted in whole elements (runtime) or as a fraction of the buffer (simulator)
    return max(1, min(max_slices, math.ceil(largest_chunk_bytes / slice_bytes * (1 - 1e-9))))
