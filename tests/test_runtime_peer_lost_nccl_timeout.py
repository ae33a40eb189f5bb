"""The NCCL transport group's timeout, derived from MCCL_PEER_TIMEOUT (issue 13, peer failure). NCCL cannot
run on these machines: this checks the timeout handed to it, not NCCL's watchdog."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mccl.errors import MCCLError
from mccl.runtime.transport import NCCL_TIMEOUT_PEERS, nccl_timeout


def test_the_nccl_group_timeout_is_bounded_by_the_peer_timeout(monkeypatch):
    monkeypatch.delenv("MCCL_PEER_TIMEOUT", raising=False)
    assert nccl_timeout() == timedelta(seconds=NCCL_TIMEOUT_PEERS * 10)  # torch's own NCCL default: 10 min
    assert nccl_timeout(timedelta(minutes=30)) == timedelta(seconds=NCCL_TIMEOUT_PEERS * 10)
    assert nccl_timeout(timedelta(seconds=5)) == timedelta(seconds=5)  # a shorter group timeout stays
    monkeypatch.setenv("MCCL_PEER_TIMEOUT", "2.5")
    assert nccl_timeout(timedelta(minutes=30)) == timedelta(seconds=NCCL_TIMEOUT_PEERS * 2.5)
    monkeypatch.setenv("MCCL_PEER_TIMEOUT", "nan")
    with pytest.raises(MCCLError, match="MCCL_PEER_TIMEOUT"):
        nccl_timeout(timedelta(minutes=30))
