"""Terminal and PNG output of the netemu demo: the live rows, the summary tables, the timeline plot.

The plot is its own (two panels, wall-clock axis) rather than :func:`mccl.experiments.plotting.plot_report`,
whose timeline puts every series on one axis labelled "simulated time": AllGather and AllToAll
algbw differ by ~2× here, and the time is wall-clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mccl.experiments.netemu.report import NetemuReport

__all__ = ["live_row", "print_summary", "plot_timeline", "first_words"]


def live_row(console: Console) -> Callable[[tuple], None]:
    """A callback printing one line per collective as rank 0 finishes it."""
    def show(item: tuple) -> None:
        kind, seq, version, _start, seconds, algbw, phase, ok = item
        flag = "" if ok else "  [red]WRONG[/red]"
        console.print(f"  {kind:<9} #{seq:<3} v{version:<3} {seconds * 1e3:7.1f} ms  {algbw * 1e3:7.3f} MB/s  {phase}{flag}")
    return show


def _fmt(value: float | None, scale: float = 1e3, unit: str = "") -> str:
    return "-" if value is None else f"{value * scale:.2f}{unit}"


def _fabric_words(config: dict) -> str:
    """What the ranks ran on, for titles: the pacer demo shares this summary (house3 found it titled netemu)."""
    return "the in-process pacer" if config.get("fabric") == "pacer" else "the emulated fabric"


def print_summary(console: Console, report: NetemuReport) -> None:
    """Phase medians against the controller's model, reaction times, swaps, correctness."""
    config = report.config
    table = Table(title=f"{config['hosts']}×{config['gpus_per_host']} ranks on {_fabric_words(config)} "
                        f"(NICs {report.nic_mbit:g} Mbit/s = 1/{report.scale:g}; rank {config['fault_rank']}'s NIC "
                        f"×{config['fault_factor']:g} mid-run, then restored) — algbw in MB/s")
    for column in ("collective", "phase", "version", "measured", "model", "measured/model", "swaps"):
        table.add_column(column, justify="right")
    for kind in report.kinds():
        for phase in ("healthy", "degraded", "recovered", "restored"):
            measured = report.median_algbw(kind, phase)
            if measured is None:
                continue
            versions = report.phase_versions(kind, "degraded" if phase in ("degraded", "recovered") else phase)
            version = (versions[0] if phase == "degraded" else versions[-1]) if versions else 1
            if phase == "healthy":
                version = next((r.version for r in reversed(report.stream(kind)) if r.phase == "healthy"), 1)
            model = report.predicted(kind, version)
            swaps = report.swaps_in(kind, "degraded") if phase == "recovered" else (
                report.swaps_in(kind, "restored") if phase == "restored" else "")
            table.add_row(kind, phase, f"v{version}", _fmt(measured), _fmt(model),
                          "-" if not model else f"{measured / model:.2f}", str(swaps))
    console.print(table)
    for kind in report.kinds():
        for phase in ("degraded", "restored"):
            r = report.reaction(kind, phase)
            console.print(f"  {kind} after the {'fault' if phase == 'degraded' else 'repair'}: detection "
                          f"{_fmt(r['detect_s'], unit=' ms')} ({_fmt(r['detect_collectives'], 1)} collectives); then "
                          f"synthesis {_fmt(r['synth_s'], unit=' ms')} (issued {_fmt(r['issue_s'], unit=' ms')} after the flag"
                          + (f", {r['kept_flags']:.0f} flag(s) kept by the guard before" if r["kept_flags"] else "") + "), "
                          f"dispatch {_fmt(r['dispatch_s'], unit=' ms')}, swap {_fmt(r['swap_total_s'], unit=' ms')} "
                          f"(OOB {_fmt(r['oob_s'], unit=' ms')}): active {_fmt(r['activation_s'], unit=' ms')} after detection; "
                          + _first_words(report, kind, phase, r))
    checked = sum(1 for r in report.records if r.torch_checked)
    stats = report.controller_stats
    console.print(f"  {len(report.records)} collectives, every output equal to the known answer"
                  + (f" and {checked} to torch's gloo collective" if checked else "")
                  if report.all_correct else "  [red]some outputs were NOT correct[/red]")
    console.print(f"  telemetry: {stats.get('samples', 0)} samples, {stats.get('telemetry_dropped', 0)} dropped; "
                  f"tc change {report.tc_s[0] * 1e3:.1f} ms, restore {report.tc_s[1] * 1e3:.1f} ms; wall "
                  f"{report.wall_s:.1f} s (start-up to the first collective {report.startup_s:.1f} s), teardown "
                  f"{report.teardown_s * 1e3:.0f} ms")


def _first_words(report: NetemuReport, kind: str, phase: str, r: dict) -> str:
    """:func:`first_words` on this run's reaction path (:func:`mccl.experiments.reaction_path.reaction_path`)."""
    from mccl.experiments.reaction_path import reaction_path

    return first_words(reaction_path(report, kind, phase), report.stream(kind), report.records, r)


