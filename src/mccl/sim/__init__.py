"""Evaluating schedules: the analytic α-β model (the flow-level simulator comes next)."""

from mccl.sim.analytic import Evaluation, busbw_factor, evaluate

__all__ = ["Evaluation", "busbw_factor", "evaluate"]
