"""Evaluating schedules: the flow-level fabric simulator and the analytic α-β model.

``simulate(topology, jobs, background=..., changes=..., hook=...)`` runs jobs of
collectives on a fabric (max-min fair flows, link latency, chunk dependencies,
background traffic, link changes, ECMP or pinned paths, a closed-loop hook);
``simulate_schedule`` runs one collective alone; ``evaluate`` is the α-β bound.
"""

from mccl.sim.analytic import busbw_factor, evaluate
from mccl.sim.closedloop import ControlHook, ControlView
from mccl.sim.engine import simulate, simulate_schedule
from mccl.sim.inputs import BackgroundFlow, CapacityChange, CollectiveOp, Job, SimOptions, gray_failure
from mccl.sim.results import RunResult, SimResult

# What a user calls; path policies (mccl.sim.ecmp), the max-min solver (mccl.sim.fairshare) and the
# result records (mccl.sim.results) are importable from their modules.
__all__ = [
    "BackgroundFlow",
    "CapacityChange",
    "CollectiveOp",
    "ControlHook",
    "ControlView",
    "Job",
    "RunResult",
    "SimOptions",
    "SimResult",
    "busbw_factor",
    "evaluate",
    "gray_failure",
    "simulate",
    "simulate_schedule",
]
