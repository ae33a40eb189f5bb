"""The backend's pipelining grain: gloo's segment size on a gloo transport, ``MCCL_SLICE_BYTES``
overriding it, rank 0's value holding for the whole group (in-process: a one-rank group)."""

from __future__ import annotations

from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from mccl.errors import MCCLError  # noqa: E402
from mccl.runtime.backend import MCCLProcessGroup  # noqa: E402
from mccl.runtime.backend_transports import group_slice_bytes, slice_bytes  # noqa: E402
from mccl.runtime.reduction_order import GLOO_MAX_SEGMENT_BYTES  # noqa: E402
from mccl.schedule.slicing import SLICE_BYTES  # noqa: E402


def test_slices_of_gloo_segment_size_on_gloo_default_elsewhere(monkeypatch):
    monkeypatch.delenv("MCCL_SLICE_BYTES", raising=False)
    assert slice_bytes("gloo") == GLOO_MAX_SEGMENT_BYTES == 1 << 20
    assert slice_bytes("nccl") == SLICE_BYTES
    monkeypatch.setenv("MCCL_SLICE_BYTES", "65536")
    assert slice_bytes("gloo") == 65536
    for bad in ("0", "-5", "lots", "nan", "inf"):
        monkeypatch.setenv("MCCL_SLICE_BYTES", bad)
        with pytest.raises(MCCLError, match="MCCL_SLICE_BYTES"):
            slice_bytes("gloo")


def test_rank_zero_value_holds_for_the_group(monkeypatch):
    store = dist.HashStore()
    monkeypatch.setenv("MCCL_SLICE_BYTES", "131072")
    assert group_slice_bytes(store, 0, "gloo") == 131072
    monkeypatch.setenv("MCCL_SLICE_BYTES", "4096")  # another rank configured differently: it follows rank 0
    assert group_slice_bytes(store, 1, "gloo") == 131072


def test_the_communicator_of_a_gloo_group_slices_at_the_segment_size(monkeypatch):
    monkeypatch.delenv("MCCL_SLICE_BYTES", raising=False)
    group = MCCLProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=10))
    try:
        assert group.communicator.slice_bytes == GLOO_MAX_SEGMENT_BYTES
    finally:
        group.communicator.close()
