"""The PNG of ``mccl sim fig14``: training step time and speedup per model, fault and cluster size.

One column per model; top row the step time of NCCL (solid) and mccl (dashed) per fault state,
bottom row mccl's speedup per fault with the paper's Fail2 peak and the healthy 1.00× marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mccl.experiments.fig14_results import StepResult

__all__ = ["plot_fig14"]

FAULT_COLORS = {"healthy": "C0", "Fail1": "C1", "Fail2": "C2", "Fail3": "C3"}  # the same colour in every panel


def plot_fig14(steps: Sequence[StepResult], title: str, out_dir: str | Path, name: str = "fig14") -> Path:
    """Write ``<out_dir>/<name>.png`` and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mccl.experiments.fig14_workloads import WORKLOADS

    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    models = list(dict.fromkeys(step.workload for step in steps))
    peaks = {workload.name: workload.paper_fail2_peak for workload in WORKLOADS.values()}
    figure, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 7), squeeze=False)
    for column, model in enumerate(models):
        mine = [step for step in steps if step.workload == model]
        faults = list(dict.fromkeys(step.fault for step in mine))
        top, bottom = axes[0, column], axes[1, column]
        for fault in faults:
            series = sorted(((step.n_gpus, step) for step in mine if step.fault == fault), key=lambda item: item[0])
            sizes = [n for n, _ in series]
            color = FAULT_COLORS.get(fault, "C4")
            top.plot(sizes, [s.nccl_step_s for _, s in series], marker="o", color=color, label=f"NCCL {fault}")
            top.plot(sizes, [s.mccl_step_s for _, s in series], marker="x", linestyle="--", color=color,
                     label=f"mccl {fault}")
            bottom.plot(sizes, [s.speedup for _, s in series], marker="o", color=color, label=fault)
        bottom.axhline(peaks.get(model, 1.0), color="black", linestyle=":", linewidth=1,
                       label=f"paper Fail2 peak {peaks.get(model, 1.0):.2f}x")
        bottom.axhline(1.0, color="grey", linewidth=0.8)
        for axis in (top, bottom):
            axis.set_xscale("log", base=2)
            axis.set_xlabel("GPUs (one pipeline stage)")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
        top.set_yscale("log")
        top.set_ylabel("training step time (s)")
        top.set_title(model, fontsize=10)
        bottom.set_ylabel("speedup of mccl over NCCL")
    figure.suptitle(title, fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path
