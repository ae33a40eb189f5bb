"""The point-to-point transport under the executor: one long-lived torch process group.

Everything that differs between gloo (CPU, tests) and NCCL (GPUs) is here, named:

* **Matching.** gloo matches a receive to a send by (peer, tag); NCCL ignores tags and
  matches in issue order per peer pair. The plan gives every operation the ordinal
  of its peer pair as tag *and* the executor issues operations to a peer in that
  order, so both rules hold at once.
* **Issuing.** NCCL needs the sends and receives of one step inside one group
  (``ncclGroupStart/End``, torch's coalescing manager): two ranks that each post a
  receive before their send to the other would deadlock otherwise. gloo has no
  groups; each operation is posted on its own, receives first, because a gloo send
  completes only once the peer has posted the matching receive.
* **Progress.** On NCCL the stream orders the steps: the executor enqueues every step
  and the CPU does not wait. gloo needs the CPU to wait for a chunk before
  forwarding it, so :attr:`Transport.dependency_driven` selects the executor's
  eager driver, which waits in ``Work.wait()`` (the GIL is released there) and
  forwards each chunk as soon as it arrives — pipelining across chunks.
* **Failure.** A blocking ``Work.wait()`` on a rank whose peer died returns only at the
  process-group timeout (30 min by default), or never for a peer stuck behind the dead
  one; gloo's abort does not unblock a pending receive. With a store, a transport watches
  its peers (:class:`~mccl.runtime.liveness.Liveness`, ``MCCL_PEER_TIMEOUT``); when the
  watcher loses a rank, :meth:`Transport._break` ends every pending wait of the group
  with an error, and :class:`PeerLost` names the first rank lost, not the peer of the
  wait. Waits stay plain blocking ``wait()`` calls: watching costs nothing per operation.
* **Hazards of gloo** (measured, see issue 6): never call ``wait(timeout)`` (an
  expired wait breaks the group for good); a message larger than the posted receive aborts the receiving process
  (the executor checks tensor sizes before it issues anything, and receive sizes
  come from the same deterministic layout as send sizes).

* **Emulated gray failures** (demos, tests): :meth:`Transport.throttle` paces the
  sends to some peers through a :class:`~mccl.runtime.throttle.Pacer` (gloo only).

Transport groups are long-lived (creating one costs 20–90 ms across 8 ranks): a hot
swap replaces the schedule, never the group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from mccl.errors import MCCLError, PeerLost
from mccl.runtime import torch_private
from mccl.runtime.arrivals import ArrivalClock
from mccl.runtime.completions import CompletionWaiters
from mccl.runtime.liveness import Liveness, peer_timeout_s
from mccl.runtime.single import WorldOfOne, copy_collective, whole
from mccl.runtime.throttle import Pacer

__all__ = ["P2P", "Transport", "TAG_SPAN"]

_BREAK_TAG = (1 << 31) - 1  # above every tag space (1024 × TAG_SPAN): never matched by a send
TAG_SPAN = 1 << 20  # ordinals per peer pair and collective; collectives cycle through 1024 tag spaces


@dataclass(frozen=True)
class P2P:
    is_send: bool
    tensor: torch.Tensor
    peer: int
    tag: int


NCCL_TIMEOUT_PEERS = 6
"""The NCCL transport group's timeout, in peer timeouts (``MCCL_PEER_TIMEOUT``): 60 s by default."""


def nccl_timeout(group_timeout: timedelta | None = None, peer_timeout: float | str | None = None) -> timedelta:
    """The NCCL transport group's timeout: the group's own (``init_process_group``'s), at most
    ``NCCL_TIMEOUT_PEERS`` × ``MCCL_PEER_TIMEOUT``. Why bounded: on NCCL the liveness watcher cannot end a
    wait (the stream waits, not the CPU; :meth:`Transport._break`), so NCCL's watchdog is the only bound on
    a lost peer, and torch's default for it is 10 minutes. A multiple of the peer timeout, not the peer
    timeout itself: the watchdog times one operation, and a step of a large collective may rightly take
    longer than a heartbeat gap."""
    bound = timedelta(seconds=NCCL_TIMEOUT_PEERS * peer_timeout_s(peer_timeout))
    return bound if group_timeout is None else min(group_timeout, bound)


