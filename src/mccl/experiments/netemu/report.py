"""What a run of the loop on the emulated fabric reports, and the figures derived from it.

Phases per collective stream: ``healthy`` (before the fault), ``degraded`` (the version the
fault hit, while the NIC is slow), ``recovered`` (the last version of the fault phase, when newer
than the one it hit), ``restored`` (the last version after the NIC was restored). Predicted
algbw of a version is the controller's own model: the synthesizer's achieved throughput on the
topology it synthesized for (the "issued" event; version 1: the healthy synthesis), in topology
units, turned into emulated GB/s as ``/ scale × goodput`` (tbf counts L2 headers, see
:mod:`.shaping`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

__all__ = ["CollectiveRecord", "Swap", "NetemuReport"]

PHASES = ("healthy", "degraded", "recovered", "restored")


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective of one stream: seq, version, start (wall clock, s), the slowest rank's seconds,
    algbw (GB/s, nccl-tests S / t), fabric phase at its start, every rank's output equal to the known
    answer (and to torch's gloo collective when ``torch_checked``)."""

    kind: str
    seq: int
    version: int
    start: float
    seconds: float
    algbw_gbs: float
    phase: str
    correct: bool
    torch_checked: bool = False


@dataclass(frozen=True)
class Swap:
    """One hot swap as rank 0 saw it: collectives after ``switch_after`` (K) run ``version``; seconds of
    staging, waiting for every rank to stage, the out-of-band agreement, and staging → agreement."""

    kind: str
    switch_after: int
    version: int
    stage_s: float
    ready_s: float
    oob_s: float
    total_s: float
    received_at: float | None = None  # wall clock: when rank 0's client got the version (staging starts then)


