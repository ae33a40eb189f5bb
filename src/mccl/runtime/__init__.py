"""mccl.runtime: the executor inside each rank (mccl-paper §3.3, §5, §6.2).

Read first: ``api`` (the user API), ``communicator`` (sequence numbers, issuing,
hot-swap callbacks), ``executor`` (a plan on point-to-point operations), ``plan``
(Schedule → this rank's operations, pure), ``collectives`` (torch-shaped calls → bodies
the communicator runs), ``agreement`` (every rank agrees on a call's shape first),
``calls`` (which path ran each call), ``binding`` (the per-size work, cached),
``drivers`` (how operations are issued and waited for: one protocol, ``prepare`` →
program, ``run``), ``transport`` (gloo vs NCCL, named), ``telemetry`` (passive
measurement), ``hotswap`` (version agreement), ``sources`` (the seams to the
controller), ``backend`` (torch.distributed backend "mccl"), ``torch_private``
(every private torch API the runtime uses, and why).

This package imports torch; ``import mccl`` does not load it until one of the names
below is used (``mccl.init`` etc. are resolved lazily).
"""

from mccl.runtime.api import (
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    communicator_of,
    init,
    reduce_scatter_tensor,
)
from mccl.runtime.communicator import Communicator
from mccl.runtime.hotswap import StoreControl, SwapRecord
from mccl.runtime.sources import LocalScheduleSource, MemorySink, Sample, ScheduleSource, TelemetrySink
from mccl.runtime.telemetry import TelemetryConfig

__all__ = [
    "Communicator",
    "LocalScheduleSource",
    "MemorySink",
    "Sample",
    "ScheduleSource",
    "StoreControl",
    "SwapRecord",
    "TelemetryConfig",
    "TelemetrySink",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "communicator_of",
    "init",
    "reduce_scatter_tensor",
]
