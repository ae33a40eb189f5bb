"""What one Fig. 14 training step costs: per collective call and per step (kept apart from the model in
:mod:`mccl.experiments.fig14` so that the plot can read them without importing the model)."""

from __future__ import annotations

from dataclasses import dataclass

from mccl.experiments.fig14_workloads import CollectiveCall

__all__ = ["CallTime", "StepResult"]


@dataclass(frozen=True)
class CallTime:
    """One collective call of a step: the slowest group's time for each library, and why."""

    call: CollectiveCall
    count: int
    nccl_s: float  # per call, max over the faulted group and a healthy one
    mccl_s: float
    mccl_choice: str  # "re-optimized", "baseline kept (faster)", "skipped at bound"
    faulted_nccl_s: float  # the group holding gpu0 on the faulted fabric (with joint_groups > 1: all of them, together)
    faulted_reopt_s: float | None  # the re-optimized schedule of that group (None: skipped)
    joint_groups: int = 1  # groups timed together on the union of their link loads (fig14_joint); 1: alone


@dataclass(frozen=True)
class StepResult:
    """One training step of ``workload`` on ``n_gpus`` under ``fault``."""

    workload: str
    n_gpus: int
    fault: str
    compute_s: float
    nccl_comm_s: float
    mccl_comm_s: float
    calls: tuple[CallTime, ...]
    synth_cpu_s: float  # CPU seconds spent by the synthesizers for this row (cache misses only)
    step: str = "16k"  # "16k": the paper's 16K-token step; "gbs": workloads.md's global-batch step

    @property
    def nccl_step_s(self) -> float:
        return self.compute_s + self.nccl_comm_s

    @property
    def mccl_step_s(self) -> float:
        return self.compute_s + self.mccl_comm_s

    @property
    def speedup(self) -> float:
        return self.nccl_step_s / self.mccl_step_s
