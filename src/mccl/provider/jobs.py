"""A tenant job's communicator inside the service, and the seam where policies act between collectives.

A job is (tenant, job name, hosts): the services on ``hosts`` (service ranks, one per emulated host)
each run one rank of it, for the tenant process on that host that joined it. The services form
the job's transport group themselves — a gloo ``ProcessGroupGloo`` built from the provider's store
under a prefix of the job's key and a generation (a job re-joined after a failure gets a fresh
group) — and an mccl :class:`~mccl.runtime.Communicator` over it, as ``mccl.init`` builds one
(torch's own collectives until a schedule is installed; the mccl executor after). Every job has
its own group, so a job whose peer vanished blocks (until its timeout) only its own collectives.

The communicator of a job that spans several hosts always runs the pre-flight agreement
(``check=True``, one small AllGather of the call's dtype and sizes per collective,
:mod:`mccl.runtime.agreement`): the ranks of a job are processes of one tenant, and without it a
rank that passes a longer buffer than its peer expects makes gloo abort the *receiving service* —
which serves every other tenant of its host. A one-host job has no peer to disagree with, so it
skips the agreement (its sizes are checked against each other by the session, ``_check_shapes``), and, once its
gloo group has run a kind of call, runs that kind as the copy it is at world 1, in the session's own thread
(:mod:`.direct`: no hand-off to gloo's worker thread).

Policies (:class:`JobStrategy`, the seam for the flow-to-path and send-gate policies of issue 16):
the service calls ``strategy.between(job, kind, nbytes)`` on the job's thread right before each
collective, when none of the job's collectives is in flight, so a strategy may install or stage a
schedule (``job.communicator.stage``, which needs ``hot_swap=True`` for the cross-host (min
version, max seq) agreement), pace the transport (``job.communicator.transport.throttle``), or hold
the call until a send window opens. ``strategy.closed(job)`` runs when the job ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from mccl.errors import MCCLError
from mccl.provider import direct
from mccl.provider.errors import BadRequest, JobFailed
from mccl.runtime.communicator import Communicator
from mccl.runtime.hotswap import StoreControl
from mccl.runtime.transport import Transport

__all__ = ["JobSpec", "Job", "JobStrategy", "StrategyFactory", "TORCH_DTYPES", "TORCH_REDUCTIONS"]

log = logging.getLogger("mccl.provider")

TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64,
                                        "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64,
                                        "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
                                        "uint8": torch.uint8}
TORCH_REDUCTIONS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
                    "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.SUM}  # avg: a sum divided by the size after


@dataclass(frozen=True)
class JobSpec:
    """Which tenant's job, by its name, over which service ranks (in the job's rank order)."""

    tenant: str
    name: str
    hosts: tuple[int, ...]

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.name}@{','.join(map(str, self.hosts))}"


class JobStrategy(Protocol):
    """A per-job policy the service applies between collectives (see module docstring)."""

    def between(self, job: Job, kind: str, nbytes: int) -> None: ...

    def closed(self, job: Job) -> None: ...


StrategyFactory = Callable[["Job"], JobStrategy]


class Job:
    """One rank of a tenant's job in this service: its transport group and communicator."""

    def __init__(self, spec: JobSpec, host: int, store: dist.Store, *, timeout_s: float = 60.0,
                 join_timeout_s: float = 120.0, strategy: StrategyFactory | None = None,
                 hot_swap: bool = False) -> None:
        if host not in spec.hosts:
            raise BadRequest(f"job {spec.name!r} spans hosts {list(spec.hosts)}, not this service's host {host}")
        self.spec = spec
        self.store = store  # this job's own connection (see ProviderService.job_store), kept as long as the group
        self.rank = spec.hosts.index(host)
        self.size = len(spec.hosts)
        prefix = dist.PrefixStore(f"mccl/provider/job/{spec.key}/", store)
        # equal on every host when each host's tenant joins this job the same number of times
        self.generation = int(prefix.add(f"generation/{self.rank}", 1))
        group_store = dist.PrefixStore(f"g{self.generation}/", prefix)
        # every host's tenant joins when its process gets there (seconds apart on a loaded machine): wait for
        # all of them with the join timeout first, so the group's own (collective) timeout can stay short
        group_store.set(f"joined/{self.rank}", b"1")
        try:
            group_store.wait([f"joined/{rank}" for rank in range(self.size)], timedelta(seconds=join_timeout_s))
            self.group = dist.ProcessGroupGloo(group_store, self.rank, self.size, timedelta(seconds=timeout_s))
        except RuntimeError as error:  # a host's tenant never joined (DistStoreError is a RuntimeError)
            raise JobFailed(f"job {spec.name!r}: the services of hosts {list(spec.hosts)} did not all join "
                            f"within {join_timeout_s:g} s ({str(error).splitlines()[0][:160]})") from None
        control = StoreControl(group_store, "control/", self.rank, self.size) if hot_swap else None
        self.communicator = Communicator(Transport(self.group, backend="gloo"), name=spec.key, control=control,
                                         check=self.size > 1)
        self.collectives = 0
        self.closed = False
        self.strategy = strategy(self) if strategy is not None else None
        # world 1, no policy on the communicator: a collective may run as the copy it is (.direct)
        self.can_direct = self.size == 1 and self.strategy is None and control is None
        self._world_of_one = self.communicator.transport.world_of_one  # (the runtime's world-1 copies, or None)
        self.direct = self.can_direct  # whether it does (a session may turn it off: the benchmarks' A/B)
        self.direct_calls = 0  # collectives run directly, not by gloo
        self._vouched: set[tuple[str, torch.dtype, str]] = set()  # (kind, dtype, reduction) gloo has run for this job

    def run(self, kind: str, tensors: list[torch.Tensor], reduce: str) -> None:
        """One collective on tensors that view the tenant's checked buffers; :class:`JobFailed` when the
        group broke, any other refusal of the runtime as :class:`BadRequest`."""
        if self.closed:
            raise JobFailed(f"job {self.spec.name!r} on host rank {self.rank} is closed")
        signature = (kind, tensors[0].dtype, reduce) if self.direct else None
        if signature is not None and signature in self._vouched and direct.run(kind, tensors):
            self.direct_calls += 1
            self.collectives += 1
            return
        if self.strategy is not None:
            nbytes = max(tensor.numel() * tensor.element_size() for tensor in tensors)
            self.strategy.between(self, kind, nbytes)
        comm = self.communicator
        try:
            if kind == "all_gather":
                comm.all_gather_into_tensor(tensors[0], tensors[1])
            elif kind == "reduce_scatter":
                comm.reduce_scatter_tensor(tensors[0], tensors[1], TORCH_REDUCTIONS[reduce])
                if reduce == "avg":
                    tensors[0].div_(self.size)
            elif kind == "all_reduce":
                comm.all_reduce(tensors[0], TORCH_REDUCTIONS[reduce])
                if reduce == "avg":
                    tensors[0].div_(self.size)
            else:
                comm.all_to_all_single(tensors[0], tensors[1])
        except MCCLError as error:
            if comm.broken is not None:
                raise JobFailed(f"job {self.spec.name!r} on host rank {self.rank}: {error}") from None
            raise BadRequest(f"{kind}: {error}") from None
        except RuntimeError as error:  # gloo refused the call (e.g. an unsupported reduction for the dtype)
            raise BadRequest(f"{kind}: {str(error).splitlines()[0][:200]}") from None
        if signature is not None:
            self._vouched.add(signature)
        self.collectives += 1

    @property
    def direct(self) -> bool:
        """Whether this job's collectives run directly (:mod:`.direct`). Turned off on a job that could, every
        call is gloo's: the runtime's own world-1 copies (:mod:`mccl.runtime.single`) are turned off with it."""
        return self._direct

    @direct.setter
    def direct(self, on: bool) -> None:
        self._direct = on
        if not self.closed:
            self.communicator.transport.world_of_one = self._world_of_one if on or not self.can_direct else None

    @property
    def broken(self) -> bool:
        return self.failure is not None

    @property
    def failure(self) -> str | None:
        """Why this job takes no more collectives (closed, or its group broke), None while it does."""
        if self.closed:
            return "closed"
        broken = self.communicator.broken
        return None if broken is None else str(broken)

    def close(self) -> None:
        """End this rank: the strategy, the communicator's threads, and the group.

        The peers must learn of it now, not at the job's timeout (a rank of a tenant that crashed, blocked in
        a collective of this job on another host). gloo's ``abort()`` does not close the group's connections
        (measured, torch 2.13: the peer still waits for its timeout); destroying the group does. So the job
        drops its own references to the group and its communicator here, whoever still holds the ``Job``
        (a session's cached checks, a strategy): a closed job only refuses collectives."""
        if self.closed:
            return
        self.closed = True
        if self.strategy is not None:
            try:
                self.strategy.closed(self)
            except Exception:  # a policy's bug must not keep a session from ending
                log.exception("mccl provider: the strategy of job %s failed to close", self.spec.key)
            self.strategy = None
        self.communicator.close()
        with contextlib.suppress(RuntimeError):
            self.group.abort()
        del self.communicator, self.group  # (the last references: the group is destroyed, its connections closed)