@dataclass(frozen=True)
class NetemuReport:
    config: dict
    records: tuple[CollectiveRecord, ...]
    events: tuple[dict, ...]
    degraded_at: float
    restored_at: float | None
    tc_s: tuple[float, float]
    swaps: tuple[Swap, ...]
    predicted_v1: dict[str, float]
    scale: float
    goodput: float
    nic_mbit: float
    wall_s: float
    teardown_s: float
    controller_stats: dict = field(default_factory=dict)
    communicators: dict[str, str] = field(default_factory=dict)
    telemetry: dict = field(default_factory=dict)
    prefix: str = ""  # the fabric's name prefix (to check that nothing of it is left)
    startup_s: float = 0.0  # from the call to the first collective: fabric, controller, 8 ranks importing torch
    # the reaction path's marks, every rank's and the controller's (mccl.experiments.reaction_path reads them)
    trace: dict = field(default_factory=dict)

    # ---- per stream ------------------------------------------------------------------------
    def kinds(self) -> list[str]:
        return list(dict.fromkeys(record.kind for record in self.records))

    def stream(self, kind: str) -> list[CollectiveRecord]:
        return [record for record in self.records if record.kind == kind]

    def _events(self, kind: str, what: str, after: float, before: float | None = None) -> list[dict]:
        name = self.communicators.get(kind, kind)
        return [event for event in self.events if event["kind"] == what and event["collective"] == kind
                and event["communicator"] == name and event["time"] >= after
                and (before is None or event["time"] < before)]

    def phase_versions(self, kind: str, phase: str) -> list[int]:
        """Versions in the order they ran during ``phase`` (fault or restored)."""
        return list(dict.fromkeys(r.version for r in self.stream(kind) if r.phase == phase))

    def median_algbw(self, kind: str, phase: str) -> float | None:
        records = self.stream(kind)
        if phase == "healthy":
            chosen = [r for r in records if r.phase == "healthy"]
            chosen = chosen[len(chosen) // 2:]  # the first ones include connection set-up and warm-up
        elif phase in ("degraded", "recovered"):
            versions = self.phase_versions(kind, "degraded")
            if not versions or (phase == "recovered" and len(versions) < 2):
                return None
            version = versions[0] if phase == "degraded" else versions[-1]
            chosen = [r for r in records if r.phase == "degraded" and r.version == version]
        else:
            versions = self.phase_versions(kind, "restored")
            chosen = [r for r in records if r.phase == "restored" and versions and r.version == versions[-1]]
            chosen = chosen[1:] if len(chosen) > 2 else chosen  # the first straddles the tc change
        if phase in ("degraded", "recovered") and len(chosen) > 2:
            chosen = chosen[1:]  # the first one straddles the tc change / the swap
        return statistics.median(r.algbw_gbs for r in chosen) if chosen else None

    def predicted(self, kind: str, version: int) -> float | None:
        """The controller's model of ``version``'s algbw, in emulated GB/s."""
        if version == 1:
            value = self.predicted_v1.get(kind)
        else:
            issued = [e for e in self._events(kind, "issued", 0.0) if e["version"] == version]
            value = issued[0]["value"] if issued else None
        return None if value is None else value / self.scale * self.goodput

    def measured(self, kind: str, version: int, phase: str) -> float | None:
        chosen = [r.algbw_gbs for r in self.stream(kind) if r.version == version and r.phase == phase]
        chosen = chosen[1:] if len(chosen) > 2 else chosen
        return statistics.median(chosen) if chosen else None

    def swaps_in(self, kind: str, phase: str) -> int:
        """Versions adopted after the fabric change that opened ``phase`` (degraded: the fault; restored)."""
        return max(len(self.phase_versions(kind, phase)) - 1, 0)

    # ---- reaction time (Fig. 13b) ------------------------------------------------------------
    def reaction(self, kind: str, phase: str = "degraded") -> dict[str, float | None]:
        """Fig. 13(b) for the first flag after the fabric change that opened ``phase``: detection (s and
        collectives of this stream after the change), synthesis, issue (flag → issued: the controller's tick
        plus synthesis), dispatch (issued → rank 0's client has it), the swap (staging → every rank staged →
        OOB agreement; ``oob_s`` the agreement alone), activation (flag → agreed on rank 0: the new version is
        what the next collective runs), the wait for the collective in flight (agreed → the first collective
        on the new version starts), and detection → that first collective."""
        changed = self.degraded_at if phase == "degraded" else self.restored_at
        out: dict[str, float | None] = dict.fromkeys(("detect_s", "detect_collectives", "synth_s", "issue_s", "dispatch_s",
                                                      "oob_s", "swap_total_s", "activation_s", "inflight_wait_s",
                                                      "first_new_s", "detect_to_first_s", "kept_flags"))
        if changed is None:
            return out
        until = self.restored_at if phase == "degraded" and self.restored_at else None
        flagged = self._events(kind, "flagged", changed, until)
        if not flagged:
            return out
        flag = flagged[0]
        out["detect_s"] = flag["time"] - changed
        out["detect_collectives"] = float(sum(1 for r in self.stream(kind) if changed <= r.start < flag["time"]))
        synthesized = self._events(kind, "synthesized", flag["time"], until)
        issued = self._events(kind, "issued", flag["time"], until)
        # the flags the guard kept before the one that issued (eleventh session: a first flag kept because the
        # fabric reading did not explain the observed slowdown showed as "synthesis 0.04 ms, issued 2.3 s after")
        out["kept_flags"] = float(len(self._events(kind, "kept", flag["time"], issued[0]["time"] if issued else until)))
        if synthesized:  # the issuing flag's synthesis: the last one before the issue (else the first flag's)
            before_issue = [event for event in synthesized if not issued or event["time"] <= issued[0]["time"]]
            out["synth_s"] = (before_issue or synthesized)[-1 if before_issue else 0]["value"]
        if issued:
            out["issue_s"] = issued[0]["time"] - flag["time"]
            version = issued[0]["version"]
            swap = next((s for s in self.swaps if s.kind == kind and s.version == version), None)
            agreed = None
            if swap is not None:
                out["oob_s"], out["swap_total_s"] = swap.oob_s, swap.total_s
                if swap.received_at is not None:
                    out["dispatch_s"] = swap.received_at - issued[0]["time"]
                    agreed = swap.received_at + swap.total_s
                    out["activation_s"] = agreed - flag["time"]
            first = next((r for r in self.stream(kind) if r.version == version), None)
            if first is not None:
                out["first_new_s"] = first.start - issued[0]["time"]
                out["detect_to_first_s"] = first.start - flag["time"]
                if agreed is not None:
                    out["inflight_wait_s"] = max(first.start - agreed, 0.0)
        return out

    @property
    def all_correct(self) -> bool:
        return all(record.correct for record in self.records)

    def timeline(self) -> tuple[tuple[float, float, str], ...]:
        """(seconds since the first collective, algbw, "<kind> v<version>") per collective, for the PNG."""
        origin = self.records[0].start if self.records else 0.0
        return tuple((r.start + r.seconds - origin, r.algbw_gbs, f"{r.kind} v{r.version}") for r in self.records)

    def marks(self) -> tuple[tuple[float, str], ...]:
        """Fabric changes and the controller's flag / synthesis / issue events, for the PNG."""
        origin = self.records[0].start if self.records else 0.0
        out = [(self.degraded_at - origin, f"NIC of rank {self.config.get('fault_rank', 0)} ×{self.config.get('fault_factor')}")]
        if self.restored_at is not None:
            out.append((self.restored_at - origin, "NIC restored"))
        short = {"allgather": "AG", "alltoall": "A2A"}
        for event in self.events:
            if event["kind"] in ("flagged", "issued") and event["time"] >= self.degraded_at:
                label = short.get(event["collective"], event["collective"])
                out.append((event["time"] - origin, f"{label} {event['kind']} v{event['version']}"))
        for swap in self.swaps:
            first = next((r for r in self.stream(swap.kind) if r.version == swap.version), None)
            if first is not None:
                out.append((first.start - origin, f"{short.get(swap.kind, swap.kind)} on v{swap.version}"))
        return tuple(sorted(out))
