"""Run a function on N local ranks (one process each) over gloo on loopback.

For tests and benchmarks: one spawn costs 2–7 s, so callers run many cases per
spawn. Every wait is bounded; on a timeout or a failed rank every process is
terminated and the first traceback is raised as :class:`LaunchError`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from mccl.errors import MCCLError

__all__ = ["LaunchError", "free_port", "run_ranks"]


class LaunchError(MCCLError):
    """A rank failed or the ranks did not finish in time."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(fn: Callable[..., Any], rank: int, world_size: int, port: int, backend: str, args: tuple,
           results: Any, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:  # report every failure to the parent, which raises it
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0,
              backend: str = "gloo", may_die: Collection[int] = ()) -> list[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; their return values by rank.

    ``may_die``: ranks whose process may end without reporting (a test that kills them); their value
    is None. Any other rank that ends without reporting fails the launch at once, with its exit code."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    processes = [context.Process(target=_entry, args=(fn, rank, world_size, port, backend, args, results, timeout_s),
                                 daemon=True) for rank in range(world_size)]
    try:
        for process in processes:
            process.start()
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.2)
            except queue.Empty:
                _check_exits(processes, values, may_die, results)
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(values))
                    raise LaunchError(f"ranks {missing} did not finish within {timeout_s:.0f} s") from None
                continue
            if not ok:
                raise LaunchError(f"rank {rank} failed:\n{value}")
            values[rank] = value
    finally:
        for process in processes:
            process.join(timeout=10 if len(values) == world_size else 0.5)
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
    return [values[rank] for rank in range(world_size)]


def _check_exits(processes: list, values: dict[int, Any], may_die: Collection[int], results: Any) -> None:
    """Ranks whose process ended without reporting: None for those allowed to die, else a LaunchError."""
    for rank, process in enumerate(processes):
        if rank in values or process.exitcode is None:
            continue
        if rank in may_die:
            values[rank] = None
        elif results.empty():  # (a report may still be in the queue's pipe: read it first)
            raise LaunchError(f"rank {rank} ended with exit code {process.exitcode} without reporting")
