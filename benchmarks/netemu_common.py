"""What the emulated-fabric benchmarks share: time one collective and read a NIC's byte counter around it.

``benchmarks/netemu.py`` (the loop, NIC utilization) and ``benchmarks/netemu_telemetry.py`` (telemetry
accuracy and overhead) both time a call between a barrier and its return on every rank, while rank 0 reads
the kernel's count of what a shaped link carried meanwhile (the htb class of one veth end, L2 bytes).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable

__all__ = ["htb_sent_bytes", "timed_collective"]


def htb_sent_bytes(namespace: str, device: str) -> int:
    """L2 bytes the htb class on ``device`` in ``namespace`` has sent so far (``tc -s class show``)."""
    shown = subprocess.run(["tc", "-s", "-n", namespace, "class", "show", "dev", device], capture_output=True,
                           text=True, check=True).stdout
    return int(re.search(r"Sent (\d+) bytes", shown).group(1))


def timed_collective(comm, kind: str, output, source,  # noqa: ANN001  (a Communicator and torch tensors)
                     counter: Callable[[], int] | None = None) -> tuple[float, int]:
    """One AllGather (``kind == "allgather"``) or AllToAll after a barrier: (seconds, bytes ``counter`` grew
    by meanwhile, 0 without one). Every rank calls it; pass ``counter`` on the rank that reads a NIC.

    The counter is read before the barrier: read after it (a ``tc`` subprocess, 5–20 ms on a loaded machine),
    the other ranks' calls would wait for the reading rank and the slowest rank's time would include it
    (measured: telemetry on ÷ off 1.38 for the loop's AllGather when only the metered calls read it)."""
    import torch.distributed as dist

    before = counter() if counter is not None else 0
    dist.barrier()
    start = time.perf_counter()
    if kind == "allgather":
        comm.all_gather_into_tensor(output, source)
    else:
        comm.all_to_all_single(output, source)
    seconds = time.perf_counter() - start
    return seconds, (counter() - before) if counter is not None else 0
