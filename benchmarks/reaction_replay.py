"""Replay dumped reaction runs through the controller offline: which controller settings flag and issue in time.

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/reaction.py --runs 3 --dump /tmp/r/run    # dumps to replay
    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/reaction_replay.py '/tmp/r/run_*.json' 0.15:none 0.25:1.0
    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/reaction_replay.py '/tmp/r/run_*.json' 0.15:none 0.25:none:0.25

Each dump (``reaction.py --dump``) holds every rank's telemetry of one run (path windows and whole-collective
times). Its samples are fed, one collective (sequence number) at a time in end-time order, into a fresh
:class:`~mccl.control.ScheduleManager` with the run's topology, schedule and Γ and the given α and level EWMA
(``ALPHA:LEVEL[:BAND]``, LEVEL ``none`` for no level EWMA; BAND the wider band of speculation reuse,
:mod:`mccl.control.ahead`, none or absent: no band), which runs its whole step after each: drift test,
speculation, flag, re-synthesis and the guard. Per collective kind: runs, runs whose first version was issued
within 10 collectives of the fault (and of those, how many reused a synthesis made ahead of the flag: only
those keep synthesis off the path), runs with a flag before it (a swap on noise), and runs whose first flag the
guard kept. What it cannot replay: the live timing (when the controller checks between two ranks' batches), and
anything after the first issued version (the ranks' samples then measure the version the live run chose).
Why offline: on the loaded 2-core machine one live run of the set-up is ~50 s and noisy; the same evidence
under several settings is a fair comparison.
"""

from __future__ import annotations

import argparse
import glob
import json

from mccl.control import ControlConfig, ScheduleManager
from mccl.experiments.demo import synth_options
from mccl.schedule import Collective
from mccl.synth import optimize
from mccl.telemetry import Sample
from mccl.topology import parse_topology

_SCHEDULES: dict = {}


def replay(path: str, alpha: float, level: float | None,
           band: float | None = None) -> tuple[str, list[tuple[int, str]], bool | None]:
    """(collective, [(collectives after the fault, "kept" / "issued"), ...], whether the issued version was
    synthesized ahead of its flag (None: none issued)) of one dumped run."""
    with open(path) as handle:
        dump = json.load(handle)
    config = dump["config"]
    kind = config["kinds"][0]
    topology = parse_topology(f"rail_optimized(1,{config['hosts']},{config['gpus_per_host']})")
    options = synth_options(config["chunks"])
    key = (kind, config["chunks"], config["hosts"], config["gpus_per_host"])
    if key not in _SCHEDULES:  # the demo's first schedule (the same synthesis, deterministic)
        _SCHEDULES[key] = optimize(topology, kind, options=options.get(Collective(kind))).schedule.with_meta(version=1)
    manager = ScheduleManager(topology, ControlConfig(alpha=alpha, gamma=config["gamma"], alpha_level=level,
                                                      warmup=config["warmup"], settle_collectives=config["settle"],
                                                      synth_options=options), speculate=config["speculate"],
                              speculate_band=band)
    name = dump["communicators"][kind]
    manager.register(name, _SCHEDULES[key])
    samples = []
    for rank, rows in dump["telemetry"].items():
        for tag, sample_kind, sender, nbytes, seconds, end, seq in rows:
            if sample_kind == "collective":  # one rank's whole collective (peer -1), measured by that rank
                samples.append(Sample(sample_kind, name, int(rank), -1, nbytes, seconds, end, seq, tag, 1))
            else:  # a path into the rank that kept it (receive side)
                samples.append(Sample(sample_kind, name, sender, int(rank), nbytes, seconds, end, seq, tag, 1))
    by_seq: dict[int, list[Sample]] = {}
    for sample in sorted(samples, key=lambda s: s.end_time):
        by_seq.setdefault(sample.seq, []).append(sample)
    first_degraded = min(r["seq"] for r in dump["records"] if r["phase"] == "degraded")
    outcomes = []
    for seq in sorted(by_seq):
        if manager.versions(name).get(kind, 1) != 1:
            break
        manager.ingest(by_seq[seq])
        outcomes += [(seq - first_degraded + 1, e.kind) for e in manager.step() if e.kind in ("kept", "issued")]
    issued = [reaction for reaction in manager.reactions if reaction.outcome == "issued"]
    return kind, outcomes, issued[0].ahead if issued else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dumps", help="a glob of reaction.py --dump files")
    parser.add_argument("settings", nargs="+", help="ALPHA:LEVEL[:BAND], e.g. 0.15:none 0.25:1.0 0.25:none:0.25")
    args = parser.parse_args()
    files = sorted(glob.glob(args.dumps))
    if not files:
        parser.error(f"no dump matches {args.dumps!r}")
    for setting in args.settings:
        try:
            alpha_text, level_text, *band_text = setting.split(":")
            alpha, level = float(alpha_text), None if level_text == "none" else float(level_text)
            band = None if band_text in ([], ["none"]) else float(band_text[0]) if len(band_text) == 1 else ""
            if band == "":
                raise ValueError(setting)
        except ValueError:
            parser.error(f"a setting is ALPHA:LEVEL[:BAND] (LEVEL, BAND a number or none), got {setting!r}")
        table: dict[str, list[int]] = {}
        for path in files:
            kind, outcomes, ahead = replay(path, alpha, level, band)
            row = table.setdefault(kind, [0, 0, 0, 0, 0])
            row[0] += 1
            in_time = any(what == "issued" and 1 <= at <= 10 for at, what in outcomes)
            row[1] += in_time
            row[2] += in_time and bool(ahead)
            row[3] += any(at <= 0 for at, _ in outcomes)
            row[4] += bool(outcomes) and outcomes[0][1] == "kept"
        print(f"alpha {alpha} level {level} band {band}: " + "; ".join(
            f"{kind}: runs {r[0]}, issued within 10 {r[1]} (synthesized ahead {r[2]}), flagged before the fault "
            f"{r[3]}, first flag kept {r[4]}" for kind, r in sorted(table.items())), flush=True)


if __name__ == "__main__":
    main()
