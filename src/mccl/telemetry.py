"""The telemetry sample: the contract between executors (``mccl.runtime``) and the
controller (``mccl.control``).

A leaf module like :mod:`mccl.errors`: it imports nothing of mccl, so the runtime
(which must not import the controller) and the controller (which must not import
the runtime or torch) share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["INTER", "INTRA", "Sample"]

INTER = "inter"
INTRA = "intra"


@dataclass(frozen=True)
class Sample:
    """One measurement window (mccl-paper §5): ``bytes`` moved in ``seconds`` while saturated.

    ``kind``: ``"intra"`` — the rank's cumulative injection rate into its host fabric
    (all peers on its host together, §3.3), ``peer`` is -1; ``"inter"`` — one rank
    pair across hosts. ``end_time``: wall clock (s since the epoch) when the window
    closed. ``seq``: the communicator's sequence number of the collective.
    ``collective`` and ``version``: the schedule whose traffic the window measured, when the
    sender knows it ("" and -1: unknown). Why: a rank pair's rate depends on the schedule
    (how many pairs share a NIC), so the controller compares a sample only with references
    learned under the same version; untagged samples are attributed by sequence number.
    """

    kind: str
    communicator: str
    rank: int
    peer: int
    bytes: int
    seconds: float
    end_time: float
    seq: int
    collective: str = ""
    version: int = -1

    @property
    def gbps(self) -> float:
        """The measured rate in Gbit/s (topology units)."""
        return self.bytes * 8 / self.seconds / 1e9 if self.seconds > 0 else float("inf")
