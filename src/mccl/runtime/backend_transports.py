"""The two transport groups under an "mccl" process group, built from the group's store, and the
executor's slice size on them (:mod:`mccl.runtime.backend` says what each one carries).

* :func:`transport_backend` — the **schedule transport** under the communicator: gloo on CPU, NCCL
  where CUDA is available (``MCCL_TRANSPORT=gloo|nccl`` overrides);
* :func:`delegates` — the **delegate** per device type (gloo for cpu, NCCL for cuda) that runs every
  c10d operation without an mccl schedule;
* :func:`slice_bytes` / :func:`group_slice_bytes` — the pipelining grain, rank 0's value for the group.

The NCCL branches have never been run (CPU-only machines; :mod:`mccl.runtime.backend`).
"""

from __future__ import annotations

import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from mccl.errors import MCCLError
from mccl.runtime.reduction_order import GLOO_MAX_SEGMENT_BYTES
from mccl.runtime.transport import nccl_group, nccl_timeout
from mccl.schedule.slicing import SLICE_BYTES

__all__ = ["delegates", "group_slice_bytes", "slice_bytes", "transport_backend"]


def transport_backend(store: dist.Store, rank: int, size: int, timeout: timedelta) -> tuple[object, str]:
    name = os.environ.get("MCCL_TRANSPORT") or ("nccl" if torch.cuda.is_available() else "gloo")
    prefix = dist.PrefixStore("mccl-transport/", store)
    if name == "nccl":  # not run on the CPU-only machines this was written on (module docstring)
        if not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise MCCLError("MCCL_TRANSPORT=nccl needs CUDA and a torch built with NCCL; this process has "
                            f"cuda available={torch.cuda.is_available()}, nccl built={dist.is_nccl_available()}")
        return nccl_group(prefix, rank, size, nccl_timeout(timeout)), name
    if name == "gloo":
        return dist.ProcessGroupGloo(prefix, rank, size, timeout), name
    raise MCCLError(f"MCCL_TRANSPORT must be gloo or nccl, not {name!r}")


def slice_bytes(transport_name: str) -> float:
    """The executor's pipelining grain on this group's transport (``MCCL_SLICE_BYTES`` overrides).

    gloo: gloo's own segment size (1 MiB, what its ring allreduce pipelines in). Every slice is one
    gloo message, and one message costs the CPU a fixed ~50-100 µs (a Python post and wait, a wake-up of
    gloo's I/O thread) against ~10 µs to move 64 KiB over loopback: at the executor's default 64 KiB a
    ring all-gather of FSDP2's 4 MiB took 1.7–1.9× gloo's CPU, at 1 MiB 0.97–1.16×
    (``benchmarks/backend_probe.py slices``, BENCHMARKS.md 2026-12-01 third session). NCCL: the default (:data:`~mccl.schedule.slicing.SLICE_BYTES`), where a slice is a kernel's
    step, not a CPU round trip."""
    configured = os.environ.get("MCCL_SLICE_BYTES")
    if configured:
        try:
            value = float(configured)
        except ValueError:
            value = 0.0
        if not (value > 0 and math.isfinite(value)):
            raise MCCLError(f"MCCL_SLICE_BYTES must be a positive number of bytes, not {configured!r}")
        return value
    return GLOO_MAX_SEGMENT_BYTES if transport_name == "gloo" else SLICE_BYTES


def group_slice_bytes(store: dist.Store, rank: int, transport_name: str) -> float:
    """Rank 0's :func:`slice_bytes`, adopted by every rank (through the group's store, once): ranks that
    cut chunks differently would post messages of different sizes under one tag, which gloo aborts on."""
    key = "mccl-config/slice_bytes"
    if rank == 0:
        store.set(key, repr(slice_bytes(transport_name)))
    return float(store.get(key).decode())


def delegates(store: dist.Store, rank: int, size: int, timeout: timedelta) -> dict[str, tuple[object, object]]:
    """device type -> (c10d backend, its BackendType): gloo for cpu, NCCL for cuda where there is CUDA."""
    found = {"cpu": (dist.ProcessGroupGloo(dist.PrefixStore("mccl-delegate/cpu/", store), rank, size, timeout),
                     dist.ProcessGroup.BackendType.GLOO)}
    if torch.cuda.is_available() and dist.is_nccl_available():
        found["cuda"] = (dist.ProcessGroupNCCL(dist.PrefixStore("mccl-delegate/cuda/", store), rank, size),
                         dist.ProcessGroup.BackendType.NCCL)
    return found
