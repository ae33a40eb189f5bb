"""Fig. 13(b) from a demo run's marks: the reaction path from the evidence to the first collective on the new version.

Every mark is a wall-clock time on this one machine (the controller's and every rank's), so they
subtract.

What the two ends of the bar are. **Detection** is the controller's flag: the drift test of the schedule's
overlay links crossing Γ, on the controller's clock (``flagged_at``), i.e. the end of the paper's "detection"
stage (Fig. 13b: 53.1 ms from the fault). The fault itself (``report.degraded_at``, when the ``tc`` change
returned) → the flag is ``detection`` below, kept apart. **The first collective on the new version** is the
first collective *launched* on the version the flag issued, on the last rank to launch it (every rank's
``Communicator.switches`` mark, taken when the launch takes that version); ``first_done`` is when that
collective completed. The bar of issue 15 (≤ 50 ms) is ``detect_to_first`` = the flag → that launch, which
spans the paper's synthesis, dispatch, OOB agreement and the wait for the collective in flight.

For the first flag after a fabric change, the terms (ms), in order:

``detection``     the fault (``tc`` changed) → the flag; ``detect_collectives`` in the report counts collectives
``decision``      the telemetry batch folded last before the flag arrived → the flag (the drift test's tick)
``synthesis``     the flag → the candidate (≈ 0 when it was synthesized ahead of the flag; ``ahead``);
                  ``synthesis_cpu``: the controller thread's CPU time in it (wall ≫ CPU: it waited for a core)
``guard``         the never-worse comparison
``issue``         flag → issued (synthesis, guard, validation, the manager's lock)
``encode``        issued → the schedule reply encoded
``push``          encoded → pushed to the ranks' sockets
``dispatch``      issued → the last rank has it
``swap``          the last rank has it → the last rank agreed (staging, every rank staged, the OOB exchange)
``stage``         staging alone (the slowest rank's): parse-free since the client parsed it; validation and
                  the plan, or a lookup when the rank had prepared the candidate (``prestaged``: how many ranks
                  had, :mod:`mccl.control.candidates`)
``ready``         the wait for every rank to have staged (the slowest rank's)
``oob``           the OOB exchange alone (the slowest rank's)
``receive_cpu``   CPU of the slowest rank's client decoding the frame that brought the version (a whole
                  schedule, or a short ``activate`` frame when it held the candidate: :mod:`mccl.control.candidates`)
``swap_cpu``      the swap thread's CPU over the round, the slowest rank's (stage, and the Python of the waits)
``activations``   how many ranks got the version as an ``activate`` frame (not a term: a count)
``hold``          the longest a rank held its next launch for this round (``Communicator.swap_hold_s``,
                  :mod:`mccl.runtime.hotswap` "The hold"; None: no rank held)
``activation``    flag → the last rank agreed: from here the next launch runs the new version
``in_flight``     agreed → the first collective launched on the new version (the collectives in flight)
``running``       the part of ``in_flight`` during which the last collective on the old version (K, the round's
                  switch point) was still running on some rank: agreed → the last receive of K on every rank
                  (the ranks' telemetry samples of K; None without them)
``between``       the rest of ``in_flight``: every rank done with K and the round agreed, until the last rank
                  launched K + 1 — the application's own time between two collectives (in the demo's loop: every
                  rank rebuilds all 8 inputs to check its output and makes the next input, then a barrier), not
                  the reaction's (ninth session: it was most of ``in_flight`` in every AllToAll run measured)
``detect_to_ready`` the flag → the later of the agreement and the end of K on every rank: when a launch could
                  have run the new version, i.e. ``detect_to_first`` less ``between`` (not the bar: the bar counts
                  the application's gap too; this says how much of it is the reaction's)
``detect_to_first`` the flag → the first collective *launched* on the new version, on the last rank to launch
                  it (the bar of issue 15: ≤ 50 ms); ``first_done``: → that collective completed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["reaction_path", "TERMS"]

TERMS = ("detection", "decision", "synthesis", "guard", "issue", "encode", "push", "dispatch", "swap", "stage", "ready",
         "oob", "hold", "activation", "in_flight", "running", "between", "detect_to_ready", "detect_to_first",
         "first_done", "receive_cpu", "swap_cpu")


def _ms(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else (later - earlier) * 1e3


def reaction_path(report: Any, kind: str, phase: str = "degraded") -> dict[str, Any]:
    """The terms above (ms; None where a mark is missing) for the first flag of ``kind`` after the change that
    opened ``phase`` (the fault, or "restored": the repair) that issued a version, with ``version`` (the issued
    one), ``ahead`` and ``outcomes`` (every flag's outcome in the phase, "/"-joined: a guard that kept the
    active schedule leaves no path, and says so here)."""
    out: dict[str, Any] = dict.fromkeys((*TERMS, "version", "ahead", "synthesis_cpu", "prestaged", "activations",
                                         "outcomes"))
    changed = report.degraded_at if phase == "degraded" else report.restored_at
    if changed is None:
        return out
    until = report.restored_at if phase == "degraded" and report.restored_at else float("inf")
    communicator = report.communicators.get(kind, kind)
    trace = report.trace
    flags = [r for r in trace.get("reactions", []) if r["collective"] == kind and r["communicator"] == communicator
             and changed <= r["flagged_at"] < until]
    out["outcomes"] = "/".join(r["outcome"] or "?" for r in flags)  # every flag of the phase: issued, kept, aborted…
    reaction = next((r for r in flags if r["outcome"] == "issued"), None)
    if reaction is None:
        return out
    flagged, issued, version = reaction["flagged_at"], reaction["issued_at"], reaction["issued_version"]
    out.update(version=version, ahead=reaction["ahead"], detection=_ms(flagged, changed),
               decision=_ms(flagged, reaction["evidence_at"]),
               synthesis=_ms(reaction["synth_end"], reaction["synth_start"]),
               guard=None if reaction["guard_s"] is None else reaction["guard_s"] * 1e3, issue=_ms(issued, flagged),
               synthesis_cpu=None if reaction.get("synth_cpu_s") is None else reaction["synth_cpu_s"] * 1e3)
    delivery = next((d for d in trace.get("deliveries", []) if d["communicator"] == communicator
                     and d["collective"] == kind and d["version"] == version), None)
    if delivery is not None:
        out.update(encode=_ms(delivery["encoded_at"], issued), push=_ms(delivery["pushed_at"], delivery["encoded_at"]))
    arrivals = [at for rank in trace.get("received", []) for k, v, at in rank if k == kind and v == version]
    ranks = len(trace.get("received", []))
    last_arrival = max(arrivals) if len(arrivals) == ranks and arrivals else None
    out["dispatch"] = _ms(last_arrival, issued)
    rounds = [item for rank in trace.get("swaps", []) for item in rank.get(kind, []) if item[1] == version]
    agreed = max((item[6] + item[5] for item in rounds), default=None) if len(rounds) == ranks else None
    out["swap"] = _ms(agreed, last_arrival)
    out["stage"] = max((item[2] * 1e3 for item in rounds), default=None)
    out["ready"] = max((item[3] * 1e3 for item in rounds), default=None)
    out["oob"] = max((item[4] * 1e3 for item in rounds), default=None)
    out["swap_cpu"] = max((item[7] * 1e3 for item in rounds if len(item) > 7), default=None)
    taken = [(cpu, by_digest) for rank in trace.get("take_cpu", []) for k, v, cpu, by_digest in rank
             if k == kind and v == version]
    out["receive_cpu"] = max(cpu for cpu, _ in taken) * 1e3 if taken else None
    out["activations"] = sum(1 for _, by_digest in taken if by_digest) if taken else None
    hits = [rank.get(kind, 0) for rank in trace.get("prestage_hits", [])]
    out["prestaged"] = sum(1 for hit in hits if hit) if hits else None
    out["activation"] = _ms(agreed, flagged)
    launches = [at for rank in trace.get("switches", []) for _seq, at, versions in rank.get(kind, [])
                if versions.get(kind) == version]
    first_launch = max(launches) if len(launches) == ranks and launches else None
    holds = [seconds for rank in trace.get("holds", []) for _seq, at, seconds in rank.get(kind, [])
             if flagged <= at <= (first_launch or float("inf"))]
    out["hold"] = max(holds) * 1e3 if holds else None
    out["in_flight"] = _ms(first_launch, agreed)
    out["detect_to_first"] = _ms(first_launch, flagged)
    done = _last_receive(report, kind, rounds[0][0], ranks) if rounds and agreed is not None else None
    if done is not None and first_launch is not None:
        ready = max(agreed, min(done, first_launch))
        out.update(running=_ms(ready, agreed), between=_ms(first_launch, ready), detect_to_ready=_ms(ready, flagged))
    first = next((r for r in report.stream(kind) if r.version == version), None)
    if first is not None:
        out["first_done"] = _ms(first.start + first.seconds, flagged)
    return out


def _last_receive(report: Any, kind: str, seq: int, ranks: int) -> float | None:
    """When the last receive of collective ``seq`` of ``kind`` completed, over every rank (the end times of the
    ranks' telemetry samples: ``(kind, link kind, rank, bytes, seconds, end, seq)``); None unless every one of the
    ``ranks`` ranks has a sample of it (a rank's collective ends with its last receive, plus its local copies)."""
    samples = getattr(report, "telemetry", None) or {}
    ends = [max((float(item[5]) for item in rank if item[0] == kind and int(item[6]) == seq), default=None)
            for rank in samples.values()]
    if len(ends) != ranks or any(end is None for end in ends):
        return None
    return max(ends)
