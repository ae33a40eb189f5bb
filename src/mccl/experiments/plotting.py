"""PNG plots of scenario reports (matplotlib, Agg backend: no display needed).

Table scenarios (Fig. 2, Fig. 9) become grouped bars of algbw per fabric state,
one panel per collective; a report with a timeline (the MCCS ring reversal)
becomes algbw over time with its events marked.
"""

from __future__ import annotations

from pathlib import Path

from mccl.experiments.report import ScenarioReport

__all__ = ["plot_report"]


def plot_report(report: ScenarioReport, out_dir: str | Path) -> Path:
    """Write ``<out_dir>/<report.name>.png`` and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{report.name}.png"
    figure = _timeline(plt, report) if report.timeline else _bars(plt, report)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


def _timeline(plt, report: ScenarioReport):  # type: ignore[no-untyped-def]
    figure, axis = plt.subplots(figsize=(9, 4))
    labels = sorted({label for _, _, label in report.timeline})
    for label in labels:
        points = [(t, algbw) for t, algbw, name in report.timeline if name == label]
        axis.plot([t for t, _ in points], [a for _, a in points], marker=".", linestyle="-", label=label)
    for when, what in report.events:
        axis.axvline(when, color="grey", linestyle="--", linewidth=1)
        axis.annotate(what, (when, axis.get_ylim()[1] * 0.95), rotation=90, fontsize=7, va="top", ha="right")
    axis.set_xlabel("simulated time (s)")
    axis.set_ylabel("algbw (GB/s)")
    axis.set_title(report.title, fontsize=9)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    return figure


def _bars(plt, report: ScenarioReport):  # type: ignore[no-untyped-def]
    collectives = list(dict.fromkeys(row.collective for row in report.rows))
    figure, axes = plt.subplots(len(collectives), 1, figsize=(11, 3.6 * len(collectives)), squeeze=False)
    for axis, collective in zip(axes[:, 0], collectives, strict=True):
        rows = [row for row in report.rows if row.collective is collective]
        states = list(dict.fromkeys(row.scenario for row in rows))
        schedules = list(dict.fromkeys(row.schedule for row in rows))
        width = 0.8 / max(len(schedules), 1)
        for index, schedule in enumerate(schedules):
            values = []
            for state in states:
                match = [row for row in rows if row.scenario == state and row.schedule == schedule]
                values.append(match[0].algbw_gbs if match and match[0].algbw_gbs is not None else 0.0)
            positions = [i + (index - (len(schedules) - 1) / 2) * width for i in range(len(states))]
            axis.bar(positions, values, width, label=schedule)
        axis.set_xticks(range(len(states)))
        axis.set_xticklabels(states, fontsize=8, rotation=15)
        axis.set_ylabel("algbw (GB/s)")
        missing = " (missing bars: not yet available)" if any(row.algbw_gbs is None for row in rows) else ""
        axis.set_title(f"{report.title} — {collective.value}{missing}", fontsize=9)
        axis.legend(fontsize=7)
        axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return figure
