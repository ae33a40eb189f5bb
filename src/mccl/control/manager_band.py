"""A speculation from the wider band that the guard did not choose, refused (issue 15, eighth session;
:mod:`mccl.control.ahead`, "The wider band"): split from :mod:`mccl.control.manager`, which calls it from its
re-optimization. A mixin: :class:`~mccl.control.manager.ScheduleManager` provides every attribute used here."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from mccl.control.ahead import Reaction, Speculations
from mccl.control.drift import profile
from mccl.control.guard import CANDIDATE, GuardDecision
from mccl.control.prepared import PreparedSchedule, prepare_update
from mccl.control.records import _Active, _Communicator
from mccl.errors import MCCLError
from mccl.schedule import Collective, bottleneck_cut
from mccl.synth import SynthesisResult
from mccl.topology import Topology

__all__: list[str] = []


def rebased_on(result: SynthesisResult, prepared: PreparedSchedule, measured: Topology,
               ) -> tuple[SynthesisResult, PreparedSchedule]:
    """A band reuse's result and preparation with its bottleneck cut (and base slacks) taken on the flag's
    ``measured`` fabric. Why: the issued version's references are learned as standing for that fabric (its base),
    and a cut made for the speculation's capacities, up to the band away, would start the new version's drift test
    off zero (measured on a recorded AllToAll: δ 0.094 at its own base, a third of Γ)."""
    schedule = result.schedule.with_meta(bottleneck_cut=bottleneck_cut(result.schedule, measured))
    return replace(result, schedule=schedule), replace(prepared, cut=profile(schedule, len(measured.links)))


class _BandReuse:
    """The refusal of a band reuse (module docstring)."""

    topology: Topology
    _lock: threading.Lock
    _speculations: Speculations
    # and, from the manager: _event (its state's), _resynthesize and _compare — not declared here as methods:
    # a declaration in this mixin would come before the manager's state in the method order

    def _refuse_band(self, name: str, comm: _Communicator, kind: Collective, active: _Active, measured: Topology,
                     observed: tuple[float, float] | None, reaction: Reaction, verdict: GuardDecision,
                     ) -> tuple[SynthesisResult, PreparedSchedule, tuple[GuardDecision, SynthesisResult | None] | None,
                                float] | None:
        """A band reuse the guard did not choose (:mod:`.ahead`, "The wider band"): the candidate synthesized on the
        flag's ``measured`` fabric instead, with its preparation, the guard's verdict on it and the seconds; None
        (the outcome recorded) when that synthesis fails."""
        self._speculations.refused += 1
        with self._lock:
            self._event("refused", name, kind, active.version, verdict.speedup(CANDIDATE),
                        f"the speculation from the wider band was not chosen ({verdict.chosen}): synthesized on the "
                        "flag's capacities")
        start, cpu = time.perf_counter(), time.thread_time()
        reaction.synth_start = time.time()
        try:
            result = self._resynthesize(active, kind, measured)
            prepared = prepare_update(active.schedule, result, self.topology)
        except MCCLError as error:  # SynthesisUnavailable cannot come here: the speculation was synthesized
            with self._lock:
                self._event("failed", name, kind, active.version, text=str(error))
            reaction.outcome = "failed"
            return None
        seconds = time.perf_counter() - start
        reaction.synth_end, reaction.ahead, reaction.synth_cpu_s = time.time(), False, time.thread_time() - cpu
        reaction.ahead_synth_s = None
        with self._lock:
            self._event("synthesized", name, kind, active.version, seconds, "after a refused band reuse")
        guard_start = time.perf_counter()
        guarded = self._compare(name, comm, kind, active, result, measured, observed)
        reaction.guard_s = (reaction.guard_s or 0.0) + time.perf_counter() - guard_start
        return result, prepared, guarded, seconds
