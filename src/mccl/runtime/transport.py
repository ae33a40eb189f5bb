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
* **Hazards of gloo** (measured, see issue 6): never call ``wait(timeout)`` (an
  expired wait breaks the group for good: the executor always waits without a
  timeout); a message larger than the posted receive aborts the receiving process
  (the executor checks tensor sizes before it issues anything, and receive sizes
  come from the same deterministic layout as send sizes).

* **Emulated gray failures** (demos, tests): :meth:`Transport.throttle` paces the
  sends to some peers through a :class:`~mccl.runtime.throttle.Pacer` (gloo only).

Transport groups are long-lived (creating one costs 20–90 ms across 8 ranks): a hot
swap replaces the schedule, never the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mccl.errors import MCCLError, PeerLost
from mccl.runtime import torch_private
from mccl.runtime.throttle import Pacer

__all__ = ["P2P", "Transport", "TAG_SPAN", "wait"]

TAG_SPAN = 1 << 20  # ordinals per peer pair and collective; collectives cycle through 1024 tag spaces


@dataclass(frozen=True)
class P2P:
    is_send: bool
    tensor: torch.Tensor
    peer: int
    tag: int


class Transport:
    """Point-to-point operations over ``group`` (a ProcessGroup or a c10d Backend), in group ranks."""

    def __init__(self, group: dist.ProcessGroup | object, *, backend: str | None = None) -> None:
        self.group = group
        name = backend or _backend_name(group)
        if name not in ("gloo", "nccl"):
            raise MCCLError(f"mccl runs on a gloo or nccl transport group, not {name!r}")
        self.backend = name
        self.rank = int(group.rank())
        self.size = int(group.size())
        self._pacers: dict[int, Pacer] = {}

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
    def dependency_driven(self) -> bool:
        """gloo: the CPU must wait for a chunk before forwarding it (see module docstring)."""
        return self.backend == "gloo"

    def post(self, op: P2P) -> object:
        """Issue one operation now (gloo); returns its Work."""
        if op.is_send:
            pacer = self._pacers.get(op.peer)
            if pacer is not None:
                return pacer.submit(lambda: self.group.send([op.tensor], op.peer, op.tag),
                                    op.tensor.numel() * op.tensor.element_size())
            return self.group.send([op.tensor], op.peer, op.tag)
        return self.group.recv([op.tensor], op.peer, op.tag)

    def post_group(self, ops: Sequence[P2P]) -> list[object]:
        """Issue ``ops`` together: one NCCL group (coalesced: one Work), or one by one, receives first,
        on gloo (one Work per operation, receives' first)."""
        ordered = [op for op in ops if not op.is_send] + [op for op in ops if op.is_send]
        if self.backend != "nccl" or not ordered:
            return [self.post(op) for op in ordered]
        device = ordered[0].tensor.device
        torch_private.start_coalescing(self.group, device)
        for op in ordered:
            self.post(op)
        return [torch_private.end_coalescing(self.group, device)]

    # torch's own collectives on the same group: the vendor path of mccl-paper §3
    def native_reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: dist.ReduceOp) -> None:
        options = dist.ReduceScatterOptions()
        options.reduceOp = op
        work = (self.group.reduce_scatter_single(output, input, options) if hasattr(self.group, "reduce_scatter_single")
                else torch_private.reduce_scatter_base(self.group, output, input, options))
        wait(work, None)

    def native_all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        work = (self.group.all_gather_single(output, input, torch_private.AllgatherOptions())
                if hasattr(self.group, "all_gather_single") else torch_private.all_gather_base(self.group, output, input))
        wait(work, None)

    def native_all_to_all(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int]) -> None:
        """torch's alltoallv on the group, waited for (empty split lists: even blocks); the vendor
        AllToAll and, on gloo, one step of the exchange driver."""
        options = dist.AllToAllOptions()
        wait(self.group.alltoall_base(output, input, output_split_sizes, input_split_sizes, options), None)

    def barrier(self) -> None:
        wait(self.group.barrier(), None)


def wait(work, peer: int | None) -> None:
    """Wait for ``work`` without a timeout (an expired wait breaks a gloo group for good); a peer that
    died or hung up surfaces as a RuntimeError of the backend, turned here into :class:`PeerLost`."""
    try:
        work.wait()
    except RuntimeError as error:
        text = str(error).strip()
        detail = text.splitlines()[0][:240] if text else type(error).__name__
        who = f"rank {peer}" if peer is not None else "a rank of the group"
        raise PeerLost(f"{who} stopped answering ({detail})") from error


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
