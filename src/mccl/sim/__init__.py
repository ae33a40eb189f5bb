"""Evaluating schedules: the flow-level fabric simulator and the analytic α-β model.

``simulate(topology, jobs, background=..., changes=..., hook=...)`` runs jobs of
collectives on a fabric (max-min fair flows, link latency, chunk dependencies,
background traffic, link changes, ECMP or pinned paths, a closed-loop hook);
``simulate_schedule`` runs one collective alone; ``evaluate`` is the α-β bound.
"""

from mccl.sim.analytic import Evaluation, busbw_factor, evaluate
from mccl.sim.closedloop import ControlHook, ControlView, PathSample
from mccl.sim.ecmp import AS_SCHEDULED, AsScheduled, EcmpPaths, PathPolicy, PinnedPaths, ecmp_route, flow_key
from mccl.sim.engine import simulate, simulate_schedule
from mccl.sim.fairshare import FairShare, max_min_rates
from mccl.sim.inputs import BackgroundFlow, CapacityChange, CollectiveOp, Job, SimOptions, gray_failure, path_links
from mccl.sim.results import Cause, ChainStep, LinkUtilization, RunResult, SimResult, SimStats

__all__ = [
    "AS_SCHEDULED",
    "AsScheduled",
    "BackgroundFlow",
    "CapacityChange",
    "Cause",
    "ChainStep",
    "CollectiveOp",
    "ControlHook",
    "ControlView",
    "EcmpPaths",
    "Evaluation",
    "FairShare",
    "Job",
    "LinkUtilization",
    "PathPolicy",
    "PathSample",
    "PinnedPaths",
    "RunResult",
    "SimOptions",
    "SimResult",
    "SimStats",
    "busbw_factor",
    "ecmp_route",
    "evaluate",
    "flow_key",
    "gray_failure",
    "max_min_rates",
    "path_links",
    "simulate",
    "simulate_schedule",
]
