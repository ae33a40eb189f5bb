"""The Schedule Manager's reaction path (issue 15, Fig. 13b): synthesis ahead of the flag, and one record per flag.

Synthesis ahead of the flag. A schedule whose drift test is not flagged yet but whose max δ has
reached ``speculate`` × Γ (:class:`~mccl.control.manager.ScheduleManager`) is drifting: the manager
synthesizes for the measured topology now, on its check thread, and keeps the result here
(:class:`Speculations`, counted in ``made``). When the flag comes and the measured capacities are still
within ``tolerance`` × nominal of those it synthesized for (every link), that result is the candidate
and synthesis leaves the path from detection to the swap (event "synthesized" with the seconds the
decision spent on it, ~0, and "ahead of the flag" in its text); otherwise it synthesizes as before. A
drift that keeps moving is re-speculated once it leaves the tolerance. Why a tolerance and not
equality: the EWMA moves by α × the gap with every sample, so the capacities at the flag are never
exactly those of the check before; a 10 % of nominal band is the telemetry's own noise here, and the
guard still compares the candidate on the capacities measured at the flag. What it costs: one
synthesis per drifting schedule per tolerance band crossed, on the check thread (a microburst that
crosses ``speculate`` × Γ and clears costs one synthesis, no swap).

The drift that kept going (issue 15, sixth session). On short collectives the EWMA often crosses from
½ Γ to Γ between two checks, past the band of the last speculation (measured, fifth session: the flag
synthesized on its path in 2 of 2 such runs, 13.5 / 91.8 ms, and AllToAll activation 114 ms quiet
against 29 ms with the speculation reused). So a held speculation is also taken when the drift only
*continued* the way it was made for: every link either within the band of the speculation's capacity,
or further from nominal on the side it had already left nominal by more than the band. Nothing else
moved, so the fault is the one the speculation routed around, only deeper; the guard still compares it
with the active schedule on the capacities measured at the flag (it is issued only when predicted
faster), and after the swap the references stand for the flag's capacities, so a deeper fault is not
flagged again for this one. A link that moved back towards nominal, or one that moved off nominal
after the speculation, is a different fabric: the flag synthesizes. Measured against nominal, not the
active version's base: a drift after a swap (a repair) follows only the band rule; tolerance 0 (no
band to tell a drift from noise) follows only equality.

The wider band, judged by the guard (issue 15, eighth session). On the AllToAll's many links the noisy
capacities leave the 10 % band between the speculation and the flag although the fault is the same (measured,
emulated fabric: the held speculation 0.12–0.13 × nominal from the flag's capacities on its farthest link, some
links having moved back, so "kept going" fails too): the flag synthesized on its path (41–72 ms of CPU and wall
at 8 ranks) in most AllToAll runs. So with ``band`` (× nominal per link, wider than ``tolerance``) a held
speculation within it is also *offered* at the flag — marked "band" — but a band reuse is only issued when the
guard chooses it on the flag's capacities over the active schedule and the NCCL-style baseline: otherwise the
manager drops it and synthesizes on the flag's capacities after all, and the guard judges that one
(:meth:`~mccl.control.manager.ScheduleManager.reoptimize`). So a wider band never issues a schedule the guard
predicts no faster than what it replaces, and never keeps the active one where a fresh synthesis could win; what
it can lose is the distance between the speculation and a fresh synthesis that both beat the active one (bounded
by the band: every link within ``band`` × nominal of what the speculation was made for). An issued band reuse
takes its bottleneck cut on the flag's capacities (:func:`~mccl.control.manager_guard.rebased_on`): the new
version's references stand for them, and a cut made for the speculation's would start its drift test off zero
(a recorded AllToAll: δ 0.094 at its own base). Without a guard
(``ControlConfig.guard`` False) there is nothing to judge a band reuse by: only the tolerance and "kept going"
apply.

Warm synthesizers (issue 15, seventh session; :func:`warm_synthesis`). The first synthesis in a process
loads the synthesizers' compiled kernels (numba's cache; compiled when the cache is cold): 0.4–0.7 s of
CPU for the 8-rank AllGather here, seconds under load. In a controller started for a job, that first
synthesis is the speculation of the first fault — and it runs on the check thread, so no drift test ran
while it did: in the reaction benchmark's 64 KiB AllGather (collectives of ~70–100 ms) the checks stopped
120 ms after the fault and the fault phase ended before the next one (measured: 0 flags, 0 speculations
in 3 of 3 runs; replayed offline on the same telemetry, the drift test flags 4 collectives after the
fault). A controller therefore synthesizes once for each collective it serves before it takes telemetry,
on the nominal fabric and warm on a perturbed one (the path a re-synthesis takes).

Every kernel of the reaction, not only the synthesis's (eleventh session). An uneven perturbation of every third
link changes the tree count, so the AllGather's warm start fell back to a cold packing and never ran the warm
repair's kernels (lowering the kept trees, the edges seen before), and nothing ran the manager's incremental
validation of a warm result (:func:`~mccl.control.prepared.prepare_update`: the compiled copy checks). On a
fresh clone those six kernels compiled *during* ``mccl demo``'s fault — ~18 s of compiling on the check thread
while the collectives ran (numba's cache files written 40–60 s after the ranks started): no drift test ran, the
fault phase ended without a flag, and the repair's flag waited 4.9 s for its synthesis. So the warm-up also takes
the first GPU's links to half (a NIC's gray failure, the demo's and Fig. 13's fault: a warm repair keeps most
trees) and the last GPU's to a quarter, validates each warm result as a flag would, and synthesizes back on the
nominal fabric (the repair); on a fabric of up to 64 links it also fails each link alone at 0.4 (AllGather: the
tree packing's rarer repairs — the rooted-cut check of the trees it keeps, a capped max-flow — have kernels of
their own; ~1 s at 8 GPUs). A larger fabric's controller warms the first ones only: numba compiles per argument
type, not size, so a rarer kernel loads from the cache once any run has compiled it. ``tests/test_control_warm.py``
checks that no fault of one GPU or one link, nor the repair after it, compiles anything after the warm-up.

The registered schedule's solver state (issue 15, eighth session, second round). The ranks register their first
schedule as a schedule, without the synthesis result behind it, so the first flag's synthesis started from that
schedule's routes (the file-warm path: seeded columns, a multiplicative-weights round, the master from the slack
basis; 30–70 ms of CPU for the 8-rank AllToAll, 65 ms measured live) rather than from the solver state (a repair
or a restart of the old basis: ~10 ms). The controller has just synthesized that very schedule in
:func:`warm_synthesis` (same topology, options and seed: the same routes), so it keeps those results
(``adopt``), and a registration whose schedule has the digest of one of them
(:func:`~mccl.schedule.schedule_digest`: collective, ranks, chunks, transfers; not the version) takes that
result's warm state. A schedule the controller did not make registers as before.

Instrumentation. Besides the events, every flag leaves one :class:`Reaction` in
``ScheduleManager.reactions`` (bounded; wall-clock times): when the telemetry batch folded last before
the flag arrived, the flag, synthesis start and end (whether it was made ahead, its CPU time), the
guard's seconds, the issue. Kept apart from the event log, whose sequence of kinds other code and
tests read; the service returns both in ``status``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mccl.control.prepared import prepare_update
from mccl.errors import ControllerError
from mccl.synth import SynthesisResult, optimize
from mccl.topology import Topology

__all__ = ["Reaction", "Speculation", "Speculations", "warm_in_background", "warm_synthesis"]


@dataclass
class Reaction:
    """One flag's way to an issued version (wall clock, s since the epoch; None: not reached). ``evidence_at``:
    when the telemetry batch folded last before the flag arrived; ``ahead``: the candidate was synthesized
    before the flag; ``outcome``: issued, kept, aborted, failed or unavailable."""

    communicator: str
    collective: str
    version: int  # the flagged one
    evidence_at: float | None
    flagged_at: float
    synth_start: float | None = None
    synth_end: float | None = None
    ahead: bool = False
    ahead_synth_s: float | None = None  # the synthesis made ahead of the flag
    synth_cpu_s: float | None = None  # CPU time of this thread during synthesis (wall ≫ CPU: starved, not slow)
    guard_s: float | None = None
    issued_at: float | None = None
    issued_version: int | None = None
    outcome: str = ""

    @staticmethod
    def log(limit: int = 256) -> deque[Reaction]:
        """The manager's bounded record of reactions."""
        return deque(maxlen=limit)


