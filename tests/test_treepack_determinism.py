"""Same input, same packing (issue 17): the AllGather tree packing does not depend on hash order or process state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_DIGEST = r"""
import hashlib
import numpy as np
from mccl.synth import optimize
from mccl.topology import apply_fault, rail_optimized

digest = hashlib.sha256()
for fault in ("healthy", "fail1", "fail3"):
    healthy = rail_optimized(1, 4, 8)
    topology = healthy if fault == "healthy" else apply_fault(healthy, fault)
    result = optimize(topology, "allgather")
    transfers = result.schedule.transfers
    for name in ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links"):
        digest.update(np.ascontiguousarray(getattr(transfers, name)).tobytes())
    digest.update(repr((result.achieved_gbs, result.stats.max_flows)).encode())
print(digest.hexdigest())
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_same_packing_in_fresh_interpreters_with_different_hash_seeds() -> None:
    """Two interpreters with different ``PYTHONHASHSEED`` (set and dict order of strings differ) emit
    byte-identical schedules — transfers, routes, max-flows — on the 32-GPU fabric, healthy, Fail1, Fail3."""
    source = str(Path(__file__).resolve().parents[1] / "src")
    digests = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": source + os.pathsep + os.environ.get("PYTHONPATH", "")}
        done = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True, env=env, timeout=280,
                              check=True)
        digests.append(done.stdout.strip().splitlines()[-1])
    assert digests[0] == digests[1]
