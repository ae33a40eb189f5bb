"""Run a function on one gloo rank per GPU, each process inside its GPU's network namespace.

How a rank enters its namespace: a ``spawn``ed process calls ``setns(2)`` on
``/run/netns/<ns>`` first thing, while it has one thread (threads created later inherit
the namespace; ``os.setns`` exists only on Python ≥ 3.12, so ctypes on 3.11). Why not
``ip netns exec``: the results come back over a multiprocessing queue (a pipe, which
crosses namespaces), exactly as :func:`mccl.runtime.launch.run_ranks` does, and a
``Process`` is terminated like any other. The namespace's ``/sys/class/net`` is not
remounted this way; gloo finds ``eth0`` through netlink (``getifaddrs``), which is right.

Environment of a rank: ``GLOO_SOCKET_IFNAME=eth0`` (its NIC; without it gloo advertises
127.0.0.1 from ``/etc/hosts`` and the mesh fails) and ``OMP_NUM_THREADS=1``. The
TCPStore (rendezvous, and the hot swap's out-of-band agreement) is rank 0's management
address, so it does not cross the shaped NICs. ``store_priority``: the store's server thread (in rank
0) that many steps of niceness above the ranks' collectives (:mod:`mccl.runtime.priority`; root):
every hot-swap round's ready wait and exchange is a few requests to it, answered only when it gets
a core among 8 busy ranks.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from mccl.experiments.netemu.fabric import FabricPlan
from mccl.experiments.netemu.shaping import FabricError

__all__ = ["enter_netns", "run_ranks_in_fabric"]

CLONE_NEWNET = 0x40000000
STORE_PORT = 29500


def enter_netns(namespace: str) -> None:
    """Move the calling thread into network namespace ``namespace`` (``ip netns`` name)."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if hasattr(os, "setns"):
            os.setns(fd, CLONE_NEWNET)
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise FabricError(f"setns into {namespace} failed: {os.strerror(errno)}")
    finally:
        os.close(fd)


def _entry(fn: Callable[..., Any], plan: FabricPlan, rank: int, args: tuple, results: Any, timeout_s: float,
           store_priority: int | None = None) -> None:
    try:
        enter_netns(plan.ranks[rank].namespace)  # before torch starts a thread
        os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch
        import torch.distributed as dist

        from mccl.runtime.priority import raised

        torch.set_num_threads(1)
        with raised(store_priority if rank == 0 else None):  # the store's server thread starts here (module doc)
            store = dist.TCPStore(plan.ranks[0].mgmt_ip, STORE_PORT, len(plan.ranks), rank == 0,
                                  timeout=timedelta(seconds=timeout_s))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=len(plan.ranks),
                                timeout=timedelta(seconds=timeout_s))
        try:
            results.put((rank, True, fn(rank, len(plan.ranks), plan, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # every failure goes to the parent, which raises it
        results.put((rank, False, traceback.format_exc()))


def run_ranks_in_fabric(fn: Callable[..., Any], plan: FabricPlan, *args: Any, timeout_s: float = 120.0,
                        on_result: Callable[[int, Any], None] | None = None,
                        store_priority: int | None = None) -> list[Any]:
    """``fn(rank, world_size, plan, *args)`` on one spawned process per GPU of ``plan``, inside its
    namespace; the return values by rank. A failed rank or a timeout terminates them all and raises
    :class:`FabricError` with the first traceback. The fabric must be built (and stays up)."""
    context = mp.get_context("spawn")
    results = context.Queue()
    world = len(plan.ranks)
    processes = [context.Process(target=_entry, args=(fn, plan, rank, args, results, timeout_s, store_priority),
                                 daemon=True) for rank in range(world)]
    values: dict[int, Any] = {}
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout_s
        dead_seen = False
        while len(values) < world:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty as error:
                missing = sorted(set(range(world)) - set(values))
                # a rank that crashed without reporting (killed, or its interpreter failed before _entry ran):
                # say so now rather than after timeout_s (one more second first, for a result still in the pipe)
                dead = [r for r in missing if processes[r].exitcode not in (None, 0)]
                if dead and dead_seen:
                    raise FabricError(f"ranks {dead} exited (codes {[processes[r].exitcode for r in dead]}) "
                                      "without a result") from error
                dead_seen = bool(dead)
                if time.monotonic() > deadline:
                    raise FabricError(f"ranks {missing} did not finish within {timeout_s:.0f} s") from error
                continue
            if not ok:
                raise FabricError(f"rank {rank} failed:\n{value}")
            values[rank] = value
            if on_result is not None:
                on_result(rank, value)
    finally:
        for process in processes:
            if process.pid is not None:
                process.join(timeout=10 if len(values) == world else 0.5)
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
    return [values[rank] for rank in range(world)]