@dataclass(frozen=True)
class Speculation:
    """A synthesis made ahead of the flag: for ``version`` on ``capacities`` (Gbit/s per link)."""

    version: int
    capacities: np.ndarray
    result: SynthesisResult
    seconds: float
    at: float  # wall clock, when it was done
    serial: int = 0  # the how-manyth speculation of the manager: tells a re-speculation from the one before
    # validated and prepared against the active schedule it was made for (mccl.control.prepared.prepare_update):
    # the flag that reuses the speculation reuses this too (3–4 ms of CPU off the flag's path at 8 ranks)
    prepared: Any = None


class Speculations:
    """The held speculations, one per (communicator, collective); ``tolerance`` × ``nominal`` per link is near."""

    def __init__(self, nominal: np.ndarray, tolerance: float, band: float | None = None) -> None:
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 <= tolerance < 1:
            raise ControllerError(f"speculate_tolerance must be in [0, 1), got {tolerance!r}")
        if band is not None and (isinstance(band, bool) or not isinstance(band, int | float)
                                 or not tolerance < band < 1):
            raise ControllerError(f"speculate_band must be None or in (speculate_tolerance, 1) = ({tolerance}, 1), "
                                  f"got {band!r}")
        self.nominal = np.asarray(nominal, dtype=float)
        self.band = float(tolerance) * self.nominal
        self.wide = None if band is None else float(band) * self.nominal  # offered, judged by the guard
        self._held: dict[Hashable, Speculation] = {}
        self.made = 0
        self.continued = 0  # flags that took a speculation because the drift had only gone further its way
        self.offered = 0  # flags offered a speculation from the wider band (the guard judges it)
        self.refused = 0  # taken beyond the tolerance (continued or band), not chosen by the guard: synthesized at the flag

    def _near(self, held: Speculation | None, version: int, capacities: np.ndarray) -> bool:
        return held is not None and held.version == version and bool(np.all(np.abs(held.capacities - capacities)
                                                                            <= self.band))

    def continued_from(self, held: Speculation, capacities: np.ndarray) -> bool:
        """Whether ``capacities`` are ``held``'s drift gone further the same way (module docstring, "The drift
        that kept going"): every link within the band of ``held``, or further off nominal on the side ``held``
        had already left it by more than the band; at least one link off nominal (a fault, not noise)."""
        if not np.any(self.band > 0):
            return False
        off = held.capacities - self.nominal
        moved = np.abs(off) > self.band
        if not np.any(moved):
            return False
        step = np.asarray(capacities, dtype=float) - held.capacities
        within = np.abs(step) <= self.band
        further = moved & (np.sign(step) == np.sign(off))
        return bool(np.all(within | further))

    def wanted(self, key: Hashable, version: int, capacities: np.ndarray) -> bool:
        """Whether a speculation for these capacities is worth making (none held near them)."""
        return not self._near(self._held.get(key), version, capacities)

    def keep(self, key: Hashable, version: int, capacities: np.ndarray, result: SynthesisResult, seconds: float,
             prepared: Any = None) -> None:
        self.made += 1
        self._held[key] = Speculation(version, np.array(capacities, dtype=float), result, seconds, time.time(), self.made,
                                      prepared)

    def held(self) -> dict[Hashable, Speculation]:
        """The speculations held now, by (communicator, collective): what the service pushes to the ranks as
        candidates before the flag (:mod:`mccl.control.candidates`)."""
        return dict(self._held)

    def take(self, key: Hashable, version: int, capacities: np.ndarray) -> Speculation | None:
        """The held speculation for ``key`` if it was made for ``version`` near ``capacities``, or the drift since
        it only went further its way (:meth:`continued_from`); it is dropped either way: a flag consumes it."""
        return self.take_with(key, version, capacities, wide=False)[0]

    def take_with(self, key: Hashable, version: int, capacities: np.ndarray,
                  wide: bool = True) -> tuple[Speculation | None, str]:
        """:meth:`take`, and how it was taken: "near" (within the tolerance), "continued" (the drift went further
        its way), "band" (within the wider band, ``wide`` and a band set: the caller must have the guard judge it,
        module docstring "The wider band"), or "" (none)."""
        held = self._held.pop(key, None)
        if held is None or held.version != version:
            return None, ""
        if self._near(held, version, capacities):
            return held, "near"
        if self.continued_from(held, capacities):
            self.continued += 1
            return held, "continued"
        if wide and self.wide is not None and bool(np.all(np.abs(held.capacities - np.asarray(capacities, dtype=float))
                                                          <= self.wide)):
            self.offered += 1
            return held, "band"
        return None, ""


