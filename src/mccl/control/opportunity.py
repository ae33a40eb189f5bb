"""Swap back when the fabric recovers (issue 15): an opportunity check beside the drift test.

Algorithm 1 asks one question of the *active* schedule: did its bottleneck cut drift? After a repair
that question misses the chance the repair opens. A version made for a degraded link loads it
lightly and has its cut elsewhere, so when the link comes back, the active cut's slacks barely move
(measured on the emulated fabric: the fault's version sped up 6–16 % after rank 0's NIC was
restored, below Γ; restored ÷ healthy 0.86 AllGather, 0.93 AllToAll), and the fault's version runs
on although the healthy schedule would be 7–16 % faster. The repair is in the evidence nevertheless:
the measured topology (:func:`mccl.control.drift.measured_capacities`) takes a link believed
degraded back to nominal when *any* path through it reads clearly faster than its reference
(``recovered_factor`` 1 + Γ) — the lightly loaded paths through the repaired NIC run about 2×
faster, whatever the rest of the schedule does.

So, beside the drift test, per active schedule: **the measured topology moved** — some link the
version's base believes degraded (below nominal by more than Γ) now reads more than 1 + Γ times its
base, i.e. clearly faster than the fabric the version was made for, from any sample that crosses it
(passive evidence only: no probe traffic). Then the manager compares the active schedule with the
schedule for the measured topology as it is now — the healthy schedule it registered first when the
topology is back to nominal within Γ on every link (the manager keeps it: no synthesis, and the
same schedule as before the fault), else a re-synthesis on the measured topology — and issues it where
the collective times the ranks report say so, when the candidate is the healthy schedule (its observed time on
the nominal fabric against the active one's now, :func:`healthy_observed_faster`), else where the guard's
comparison chooses it, as for a flag (calibrated where the guard calibrates, ties to the
candidate within its tolerance; without the guard, a predicted gain above that tolerance). Why not a
gain above Γ: the gains a repair leaves on the table are the 7–16 % above (the healthy schedule ÷ the
fault's version on the repaired fabric), below the demo's Γ = 0.3 — a Γ rule would forbid exactly the
swap the bar (restored within ±5 % of healthy) asks for. Noise is kept out by the evidence, not by the
gain: see below. Each link's recovery is judged once per active version
(:meth:`Opportunities.judged`), so a kept decision is not re-opened by the same evidence on every check.

The evidence, read in this order (seventh session):

* **the receiving NICs** (:mod:`.portlevel`): each receiver's NIC rate while busy, pooled over its latest two
  collectives, against the same port's rate in the version's reference window; a factor above 1 + Γ stands for
  every link that all the active version's routes into that NIC cross (:func:`port_links`; on the demo's fabric
  the NIC's downlink, and, for the AllToAll whose cross-host traffic into a rank comes from its rail peer only,
  the peer's uplink too). A port's window is the port's own rate, within a few per cent of the shaped rate, so
  a repaired NIC reads about 2× within one or two collectives where the path EWMA needed 4–8 samples of a path
  (and often more than the 12 collectives of the restored phase). It is taken **only where it completes the
  topology back to nominal** (every link within Γ of nominal once those links are): then the candidate is the
  healthy schedule, decided on observed times; or where, after such a jump, **every NIC reads within Γ of the
  others** (:func:`nics_alike`): the fault's base may blame links no NIC's rate speaks for (NVLinks, from the
  noise of the paths at the flag), which would otherwise hold the topology below nominal for good. A healthy
  schedule issued so learns its references for nominal. A partial recovery is left to the path EWMA, as before: a
  version made for a partly recovered fabric learns its references on it and can no longer see the rest
  (the links a port covers may not be all the fault touched — the AllGather's rank-0 uplink is on no port);
* **the path EWMA**: the measured topology above (any path through the link > 1 + Γ times its reference) —
  except, while some NIC still reads more than Γ below its peers (the fault is not over), on links no NIC's
  routes all cross: measured on the emulated fabric (seventh session, one run in four), a noisy path through an
  NVLink the fault's base had put at 0.7 of nominal opened it during the fault, and the re-synthesis it issued
  landed after the repair, learned its references there and was never swapped back (restored 0.70 of healthy).

Why it is robust to noise: it needs a base below nominal (only a version issued for a degraded
measured topology has one — a healthy fabric, a microburst, an off-cut or a uniform slowdown that
never swapped cannot trigger it), a link whose best path moved by more than Γ against references
the current version learned itself (a 5 % telemetry noise moves an EWMA of α ≤ 0.3 by a few per cent).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import numpy as np

from mccl.control.observed import CollectiveClock
from mccl.errors import ControllerError
from mccl.schedule import Collective, Schedule
from mccl.synth import SynthesisResult
from mccl.topology import Topology

__all__ = ["Opportunity", "Opportunities", "recovered_links", "healthy_observed_faster", "port_links",
           "port_recovered", "nics_alike"]


@dataclass(frozen=True)
class Opportunity:
    """A recovery the active version was not made for: ``links`` (ids) its base believes degraded that
    the measured topology reads clearly faster; ``ratio``: the largest measured ÷ base among them;
    ``back_to_nominal``: every link's measured capacity is within Γ of nominal (the healthy schedule is
    the schedule for this topology)."""

    links: tuple[int, ...]
    ratio: float
    back_to_nominal: bool
    ports: tuple[tuple[int, float], ...] = ()  # (receiving rank, NIC factor) whose evidence was taken
    nics_alike: bool = False  # back to nominal by the NICs' rates alike, not by every link's estimate

    def text(self) -> str:
        shown = ", ".join(str(link) for link in self.links[:6]) + (" ..." if len(self.links) > 6 else "")
        nics = "" if not self.ports else "; the NIC" + ("s" if len(self.ports) > 1 else "") + " of " + ", ".join(
            f"rank {rank} read {factor:.2f}x" for rank, factor in self.ports[:4])
        return (f"opportunity: link{'s' if len(self.links) > 1 else ''} {shown} read up to {self.ratio:.2f}x "
                f"the base they were believed degraded at" + nics
                + ("; every NIC reads within gamma of the others" if self.nics_alike else
                   "; the measured topology is back to nominal" if self.back_to_nominal else ""))


def recovered_links(base_gbps: np.ndarray | None, measured_gbps: np.ndarray, nominal_gbps: np.ndarray,
                    gamma: float) -> np.ndarray:
    """Ids of the links ``base`` believes degraded beyond ``gamma`` (base · (1 + Γ) < nominal) that
    ``measured`` reads more than 1 + Γ times their base; empty without a base (nominal)."""
    if base_gbps is None:
        return np.zeros(0, dtype=np.int64)
    base = np.asarray(base_gbps, dtype=float)
    measured = np.asarray(measured_gbps, dtype=float)
    nominal = np.asarray(nominal_gbps, dtype=float)
    if not base.shape == measured.shape == nominal.shape:
        raise ControllerError(f"capacities of {base.shape}, {measured.shape} and {nominal.shape} links do not match")
    return np.flatnonzero((base * (1.0 + gamma) < nominal) & (measured > base * (1.0 + gamma)))


def port_links(schedules: list[Schedule], topology: Topology) -> list[np.ndarray]:
    """Per rank: the links that every cross-host route into it crosses, in every one of ``schedules`` (those
    of one communicator: its NIC samples mix their traffic) — what its NIC's rate bounds from below
    (:mod:`.portlevel`). Empty for a rank no cross-host transfer reaches. Vectorized over transfers: a link is
    common to a receiver's routes where it appears in as many of them as the receiver has routes."""
    n = schedules[0].n_ranks if schedules else 0
    n_links = len(topology.links)
    common: list[np.ndarray | None] = [None] * n
    for schedule in schedules:
        names = [topology.node(gpu).host for gpu in schedule.ranks]
        codes = {name: code for code, name in enumerate(dict.fromkeys(names))}
        host = np.array([codes[name] for name in names], dtype=np.int64)
        transfers = schedule.transfers
        sender, receiver = transfers.sender.astype(np.int64), transfers.receiver.astype(np.int64)
        crossing = host[sender] != host[receiver]
        offsets = transfers.route_offsets
        hop_transfer = np.repeat(np.arange(len(transfers)), np.diff(offsets))
        hops = np.flatnonzero(crossing[hop_transfer])
        keys = np.unique(hop_transfer[hops] * n_links + transfers.route_links[hops].astype(np.int64))  # once a route
        owner = receiver[keys // n_links]
        pair_keys, counts = np.unique(owner * n_links + keys % n_links, return_counts=True)
        routes = np.bincount(receiver[crossing], minlength=n)
        full = counts == routes[pair_keys // n_links]
        ranks, links = pair_keys[full] // n_links, pair_keys[full] % n_links
        for rank in range(n):
            if routes[rank] == 0:
                continue
            mine = links[ranks == rank]
            common[rank] = mine if common[rank] is None else np.intersect1d(common[rank], mine)
    return [np.zeros(0, dtype=np.int64) if item is None else item for item in common]


def port_recovered(factors: np.ndarray, covered: list[np.ndarray], base_gbps: np.ndarray | None,
                   nominal_gbps: np.ndarray, gamma: float) -> tuple[np.ndarray, tuple[tuple[int, float], ...]]:
    """(links, ports): the links ``base`` believes degraded beyond ``gamma`` that some receiving NIC covering
    them (``covered``, :func:`port_links`) reads more than 1 + Γ times its reference (``factors``, per rank;
    NaN: not known), and those (rank, factor) pairs."""
    if base_gbps is None:
        return np.zeros(0, dtype=np.int64), ()
    degraded = np.asarray(base_gbps, dtype=float) * (1.0 + gamma) < np.asarray(nominal_gbps, dtype=float)
    links: set[int] = set()
    ports = []
    for rank, factor in enumerate(np.asarray(factors, dtype=float).tolist()):
        if not factor > 1.0 + gamma or rank >= len(covered):
            continue
        mine = [int(link) for link in covered[rank] if degraded[link]]
        if mine:
            links.update(mine)
            ports.append((rank, float(factor)))
    return np.array(sorted(links), dtype=np.int64), tuple(ports)


def nics_alike(rates: np.ndarray, covered: list[np.ndarray], gamma: float) -> bool | None:
    """Does every receiving NIC read within ``gamma`` of the median NIC now (``rates``: the recent pooled rates,
    :meth:`~mccl.control.portlevel.PortLevels.rates`)? Every rank that cross-host routes reach (``covered``
    nonempty) must have a rate, and at least two (None: not known). Why: the NICs of the fabrics mccl builds have one capacity, and
    a port's rate while busy is the NIC's own (:mod:`.portlevel`); so after a repair that one NIC's jump shows,
    the others' rates say whether any NIC is still slow — where the version's base also blames links that no
    NIC's rate speaks for (measured on the emulated fabric, seventh session, two loaded runs replayed: the
    AllToAll made for gpu0's halved NIC had NVLink links at 0.67–0.74 of nominal in its base beside the four NIC
    links — 5 and 7, 13 — so "every link back within Γ" could not hold after the repair)."""
    rates = np.asarray(rates, dtype=float)
    needed = [rank for rank, links in enumerate(covered) if len(links) and rank < len(rates)]
    if len(needed) < 2 or not np.all(np.isfinite(rates[needed])) or not np.all(rates[needed] > 0):
        return None
    return bool(np.all(rates[needed] * (1.0 + gamma) >= float(np.median(rates[needed]))))


def healthy_observed_faster(clock: CollectiveClock, kind: Collective, healthy_version: int,
                            active_observed: tuple[float, float] | None, tolerance: float) -> bool | None:
    """Back to nominal, the one comparison the controller can make on observation rather than a model: the
    healthy schedule's own collective time on the nominal fabric (the reference its clock series kept, the median
    of its first collectives) against the active one's time now, on the repaired fabric. True / False: faster /
    not by more than ``tolerance``; None where either time was not observed (no collective times reported).
    Why it overrides the guard's prediction here: the predictor can rank the two the other way (measured on the
    emulated fabric: α-β put the fault's AllToAll version 3 % ahead of the healthy one on the nominal fabric,
    which ran 7 % faster there), and both times are observations of the same job on the same fabric."""
    if active_observed is None:
        return None
    healthy = clock.observed(kind, healthy_version)
    if healthy is None:
        return None
    return healthy[0] * (1.0 + tolerance) < active_observed[1]


class Opportunities:
    """The manager's side of the check (module docstring): the healthy schedule of each (communicator,
    collective) — the first one registered — and which recovered links each active version has been
    judged on. Thread-safe."""

    def __init__(self, gamma: float) -> None:
        if not gamma > 0:
            raise ControllerError(f"the opportunity check needs a positive gamma, got {gamma}")
        self.gamma = float(gamma)
        self._lock = threading.Lock()
        self._healthy: dict[tuple[str, Collective], tuple[Schedule, SynthesisResult | None]] = {}
        self._judged: dict[tuple[str, Collective, int], set[int]] = {}
        self._port_links: dict[str, tuple[tuple[tuple[str, int], ...], list[np.ndarray]]] = {}

    def remember(self, communicator: str, schedule: Schedule, result: SynthesisResult | None) -> None:
        """Keep ``schedule`` as the healthy one of its collective, if none is kept yet (the first registered
        runs on the nominal fabric: the manager registers versions only at start-up or from the ranks)."""
        with self._lock:
            self._healthy.setdefault((communicator, schedule.collective), (schedule, result))

    def find(self, communicator: str, kind: Collective, version: int, base_gbps: np.ndarray | None,
             measured_gbps: np.ndarray, nominal_gbps: np.ndarray,
             ports: tuple[np.ndarray, tuple[tuple[int, float], ...]] | None = None,
             nics_alike: bool = False, hold: np.ndarray | None = None) -> Opportunity | None:
        """The recovery ``version`` was not made for, if the evidence shows one it has not been judged on yet
        (module docstring); None otherwise. ``ports``: :func:`port_recovered`'s links and ports, taken where they
        bring the measured topology back to nominal, or where ``nics_alike`` (:func:`nics_alike`): then the
        topology counts as back to nominal. ``hold``: links the path EWMA alone may not reopen now (no NIC
        speaks for them and some NIC still reads slower than its peers)."""
        nominal = np.asarray(nominal_gbps, dtype=float)
        measured = np.asarray(measured_gbps, dtype=float)
        taken: tuple[tuple[int, float], ...] = ()
        alike = False
        if ports is not None and len(ports[0]):
            completed = measured.copy()
            completed[ports[0]] = nominal[ports[0]]
            if np.all(completed * (1.0 + self.gamma) >= nominal) or nics_alike:
                measured, taken, alike = completed, ports[1], nics_alike
        links = recovered_links(base_gbps, measured, nominal, self.gamma)
        if not taken and hold is not None:  # the path EWMA alone, while a NIC still reads slow (module docstring)
            links = np.setdiff1d(links, hold)
        if len(links) == 0:
            return None
        with self._lock:
            judged = self._judged.get((communicator, kind, version), set())
        if set(links.tolist()) <= judged:
            return None
        base = np.asarray(base_gbps, dtype=float)
        back = bool(np.all(measured * (1.0 + self.gamma) >= nominal))
        return Opportunity(tuple(int(link) for link in links), float(np.max(measured[links] / base[links])),
                           back or alike, taken, alike and not back)

    def port_links(self, communicator: str, schedules: list[Schedule], topology: Topology) -> list[np.ndarray]:
        """:func:`port_links` of the communicator's active ``schedules``, kept while their versions stay."""
        key = tuple(sorted((schedule.collective.value, int(schedule.meta.version)) for schedule in schedules))
        with self._lock:
            kept = self._port_links.get(communicator)
        if kept is not None and kept[0] == key:
            return kept[1]
        links = port_links(schedules, topology)
        with self._lock:
            self._port_links[communicator] = (key, links)
        return links

    def judged(self, communicator: str, kind: Collective, version: int, opportunity: Opportunity) -> None:
        """``version`` was judged on ``opportunity``'s links (kept, or the synthesis failed): not again."""
        with self._lock:
            self._judged.setdefault((communicator, kind, version), set()).update(opportunity.links)

    def healthy_result(self, communicator: str, kind: Collective) -> SynthesisResult | None:
        """The healthy schedule as a synthesis result to issue (its own result with the warm state when the
        registration gave one, else a baseline-style result around the schedule), or None if none is kept.
        Its ``origin`` is dropped: it says which transfers copy the schedule it was warm-started from, not
        the active one's, so the manager validates it in full."""
        with self._lock:
            kept = self._healthy.get((communicator, kind))
        if kept is None:
            return None
        schedule, result = kept
        if result is None:
            return SynthesisResult.of_baseline(schedule, schedule.meta.synthesizer or "registered", 0.0)
        return replace(result, origin=None)
