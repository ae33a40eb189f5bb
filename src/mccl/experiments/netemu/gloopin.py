"""Pinning gloo's traffic on the routed spine-leaf by address pair (issue 16, deliverable 3).

gloo binds neither its source port nor its listening port to anything a caller sets, so the
source-port rules of :mod:`.routes` (MCCS's route id in the UDP source port) cannot catch its
connections. What a provider can still pin is the *host pair*: every packet from host A to host B
carries A's and B's addresses, so a rule on the pair in A's leaf (``ip rule from A to B lookup <spine
k's table>``) and its mirror in B's leaf (``from B to A``: gloo's connections carry data both ways,
and TCP's ACKs) put all of the pair's traffic on spine ``k`` — one path per host pair, coarser
than per connection (two tenants between the same two hosts share it), which is what a host-pair
placement like MCCS's testbed (one tenant's rank per host) needs. The rules sit above the
source-port ones (priority 900 < 1000) and are removed by the same specification.

:func:`run_gloo_jobs` runs tenants' gloo jobs at once on the fabric (one spawned process per rank,
inside its host's namespace, ``GLOO_SOCKET_IFNAME=eth0``; rendezvous on the job's first host's
address) through several phases, the pinning changed between phases by the caller while the same
processes and connections live on: the policy is applied under running jobs, as MCCS changes paths
between collectives.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mccl.experiments.netemu.ranks import enter_netns
from mccl.experiments.netemu.routes import RoutedFabric
from mccl.experiments.netemu.shaping import FabricError, batch

__all__ = ["GlooJob", "pin_pair", "unpin_pair", "PairPinning", "run_gloo_jobs"]

_PAIR_PRIORITY = 900
_TABLE_BASE = 100  # as routes.py: spine k's table in every leaf


@dataclass(frozen=True)
class GlooJob:
    """A tenant's gloo job: one rank per host in ``hosts`` (rank order), ``iterations`` AllReduces of
    ``nbytes`` per phase."""

    name: str
    hosts: tuple[int, ...]
    nbytes: int = 1 << 20
    iterations: int = 6


def _pair_rules(fabric: RoutedFabric, a: int, b: int, spine: int, verb: str) -> None:
    plan = fabric.plan
    if not (0 <= a < plan.hosts and 0 <= b < plan.hosts and 0 <= spine < plan.spines):
        raise FabricError(f"no host pair ({a}, {b}) or spine {spine} on this fabric")
    if plan.leaf_of(a) == plan.leaf_of(b):
        raise FabricError(f"hosts {a} and {b} share leaf {plan.leaf_of(a)}: their traffic crosses no spine")
    for src, dst in ((a, b), (b, a)):
        batch("ip", plan.leaf_ns(plan.leaf_of(src)),
              [f"rule {verb} priority {_PAIR_PRIORITY} from {plan.host_ip(src)} to {plan.host_ip(dst)} "
               f"lookup {_TABLE_BASE + spine}"])


def pin_pair(fabric: RoutedFabric, a: int, b: int, spine: int) -> None:
    """Every packet between hosts ``a`` and ``b`` (both directions) through spine ``spine``."""
    _pair_rules(fabric, a, b, spine, "add")


def unpin_pair(fabric: RoutedFabric, a: int, b: int, spine: int) -> None:
    """Undo :func:`pin_pair` (the pair goes back to ECMP)."""
    _pair_rules(fabric, a, b, spine, "del")


class PairPinning:
    """The pairs pinned now on a fabric; :meth:`phase` gives a :func:`run_gloo_jobs` phase that replaces them."""

    def __init__(self, fabric: RoutedFabric) -> None:
        self.fabric = fabric
        self.pinned: list[tuple[int, int, int]] = []

    def phase(self, *pairs: tuple[int, int, int]) -> Callable[[], None]:
        """Unpin every pinned pair, then pin each ``(host a, host b, spine)`` of ``pairs``."""
        def apply() -> None:
            while self.pinned:
                unpin_pair(self.fabric, *self.pinned.pop())
            for pair in pairs:
                pin_pair(self.fabric, *pair)
                self.pinned.append(pair)
        return apply


def _rank(namespace: str, store_host: str, port: int, rank: int, job: GlooJob, phases: int, barrier,
          results) -> None:
    try:
        enter_netns(namespace)  # first, while this process has one thread (gloo's threads inherit it)
        os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
        os.environ["OMP_NUM_THREADS"] = "1"
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        store = dist.TCPStore(store_host, port, len(job.hosts), rank == 0, timedelta(seconds=60))
        group = dist.ProcessGroupGloo(store, rank, len(job.hosts), timedelta(seconds=60))
        group.allreduce([torch.ones(256)]).wait()  # every connection of the mesh made before the first phase
        tensor = torch.ones(job.nbytes // 4)
        seconds = []
        for _ in range(phases):
            barrier.wait(timeout=120)  # the caller has set this phase's pinning
            start = time.perf_counter()
            for _ in range(job.iterations):
                group.allreduce([tensor]).wait()
            seconds.append(time.perf_counter() - start)
            barrier.wait(timeout=300)  # every job is done with the phase: the caller reads the counters
        exact = bool(torch.all(tensor == float(len(job.hosts)) ** (job.iterations * phases)).item())
        results.put((job.name, rank, seconds, exact, None))
    except BaseException as error:  # reported, never hung on: the caller's barrier breaks on its timeout
        results.put((job.name, rank, [], False, f"{type(error).__name__}: {error}"))


def run_gloo_jobs(fabric: RoutedFabric, jobs: Sequence[GlooJob], phases: Sequence[Callable[[], None]],
                  *, port_base: int = 29700, timeout_s: float = 300.0) -> list[dict]:
    """Run ``jobs`` at once, phase by phase: before phase ``i`` the caller's ``phases[i]()`` runs (pin,
    unpin); returns per phase ``{"seconds": {job: slower rank's time}, "uplinks": bytes by (leaf, spine)}``.
    """
    context = mp.get_context("spawn")
    ranks = sum(len(job.hosts) for job in jobs)
    barrier = context.Barrier(ranks + 1)
    results = context.Queue()
    plan = fabric.plan
    processes = [context.Process(target=_rank, args=(plan.host_ns(host), plan.host_ip(job.hosts[0]),
                                                     port_base + index, rank, job, len(phases), barrier, results),
                                 daemon=True)
                 for index, job in enumerate(jobs) for rank, host in enumerate(job.hosts)]
    for process in processes:
        process.start()
    out: list[dict] = []
    try:
        for setup in phases:
            setup()
            before = fabric.uplink_bytes()
            barrier.wait(timeout=timeout_s)  # (a rank that failed to start breaks it: reported below)
            barrier.wait(timeout=timeout_s)
            after = fabric.uplink_bytes()
            out.append({"uplinks": {link: after[link] - before[link] for link in after}})
        found = [results.get(timeout=60) for _ in processes]
    except Exception as error:
        failures = []
        while not results.empty():
            name, rank, _, _, failure = results.get()
            failures.append(f"{name} rank {rank}: {failure}")
        raise FabricError(f"gloo jobs on the routed fabric failed ({error!r}; {'; '.join(failures) or 'no report'})") \
            from None
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    failures = [f"{name} rank {rank}: {failure}" for name, rank, _, _, failure in found if failure]
    if failures:
        raise FabricError("gloo jobs failed: " + "; ".join(failures))
    for index, phase in enumerate(out):
        phase["seconds"] = {job.name: max(seconds[index] for name, _, seconds, _, _ in found if name == job.name)
                            for job in jobs}
    for phase in out:
        phase["exact"] = all(exact for *_, exact, _ in found)
    return out
