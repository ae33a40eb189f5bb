"""mccl.control: the controller (mccl-paper §3.1–§3.2): the slow path of the loop.

Read first: ``manager`` (the Schedule Manager: versions, decisions, calls into
synth), ``drift`` (Algorithm 1 and the measured topology), ``ewma`` (smoothing),
``service`` / ``client`` / ``protocol`` (the ZeroMQ endpoint executors talk to),
``demo`` (the live closed loop behind ``mccl demo``).

Imports neither torch nor ``mccl.runtime``: the client satisfies the runtime's
``ScheduleSource`` / ``TelemetrySink`` protocols structurally.
"""

from mccl.control.client import ControllerClient
from mccl.control.drift import CutProfile, DriftResult, drift_test, measured_capacities, overlay_map, profile
from mccl.control.ewma import OverlayEWMA
from mccl.control.manager import ControlConfig, Decision, Event, ScheduleManager
from mccl.control.service import ControllerService
from mccl.telemetry import Sample

__all__ = [
    "ControlConfig",
    "ControllerClient",
    "ControllerService",
    "CutProfile",
    "Decision",
    "DriftResult",
    "Event",
    "OverlayEWMA",
    "Sample",
    "ScheduleManager",
    "drift_test",
    "measured_capacities",
    "overlay_map",
    "profile",
]