def warm_synthesis(topology: Topology, collectives: list[str], options: dict | None = None, *,
                   adopt: Callable[[SynthesisResult], None] | None = None) -> dict[str, float]:
    """Synthesize each of ``collectives`` on ``topology`` and again, warm, on a perturbed copy (module docstring,
    "Warm synthesizers"), so that a controller's first speculation or flag does not load the kernels; the
    wall seconds each took. ``options``: the synthesizers' options by collective, as the manager uses them.
    ``adopt``: given each nominal result (:meth:`~mccl.control.manager.ScheduleManager.adopt`), so that the
    ranks' registration of that very schedule brings its solver state (module docstring, "The registered
    schedule's solver state")."""
    from mccl.schedule import Collective

    seconds: dict[str, float] = {}
    factors = np.where(np.arange(len(topology.capacities_gbps)) % 3 == 0, 0.6, 1.0)  # uneven, as measured ones are
    perturbed = topology.with_capacities(topology.capacities_gbps * factors)
    known = {kind.value for kind in Collective}
    unknown = [name for name in collectives if name not in known]
    if unknown:
        raise ControllerError(f"warm_synthesis: no collective named {unknown} (known: {sorted(known)})")
    faults = _warm_faults(topology)
    for name in collectives:
        kind = Collective(name)
        start = time.perf_counter()
        chosen = (options or {}).get(kind)
        result = optimize(topology, kind, options=chosen)
        if adopt is not None:
            adopt(result)
        optimize(perturbed, kind, previous=result, options=chosen)
        for faulted_topology in faults:
            faulted = optimize(faulted_topology, kind, previous=result, options=chosen)  # a warm repair
            prepare_update(result.schedule, faulted, topology)  # as the flag validates it: the compiled copy checks
            repaired = optimize(topology, kind, previous=faulted, options=chosen)  # the way back after the repair
            prepare_update(faulted.schedule, repaired, topology)
        if kind in (Collective.ALLGATHER, Collective.REDUCESCATTER) and len(topology.links) <= _SWEEP_LINKS:
            for link in range(len(topology.links)):  # the tree packing's rarer repairs: one link alone at 0.4
                optimize(topology.with_capacities(topology.capacities_gbps * np.where(
                    np.arange(len(topology.links)) == link, 0.4, 1.0)), kind, previous=result, options=chosen)
        seconds[kind.value] = time.perf_counter() - start
    return seconds