def first_words(path: dict, stream: Sequence, records: Sequence, r: dict) -> str:
    """The first collective on the new version, and what the time after the agreement went to: ``path``'s
    ``running`` (the collective in flight still ending) and ``between`` (the demo loop between two collectives).
    Why split: the loop's own work between two collectives — every rank checks its output, the other stream runs
    its collective and, every ``torch_check_every`` iterations, torch's gloo collective runs on the same shaped
    fabric (0.8–1.6 s here) — is not the swap's, yet read as one "wait for the collectives in flight" it put a
    repair's swap-back 1.2 s after its detection (thirteenth session). ``stream``: this collective's records,
    ``records``: every stream's; ``r``: :meth:`NetemuReport.reaction`'s terms, said as before where the path's
    marks are missing."""
    if path["detect_to_first"] is None or path["running"] is None or path["between"] is None:
        return (f"first collective on it {_fmt(r['detect_to_first_s'], unit=' ms')} after detection "
                f"(waited {_fmt(r['inflight_wait_s'], unit=' ms')} for the collectives in flight)")
    first = next((rec for rec in stream if rec.version == path["version"]), None)
    before = [rec for rec in stream if first is not None and rec.start < first.start]
    checked = bool(before) and any(  # torch checked the last one on the old version, or another stream's meanwhile
        rec.torch_checked and (rec is before[-1] or (rec.kind != before[-1].kind
                                                     and before[-1].start < rec.start < first.start))
        for rec in records)
    return (f"first collective on it {path['detect_to_first']:.1f} ms after detection (after the agreement: "
            f"{path['running']:.1f} ms until the collective in flight ended, {path['between']:.1f} ms of the demo "
            f"loop between two collectives — its output checks, the other stream's collective"
            + (", torch's cross-check" if checked else "") + ")")


def plot_timeline(report: NetemuReport, out_dir: str | Path, name: str = "netemu_demo") -> Path:
    """``<out_dir>/<name>.png``: algbw per collective over wall-clock time, one panel per collective,
    one colour per schedule version, the fabric changes and the controller's events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    kinds = report.kinds()
    figure, axes = plt.subplots(len(kinds), 1, figsize=(10, 3.2 * len(kinds)), sharex=True, squeeze=False)
    origin = report.records[0].start if report.records else 0.0
    marks = report.marks()
    for axis, kind in zip(axes[:, 0], kinds, strict=True):
        stream = report.stream(kind)
        for version in sorted({r.version for r in stream}):
            points = [(r.start + r.seconds - origin, r.algbw_gbs * 1e3) for r in stream if r.version == version]
            axis.plot([t for t, _ in points], [a for _, a in points], marker=".", linestyle="-", label=f"v{version}")
        short = {"allgather": "AG", "alltoall": "A2A"}[kind] if kind in ("allgather", "alltoall") else kind
        for when, what in marks:
            if what.startswith(("NIC", short + " ")):
                style = "-" if what.startswith("NIC") else ":"
                axis.axvline(when, color="black" if style == "-" else "grey", linestyle=style, linewidth=1)
                axis.annotate(what, (when, 0.98), xycoords=("data", "axes fraction"), rotation=90, fontsize=6,
                              va="top", ha="right")
        axis.set_ylabel(f"{kind} algbw (MB/s)")
        axis.legend(fontsize=6, ncol=6, loc="lower left")
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("wall-clock time since the first collective (s)")
    figure.suptitle(f"mccl live loop on {_fabric_words(report.config)} ({report.config['hosts']}×{report.config['gpus_per_host']}, "
                    f"NICs {report.nic_mbit:g} Mbit/s)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


# ``mccl demo``'s reaction path on the emulated fabric (issue 15, seventh session): the hold (a launch during a swap
# round waits, once, ≤ 0.1 s for the round to end: without it the new version waited a whole collective more, ~320 ms
# at the demo's rates) and the swap thread and clients' I/O threads 10 steps of niceness above the collectives' (root,
# which the fabric needs anyway). Neither changes which schedule runs a collective (mccl.runtime.hotswap).
DEMO_REACTION = {"swap_hold_s": 0.1, "swap_priority": 10}


def run_and_print(console: Console, *, quick: bool, alpha: float | None, gamma: float | None, out: str | Path) -> bool:
    """``mccl demo`` (default fabric): False (after one line saying why) when the fabric cannot be built
    here, so the caller falls back to the in-process pacer; otherwise run, print, plot, True."""
    from mccl.experiments.netemu.demo import NetemuConfig, run_netemu_demo
    from mccl.experiments.netemu.fabric import unsupported_reason

    reason = unsupported_reason()
    if reason is not None:
        console.print(f"netemu: {reason}; falling back to the in-process pacer")
        return False
    knobs = {key: value for key, value in (("alpha", alpha), ("gamma", gamma)) if value is not None}
    if quick:
        knobs.update(healthy=4, after_swap=2, max_degraded=8, max_recovered=8)
    config = NetemuConfig(**{**DEMO_REACTION, **knobs})
    report = run_netemu_demo(config, progress=lambda text: console.print(text, style="dim"),
                             on_collective=live_row(console))
    print_summary(console, report)
    console.print(f"timeline: {plot_timeline(report, out)}")
    return True
