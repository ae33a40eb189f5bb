"""mccl.control: the controller (mccl-paper §3.1–§3.2): the slow path of the loop.

Read first: ``manager`` (the Schedule Manager: versions, decisions, calls into
synth), ``drift`` (Algorithm 1 and the measured topology), ``ewma`` (smoothing),
``intake`` (a telemetry batch folded in, vectorized), ``guard`` (never worse than what it
replaces), ``config`` (``ControlConfig``), ``records`` (events, decisions, per-version state),
``service`` / ``client`` / ``protocol`` (the ZeroMQ endpoint executors talk to),
and :mod:`mccl.experiments.demo` (the live closed loop behind ``mccl demo``).

Imports neither torch nor ``mccl.runtime``: the client satisfies the runtime's
``ScheduleSource`` / ``TelemetrySink`` protocols structurally.
"""

from mccl.control.client import ControllerClient
from mccl.control.manager import ControlConfig, ScheduleManager
from mccl.control.service import ControllerService
from mccl.telemetry import Sample

# What a user calls; the drift test, the EWMA and the manager's records are importable from
# mccl.control.drift, mccl.control.ewma and mccl.control.manager.
__all__ = ["ControlConfig", "ControllerClient", "ControllerService", "Sample", "ScheduleManager"]