def warm_in_background(manager: Any, collectives: tuple[str, ...] = ("allgather", "alltoall"),
                       say: Callable[[str], None] | None = None) -> threading.Thread:
    """Warm a serving controller's synthesizers on a daemon thread (:func:`warm_synthesis`; ``mccl controller``):
    on the manager's topology with its options, adopting the nominal results, when it has at most
    ``_WARM_GPUS`` GPUs; on a stand-in 2 × 4 rail-optimized fabric otherwise (the same kernels — numba compiles per
    argument type — without a large fabric's minutes of synthesis). ``say`` gets one line when done or failed:
    a warm-up that fails (a collective the fabric cannot run) is reported, never raised — the service goes on."""
    from mccl.topology import rail_optimized

    report = say or (lambda text: None)

    def run() -> None:
        topology = manager.topology
        own = len(topology.gpus) <= _WARM_GPUS
        target = topology if own else rail_optimized(1, 2, 4)
        try:
            seconds = warm_synthesis(target, list(collectives), dict(manager.config.synth_options) if own else None,
                                     adopt=manager.adopt if own else None)
        except Exception as error:  # noqa: BLE001 — reported: the controller serves without the warm-up
            report(f"synthesizers not warmed on {target.name}: {error}")
            return
        report(f"synthesizers warmed on {target.name} in {sum(seconds.values()):.1f} s "
               f"({', '.join(f'{name} {value:.1f} s' for name, value in seconds.items())})")

    thread = threading.Thread(target=run, name="mccl-warm-synthesis", daemon=True)
    thread.start()
    return thread


_WARM_GPUS = 64


_SWEEP_LINKS = 64  # up to this many links (the demo's 2 × 4 fabric: 48) the warm-up fails each alone, ~20 ms each


def _warm_faults(topology: Topology) -> list[Topology]:
    """The gray failures :func:`warm_synthesis` reacts to, and back: the first GPU's NIC halved (Fig. 13's) and the
    last GPU's at a quarter."""
    gpus = topology.gpus
    return [topology.with_capacities(topology.capacities_gbps * np.where(_touches(topology, gpu), factor, 1.0))
            for gpu, factor in ((gpus[0], 0.5), (gpus[-1], 0.25))]


def _touches(topology: Topology, node: str) -> np.ndarray:
    """Mask of the links that leave or enter ``node``."""
    return np.array([link.src == node or link.dst == node for link in topology.links], dtype=bool)