def nccl_group(store: dist.Store, rank: int, size: int, timeout: timedelta) -> object:
    """A ProcessGroupNCCL whose operations time out after ``timeout`` (:func:`nccl_timeout`). Not run here:
    the machines this was written on have no CUDA."""
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, size, options)


class Transport:
    """Point-to-point operations over ``group`` (a ProcessGroup or a c10d Backend), in group ranks.

    ``store``: a store private to this transport (a PrefixStore of the job's) through which the
    ranks exchange their liveness addresses; None: no peer watching (waits block, module docstring).
    ``peer_timeout_s``: how long a silent peer is waited for (default ``MCCL_PEER_TIMEOUT``, 10 s)."""

    def __init__(self, group: dist.ProcessGroup | object, *, backend: str | None = None,
                 store: dist.Store | None = None, peer_timeout_s: float | None = None) -> None:
        self.group = group
        name = backend or _backend_name(group)
        if name not in ("gloo", "nccl"):
            raise MCCLError(f"mccl runs on a gloo or nccl transport group, not {name!r}")
        self.backend = name
        self.rank = int(group.rank())
        self.size = int(group.size())
        self._pacers: dict[int, Pacer] = {}
        self.before_send: Callable[[], None] | None = None  # a time-shared job's send gate (runtime.sendgate)
        self._waiting: list[int] = []  # the peer of every wait in progress (-1: a collective)
        # set per call by a metered executor: receives posted meanwhile are timed by its waiter threads
        self.arrivals: ArrivalClock | None = None
        self.liveness = (Liveness(store, self.rank, self.size, timeout_s=peer_timeout_s, waits_on=self._waits_on,
                                  on_loss=self._break)
                         if store is not None and self.size > 1 else None)
        # a gloo group of one rank: its collectives as the copies they are, once gloo ran each kind (runtime.single)
        self.world_of_one = WorldOfOne() if self.size == 1 and name == "gloo" else None
        self._waiters: CompletionWaiters | None = None

    def waiters(self) -> CompletionWaiters | None:
        """The threads that report the eager driver's completions as they happen (:mod:`mccl.runtime.completions`),
        started with the first call that needs them; None on NCCL (its driver posts by step, not by completion)."""
        if self.backend != "gloo":
            return None
        if self._waiters is None:
            self._waiters = CompletionWaiters(self.wait)
        return self._waiters

    def throttle(self, peers: Sequence[int], gbps: float | None) -> None:
        """Pace every later send to ``peers`` at ``gbps`` through one shared pacer (an emulated
        degraded link, see :mod:`mccl.runtime.throttle`); ``gbps=None`` lifts it. gloo only."""
        if self.backend != "gloo":
            raise MCCLError("throttling emulates a slow link on gloo; NCCL sends are not paced")
        for peer in peers:
            if not 0 <= peer < self.size or peer == self.rank:
                raise MCCLError(f"cannot throttle sends to rank {peer}: ranks are 0..{self.size - 1}, not self")
        old = {self._pacers.pop(peer) for peer in peers if peer in self._pacers}
        if gbps is not None:
            pacer = Pacer(gbps)
            self._pacers.update(dict.fromkeys(peers, pacer))
        for pacer in old - set(self._pacers.values()):
            pacer.close()

    @property
    def sends_one_by_one(self) -> bool:
        """Some sends must go through :meth:`post` one at a time: a peer is paced (an emulated slow
        link) or a send gate holds sends (time sharing). gloo's alltoallv would bypass both."""
        return bool(self._pacers) or self.before_send is not None

    @property
    def dependency_driven(self) -> bool:
        """gloo: the CPU must wait for a chunk before forwarding it (see module docstring)."""
        return self.backend == "gloo"

    def post(self, op: P2P) -> object:
        """Issue one operation now (gloo); returns its Work. A peer known lost, or a backend that
        refuses the operation (its connection to the peer broke), raises :class:`PeerLost`."""
        self.check_peers()
        try:
            if op.is_send:
                if self.before_send is not None:
                    self.before_send()
                pacer = self._pacers.get(op.peer)
                if pacer is not None:
                    return pacer.submit(lambda: self.group.send([op.tensor], op.peer, op.tag),
                                        op.tensor.numel() * op.tensor.element_size())
                return self.group.send([op.tensor], op.peer, op.tag)
            work = self.group.recv([op.tensor], op.peer, op.tag)
            return work if self.arrivals is None else self.arrivals.watch(work, op.peer)
        except RuntimeError as error:
            raise self._peer_lost(error, op.peer) from error

    def post_group(self, ops: Sequence[P2P]) -> list[object]:
        """Issue ``ops`` together: one NCCL group (coalesced: one Work), or one by one, receives first,
        on gloo (one Work per operation, receives' first)."""
        ordered = [op for op in ops if not op.is_send] + [op for op in ops if op.is_send]
        if self.backend != "nccl" or not ordered:
            return [self.post(op) for op in ordered]
        self.check_peers()
        device = ordered[0].tensor.device
        torch_private.start_coalescing(self.group, device)
        for op in ordered:
            self.post(op)
        return [torch_private.end_coalescing(self.group, device)]

    def check_peers(self) -> None:
        """Raise :class:`PeerLost` naming the first rank lost, if the watcher knows of one."""
        if self.liveness is not None and self.liveness.lost.is_set():
            raise PeerLost(self.liveness.first_lost().describe())

    def wait(self, work: object, peer: int | None) -> None:
        """Block in ``work.wait()`` (``peer``: the rank it exchanges with, None for a collective). Never
        ``wait(timeout)`` here; when the watcher loses a rank it breaks the group (:meth:`_break`), which
        ends this wait with an error. A backend error becomes :class:`PeerLost`."""
        with self.waiting(peer):
            try:
                work.wait()
            except (RuntimeError, MCCLError) as error:  # (a paced send's failure is an MCCLError)
                if isinstance(error, PeerLost):
                    raise
                raise self._peer_lost(error, peer) from error

    @contextlib.contextmanager
    def waiting(self, peer: int | None) -> Iterator[None]:
        """A wait on ``peer`` (None: on any rank, as a collective's or a call's waiting for whichever of its
        operations completes first) is in progress: a silent ``peer`` is then lost after the peer timeout."""
        code = -1 if peer is None else peer
        self._waiting.append(code)
        try:
            yield
        finally:
            self._waiting.remove(code)  # (by value: waiter threads wait here too, in any order)

    def _waits_on(self, rank: int) -> bool:
        """Whether a wait is in progress that ``rank`` could be holding up (the watcher's question)."""
        return any(peer in (-1, rank) for peer in list(self._waiting))

    def _break(self, lost: int) -> None:
        """Make every pending gloo operation of this group fail now (the watcher lost ``lost``).

        A point-to-point Work cannot be aborted from Python and its ``is_completed()`` stays False
        until it is waited for; but a receive whose ``wait(timeout)`` expires makes gloo signal the
        error to every pair of its context (``UnboundBuffer::waitRecv``), which ends every blocked
        wait and collective of the group with an error. The group is broken anyway: one rank is
        gone. So post a receive that nothing will match and let it expire after a millisecond;
        from a live peer first (a pair the dead rank's EOF already broke may refuse the post)."""
        if self.backend != "gloo":
            return  # NCCL: the stream waits, not the CPU; ncclCommAbort is the user's call
        dummy = torch.empty(1)
        for peer in sorted(range(self.size), key=lambda p: (p == lost, p)):
            if peer == self.rank:
                continue
            try:
                self.group.recv([dummy], peer, _BREAK_TAG).wait(timedelta(milliseconds=1))
            except RuntimeError:
                return  # expired (or refused after the break): the context carries the error now
        return

    def explain_loss(self, error: Exception, peer: int | None = None) -> PeerLost:
        """``error`` (a failure of something that needs every rank, such as the hot-swap control channel)
        as :class:`PeerLost` named like the transport's own (:meth:`_peer_lost`)."""
        return self._peer_lost(error, peer)

    def _peer_lost(self, error: Exception, peer: int | None) -> PeerLost:
        """A backend error as :class:`PeerLost`, named after the first rank the watcher lost, else a
        rank that left (``peer``, or any for a collective), else ``peer``. gloo may see a broken
        connection before the watcher hears of it: it is given up to a second to."""
        text = str(error).strip()
        detail = text.splitlines()[0][:240] if text else type(error).__name__
        loss = self.liveness.explain(peer, grace_s=1.0) if self.liveness is not None else None
        if loss is not None:
            return PeerLost(f"{loss.describe()}; the transport reported: {detail}")
        who = f"rank {peer}" if peer is not None else "a rank of the group"
        return PeerLost(f"{who} stopped answering ({detail})")

    # torch's own collectives on the same group: the vendor path of mccl-paper §3
    def native_reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: dist.ReduceOp) -> None:
        options = dist.ReduceScatterOptions()
        options.reduceOp = op
        group = self.group
        self._native(("reduce_scatter", input.dtype, _reduction_key(op)),
                     lambda: copy_collective("reduce_scatter", output, input),
                     lambda: group.reduce_scatter_single(output, input, options)
                     if hasattr(group, "reduce_scatter_single")
                     else torch_private.reduce_scatter_base(group, output, input, options))

    def native_all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        group = self.group
        self._native(("all_gather", input.dtype), lambda: copy_collective("all_gather", output, input),
                     lambda: group.all_gather_single(output, input, torch_private.AllgatherOptions())
                     if hasattr(group, "all_gather_single") else torch_private.all_gather_base(group, output, input))

    def native_all_to_all(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int]) -> None:
        """torch's alltoallv on the group, waited for (empty split lists: even blocks); the vendor
        AllToAll and, on gloo, one step of the exchange driver."""
        options = dist.AllToAllOptions()
        self._native(("all_to_all", input.dtype),
                     lambda: whole(output_split_sizes, output) and whole(input_split_sizes, input)
                     and copy_collective("all_to_all", output, input),
                     lambda: self.group.alltoall_base(output, input, output_split_sizes, input_split_sizes, options))

    def native_all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp) -> None:
        """torch's AllReduce of ``tensor`` on the group, in place, waited for."""
        options = dist.AllreduceOptions()
        options.reduceOp = op
        self._native(("all_reduce", tensor.dtype, _reduction_key(op)), lambda: True,
                     lambda: self.group.allreduce([tensor], options))

    def _native(self, key: tuple, copy: Callable[[], bool], issue: Callable[[], object]) -> None:
        """One of torch's collectives (:meth:`_run_native`), or on a gloo group of one rank the copy it is
        once gloo has run ``key`` there (:mod:`mccl.runtime.single`)."""
        if self.world_of_one is None:
            self._run_native(issue)
        else:
            self.world_of_one.run(key, copy, lambda: self._run_native(issue))

    def barrier(self) -> None:
        self._run_native(self.group.barrier)

    def _run_native(self, issue: Callable[[], object]) -> None:
        """Issue one of torch's collectives and wait for it, failures as :class:`PeerLost`."""
        self.check_peers()
        try:
            work = issue()
        except RuntimeError as error:
            raise self._peer_lost(error, None) from error
        self.wait(work, None)

    def close(self) -> None:
        """Stop watching the peers and the waiter threads (the group itself belongs to whoever created it)."""
        if self.liveness is not None:
            self.liveness.close()
        if self._waiters is not None:
            self._waiters.close()


def _reduction_key(op: object) -> object:
    """A reduction as a set key: its ``RedOpType`` (a ``ReduceOp`` object hashes apart from its type; a
    ``premul_sum`` carries a factor, so it keys as itself and gloo, which refuses it, never vouches for it)."""
    if isinstance(op, dist.ReduceOp.RedOpType):
        return op
    kind = getattr(op, "op", None)
    return kind if kind is not None and kind != dist.ReduceOp.PREMUL_SUM else ("object", id(op))


def _backend_name(group: object) -> str:
    name = torch_private.backend_name(group)
    if name is None:
        getter = getattr(group, "name", None)  # a bare c10d Backend
        if getter is None:
            raise MCCLError(f"cannot tell the backend of {group!r}; pass backend='gloo' or 'nccl'")
        name = str(getter())
    name = name.lower()
    if name == "undefined":
        return dist.get_backend(group)
    return name
