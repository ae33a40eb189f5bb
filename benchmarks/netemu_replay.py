"""Replay the telemetry of ``benchmarks/netemu.py --dump`` runs through a ScheduleManager of this tree, offline.

    PYTHONPATH=src .venv/bin/python benchmarks/netemu.py --runs 2 --fresh-repeats 0 --dump /tmp/dumps --tag _x
    PYTHONPATH=src .venv/bin/python benchmarks/netemu_replay.py /tmp/dumps/netemu_run_x_*.pkl

Why: the swap back's evidence (``mccl.control.opportunity``, ``mccl.control.portlevel``) can then be judged on
the samples the emulated fabric really produced — when it would have fired after the repair, and whether it
fires during the fault (noise) — without root, without a loaded machine's timing and without another run.

Every rank's kept samples (receive side: a sample of ``sender → rank``; the ``collective`` ones its whole
collective) are fed in the order their windows closed, in batches of ``--batch-ms`` of sample time, and the manager's ``step()`` runs after each batch
(synthesis included, as the controller would). Tagged as the runtime tags them: a whole collective's sample with
its collective and the version the run's record gives it, a path sample untagged (the manager attributes it by
sequence number, ``settle`` collectives after an issue). The manager is the demo's (α, Γ, warmup, settle, chunks from the
run's config, speculation on) with the same healthy schedules registered. Versions the replay issues are not the
run's: a sample tagged with a version the replay has not issued is not counted (the run's samples stop telling
the replay anything there), and that is reported. Prints, per collective, the flags, issues and kept decisions
with the seconds and collectives after the fabric change they followed.
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

from mccl.control import ControlConfig, ScheduleManager
from mccl.experiments.demo import synth_options
from mccl.experiments.demo_ranks import COMMUNICATORS
from mccl.schedule import Collective
from mccl.synth import optimize
from mccl.telemetry import Sample
from mccl.topology import parse_topology


def replay(path: Path, batch_s: float) -> list[str]:
    with open(path, "rb") as handle:
        report = pickle.load(handle)
    config = report.config
    topology = parse_topology(f"rail_optimized(1,{config['hosts']},{config['gpus_per_host']})")
    options = synth_options(config["chunks"])
    control = ControlConfig(alpha=config["alpha"], gamma=config["gamma"], alpha_level=config["alpha_level"],
                            warmup=config["warmup"], settle_collectives=config["settle"], synth_options=options)
    manager = ScheduleManager(topology, control, speculate=config["speculate"])
    for kind in config["kinds"]:
        schedule = optimize(topology, kind, options=options[Collective(kind)]).schedule.with_meta(version=1)  # as the demo
        manager.register(COMMUNICATORS[kind], schedule)
    version_of = {(r.kind, r.seq): r.version for r in report.records}
    samples = []
    for rank, kept in report.telemetry.items():
        for kind, sample_kind, sender, nbytes, seconds, end, seq in kept:
            whole = sample_kind == "collective"  # tagged as the runtime tags them: whole collectives only
            samples.append(Sample(sample_kind, COMMUNICATORS[kind], int(sender), -1 if whole else rank, int(nbytes),
                                  float(seconds), float(end), int(seq), kind if whole else "",
                                  version_of.get((kind, seq), -1) if whole else -1))
    samples.sort(key=lambda s: s.end_time)
    events = []
    batch: list[Sample] = []
    for sample in samples:
        if batch and sample.end_time - batch[0].end_time > batch_s:
            manager.ingest(batch)
            events += [(batch[-1].end_time, event) for event in manager.step()]
            batch = []
        batch.append(sample)
    if batch:
        manager.ingest(batch)
        events += [(batch[-1].end_time, event) for event in manager.step()]
    lines = [f"{path.name}: fault at 0, repair at {report.restored_at - report.degraded_at:.2f} s"]
    for kind in config["kinds"]:
        ran = sorted({r.version for r in report.records if r.kind == kind})
        lines.append(f"  {kind}: the run's versions {ran}")
        starts = [(r.start, r.phase) for r in report.records if r.kind == kind]
        for at, event in events:
            if event.collective != kind or event.kind not in ("flagged", "issued", "kept", "aborted"):
                continue
            change, phase = (report.restored_at, "repair") if at >= report.restored_at else (report.degraded_at, "fault")
            after = sum(1 for start, _ in starts if change <= start <= at)
            lines.append(f"    {phase} +{at - change:6.2f} s ({after:2d} collectives) {event.kind:8s} v{event.version}: "
                         f"{event.text[:400]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dumps", nargs="+", type=Path)
    parser.add_argument("--batch-ms", type=float, default=20.0, help="sample time per ingested batch (the ranks' flush)")
    args = parser.parse_args()
    if args.batch_ms <= 0:
        parser.error("--batch-ms must be positive")
    missing = [str(path) for path in args.dumps if not path.exists()]
    if missing:
        parser.error(f"no such dump: {', '.join(missing)} (netemu.py --dump DIR writes them)")
    for path in args.dumps:
        print("\n".join(replay(path, args.batch_ms / 1e3)), flush=True)


if __name__ == "__main__":
    main()
