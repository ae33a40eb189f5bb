"""Read a ``netemu_telemetry.py --dump`` trace again: each NIC window's error under today's rule and the
fifth session's, and each call's critical path (the sixth session's figures for issue 15).

    PYTHONPATH=src .venv/bin/python benchmarks/netemu_telemetry.py --cases loop --runs 1 --fault-factors 1 --dump
    PYTHONPATH=src .venv/bin/python benchmarks/netemu_trace.py windows benchmarks/results/netemu_telemetry_loop_dump.json allgather 1
    PYTHONPATH=src .venv/bin/python benchmarks/netemu_telemetry.py --cases resynth --runs 1 --fault-factors 0.5 --dump
    PYTHONPATH=src .venv/bin/python benchmarks/netemu_trace.py path benchmarks/results/netemu_telemetry_resynth_dump.json allgather-resynth

``windows DUMP COLLECTIVE FACTOR``: rank 0's NIC windows (arrivals, counter base, sampler readings as they
closed) through :func:`mccl.runtime.windows.port_rate` — ``now`` (the wire share of a full segment) and
``fifth`` (the fixed point started from the window's average rate and payload scaled by the window's own
payload ÷ counter growth, the rule until the sixth session) — as error against the shaped goodput of rank 0's
NIC (20 Mbit/s × ``FACTOR`` × 1448/1514); the first call is a warm-up.

``path DUMP NAME``: per call, the chain that ended last, walked back over every rank's trace on one clock:
the last arrival, the send it came from, the receive whose completion the sender's post followed, … down to
a source's first send. Split into transfer time per kind (inter: NICs, intra: the host fabric; a send's post
to its receive's last byte — queueing behind other transfers on the ports and the pair's socket included),
dispatch (a receive noticed → the dependent send posted) and notice lag (last byte → the executor noticed).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

from mccl.runtime.windows import MIN_STEP_S, Arrival, _steps, port_rate

GOODPUT = 1448 / 1514
NIC_BYTES_PER_S = 20e6 / 8


def _fifth_session_seconds(arrivals: list[Arrival], base: int, readings: list[tuple[float, int]]) -> float | None:
    """The counter rule as merged at the fifth session (fixed point from the average; own payload ÷ growth)."""
    known = sorted((a for a in arrivals if a.at is not None), key=lambda a: a.at)
    if len(known) < 2 or any(a.counted is None for a in known):
        return None
    first, last = known[0], known[-1]
    grown, carried = last.counted - base, last.counted - first.counted
    payload = sum(a.nbytes for a in arrivals if a.at is None or a.at <= last.at)
    points = sorted([(a.at, a.counted) for a in known] + [(t, c) for t, c in readings if first.at < t < last.at])
    steps = [(dt, moved) for dt, moved in _steps(points, MIN_STEP_S) if dt > 0]
    rate = carried / (last.at - first.at)
    for _ in range(32):
        busy = sum(dt if moved >= 0.8 * rate * dt else moved / rate for dt, moved in steps)
        updated = carried / busy
        if abs(updated - rate) <= 1e-9 * rate:
            break
        rate = updated
    counted = sum(a.nbytes for a in known[1:])
    return counted / (rate * payload / grown)


def windows(path: str, collective: str, factor: float) -> dict[str, list[float]]:
    trace = json.load(open(path))[0][collective]["trace"]  # noqa: SIM115
    capacity = NIC_BYTES_PER_S * factor * GOODPUT
    errors: dict[str, list[float]] = {"now": [], "fifth": []}
    for event in trace:
        if event[0] != "w" or event[1] != 0 or event[5] <= 1:
            continue
        _, _, raw, _, base, _, readings = event
        arrivals = [Arrival(*a) for a in raw]
        readings = [tuple(r) for r in readings]
        known = sorted((a for a in arrivals if a.at is not None), key=lambda a: a.at)
        counted = sum(a.nbytes for a in known[1:])
        rate = port_rate(arrivals, base=base, readings=readings, wire_share=GOODPUT)
        old = _fifth_session_seconds(arrivals, base, readings) if base is not None else None
        if rate is not None and old:
            errors["now"].append(sum(rate.per_peer.values()) / rate.seconds / capacity - 1)
            errors["fifth"].append(counted / old / capacity - 1)
    return errors


def critical_paths(path: str, name: str, per_host: int = 4) -> dict[str, list[float]]:
    dump = json.load(open(path))  # noqa: SIM115
    world = len(dump)
    seqs = sorted({e[5] for e in dump[0][name]["trace"] if e[0] == "r"})
    split: dict[str, list[float]] = collections.defaultdict(list)
    for seq in seqs[1:]:
        sends: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
        receives: dict[tuple[int, int], list[tuple[float, float]]] = collections.defaultdict(list)
        start = float("inf")
        for rank in range(world):
            for kind, peer, _, t, at, s, _ in (e for e in dump[rank][name]["trace"] if e[0] in "rsc"):
                if s != seq:
                    continue
                if kind == "s":
                    sends[(rank, peer)].append(t)
                elif kind == "c":
                    receives[(peer, rank)].append((at if at else t, t))
                start = min(start, t) if kind in "rs" else start
        for key in receives:
            receives[key].sort()
        end, (sender, receiver) = max((v[-1][1], key) for key, v in receives.items() if v)
        index, parts = len(receives[(sender, receiver)]) - 1, collections.Counter()
        while True:
            arrival, _ = receives[(sender, receiver)][index]
            posted = sorted(sends[(sender, receiver)])
            sent = posted[min(index, len(posted) - 1)]
            kind = "inter" if sender // per_host != receiver // per_host else "intra"
            parts[f"{kind} transfer ms"] += (arrival - sent) * 1e3
            parts[f"{kind} hops"] += 1
            before = [(noticed, src, i) for (src, dst), v in receives.items() if dst == sender
                      for i, (_, noticed) in enumerate(v) if noticed <= sent]
            if not before:
                parts["start → first send ms"] += (sent - start) * 1e3
                break
            noticed, source, i = max(before)
            parts["dispatch ms"] += (sent - noticed) * 1e3
            parts["notice lag ms"] += (noticed - receives[(source, sender)][i][0]) * 1e3
            sender, receiver, index = source, sender, i
        parts["total ms"] = (end - start) * 1e3
        for key in ("start → first send ms", "inter transfer ms", "inter hops", "intra transfer ms", "intra hops",
                    "dispatch ms", "notice lag ms", "total ms"):
            split[key].append(parts[key])
    return split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    w = sub.add_parser("windows")
    w.add_argument("dump")
    w.add_argument("collective")
    w.add_argument("factor", type=float)
    p = sub.add_parser("path")
    p.add_argument("dump")
    p.add_argument("name")
    args = parser.parse_args()
    table = windows(args.dump, args.collective, args.factor) if args.what == "windows" else \
        critical_paths(args.dump, args.name)
    for key, values in table.items():
        if values:
            print(f"{key:24s} median {statistics.median(values):+9.3f}   " + " ".join(f"{v:+.3f}" for v in values))


if __name__ == "__main__":
    main()
