"""Hot swap (mccl-paper §6.2.2, after MCCS): a new schedule replaces the old between two collectives.

A background thread per communicator receives schedules (``Communicator.stage`` or
the schedule source), and for each, in rounds that every rank runs in the same order:

1. **Stage** — validate against the communicator's topology, pre-build this rank's
   send/receive plan; nothing that blocks. A schedule that fails is rejected and
   reported; the old one stays (fail-static).
2. **Ready** — wait, idle, until every rank has staged (or rejected) its schedule of
   this round; the main thread keeps issuing collectives meanwhile, so ranks that
   were asked earlier than others do not stall the job.
3. **Out-of-band AllGather** — briefly hold the issuing of new collectives on this
   communicator and exchange (staged versions, last launched sequence number) over
   a control channel separate from the transport. Adopted, per collective: the
   newest version every rank has staged (the paper's "minimum version" when
   versions arrive in order; a version one rank rejected is never adopted). The
   maximum sequence number K is the switch point: collectives ≤ K run the old
   schedule, collectives > K the new one. Every rank computes the same result.

The hold (issue 15, sixth session; ``Communicator.swap_hold_s``, off by default). Between step 1 and the
end of step 3 a rank's main thread may wait, once per round and at most ``swap_hold_s``, before it
launches its next collective. Why: K is the largest sequence number launched anywhere when the exchange
runs, so a round that is still in its ready wait when a collective ends lets the next one start on the
old schedule, and the new version waits a whole collective more (measured, fifth session: 273–347 ms of
"in flight" quiet at 250–420 ms collectives). A rank that holds leaves K where it is when every rank's
round gets there in time, and gives its core and the GIL to the swap thread meanwhile. It changes when
collectives launch, never which schedule runs one: K is still agreed from what was launched, so a rank
that did not hold (or a hold that timed out) only moves K later, exactly as without the hold; none is
dropped or run twice. What it costs: at most ``swap_hold_s`` of one rank's launch per round.

Priority (issue 15, seventh session; ``Communicator.swap_priority``, off by default). The round's own
work is ~1 ms, but on cores the ranks' collectives keep busy every wake-up of this thread waits for a
core behind the busy main threads (:mod:`mccl.runtime.priority`). With ``swap_priority`` = k the thread
runs k steps of niceness above the rank's main thread (root only; refused, it runs as before). It
changes when the round's steps run, never what they decide.

Candidates (issue 15). A source may also hand over a schedule the controller *may* issue next
(anything with ``prestage_only`` true and a ``schedule``: :class:`mccl.control.client.Candidate`). The
thread only prepares it (parse, validate, plan; ``Communicator._prestage``) and runs no round; when
a version with the same content (schedule digest) is staged later, step 1 is a lookup. Ranks that
missed a candidate stage as before: nothing depends on every rank having had it.

Collectives of one communicator execute in sequence order, so two schedules never
run at once and none is dropped or duplicated; other communicators swap on their
own. The control channel is a :class:`StoreControl` (the job's TCPStore: a 16-byte
exchange costs ~0.6–0.9 ms at 8 ranks here, a gloo AllGather ~10 ms).

A rank lost ends the thread. The store lives in one process (rank 0's under torch's
``env://`` rendezvous); when it dies, every store call fails (``DistNetworkError``) or times
out (``DistStoreError``). :class:`StoreControl` raises :class:`~mccl.errors.PeerLost` for
either, and the thread names the rank the liveness watcher lost first (the communicator's
transport, :mod:`mccl.runtime.liveness`), records the failure and stops: no later round can
be agreed with a rank gone, and the group is broken anyway.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist

from mccl.errors import ControllerError, MCCLError, PeerLost
from mccl.runtime.priority import raise_thread_priority
from mccl.schedule.serialize import schedule_digest

__all__ = ["ControlChannel", "StoreControl", "SwapRecord", "SwapConflict", "agree", "conflicts", "staged_payload"]

log = logging.getLogger("mccl.runtime")


class ControlChannel(Protocol):
    """Out-of-band exchange among the ranks of one communicator (not the transport group)."""

    def ready(self, round_id: int, stop: Callable[[], bool]) -> bool:
        """Publish "this rank reached round_id" and idle-wait for all ranks; False if stopped."""
        ...

    def allgather(self, round_id: int, payload: bytes) -> list[bytes]:
        """Every rank's payload of round_id, by rank."""
        ...


class StoreControl:
    """A control channel over a torch.distributed Store (its own client connection)."""

    def __init__(self, store: dist.Store, prefix: str, rank: int, size: int, *, wait_slice_s: float = 0.5,
                 timeout_s: float = 60.0, poll_s: float | None = None) -> None:
        self.store = dist.PrefixStore(prefix, store.clone() if hasattr(store, "clone") else store)
        self.rank = rank
        self.size = size
        self.wait_slice = timedelta(seconds=wait_slice_s)
        self.timeout = timedelta(seconds=timeout_s)
        # None: ready() waits by the store's event; a number: it checks every poll_s instead (the path before
        # issue 15's fifth session, kept for benchmarks/reaction.py's A/B)
        self.poll_s = poll_s
        self._sleep = threading.Event()

    def ready(self, round_id: int, stop: Callable[[], bool]) -> bool:
        """Publish, then wait for every rank's key by the store's own wait: it blocks in C++ with the GIL
        released and returns when the last key is set (an event, not a poll: the former ``check`` every
        ``poll_s`` took the GIL back each time — up to a switch interval, 5 ms, while the main thread runs a
        collective — and sent 8 ranks × 500 requests a second to rank 0's store while a round waited). The
        wait is cut into ``wait_slice_s`` pieces to look at ``stop``; a piece that times out is no failure."""
        with _store_failures(f"round {round_id}, ready"):
            self.store.set(f"ready/{round_id}/{self.rank}", b"1")
            keys = [f"ready/{round_id}/{rank}" for rank in range(self.size)]
            while self.poll_s is not None and not self.store.check(keys):
                if stop():
                    return False
                self._sleep.wait(self.poll_s)
            while True:
                if stop():
                    return False
                try:
                    self.store.wait(keys, self.wait_slice)
                    return True
                except dist.DistStoreError:  # this piece timed out; a store that died raises DistNetworkError
                    if self.store.check(keys):
                        return True

    def allgather(self, round_id: int, payload: bytes) -> list[bytes]:
        with _store_failures(f"round {round_id}, exchange"):
            self.store.set(f"sync/{round_id}/{self.rank}", payload)
            keys = [f"sync/{round_id}/{rank}" for rank in range(self.size)]
            self.store.wait(keys, self.timeout)
            return [bytes(value) for value in self.store.multi_get(keys)]


@contextlib.contextmanager
def _store_failures(what: str) -> Iterator[None]:
    """A store call that fails (its process died: ``DistNetworkError``) or times out (a rank never
    published: ``DistStoreError``) as :class:`PeerLost` (module docstring)."""
    try:
        yield
    except dist.DistError as error:
        text = str(error).strip()
        detail = text.splitlines()[0][:200] if text else type(error).__name__
        raise PeerLost(f"the hot-swap control channel ({what}) failed: the job's store stopped answering "
                       f"({type(error).__name__}: {detail})") from error


@dataclass(frozen=True)
class SwapRecord:
    """One hot-swap round as this rank saw it (times in seconds)."""

    round: int
    switch_after: int
    adopted: tuple[tuple[str, int], ...]
    rejected: str | None
    stage_s: float
    ready_s: float
    oob_s: float
    total_s: float
    started_at: float = 0.0  # wall clock when the round began (this rank had the schedule): the reaction path
    cpu_s: float = 0.0  # the swap thread's CPU time in the round (stage, and the Python of the ready wait and exchange)


class SwapConflict(MCCLError):
    """Ranks staged different schedules under the same version; none of them is adopted."""


def staged_payload(staged: Mapping[object, Mapping[int, object]]) -> dict[str, list[list]]:
    """``{kind: [[version, digest], ...]}`` of a communicator's staged schedules (``Installed`` items
    by version, by collective); computed outside the issue lock (hashing is ~1 GB/s)."""
    return {str(getattr(kind, "value", kind)): [[int(version), schedule_digest(item.schedule)]
                                                for version, item in sorted(items.items())]
            for kind, items in staged.items()}


def _pairs(entries: list) -> set[tuple[int, str]]:
    return {(int(entry[0]), str(entry[1])) for entry in entries}


def agree(payloads: list[bytes]) -> tuple[int, dict[str, int]]:
    """(K, {collective: version}) from every rank's ``{"seq": s, "staged": {kind: [[version, digest]]}}``:
    per collective the newest (version, digest) pair every rank staged."""
    decoded = [json.loads(payload) for payload in payloads]
    switch_after = max(int(item["seq"]) for item in decoded)
    kinds = set().union(*(item["staged"].keys() for item in decoded))
    adopted: dict[str, int] = {}
    for kind in sorted(kinds):
        common = set.intersection(*(_pairs(item["staged"].get(kind, [])) for item in decoded))
        if common:
            adopted[kind] = max(common)[0]
    return switch_after, adopted


def conflicts(payloads: list[bytes], adopted: Mapping[str, int] | None = None) -> list[str]:
    """One line per (collective, version) that ranks staged with different content, naming the ranks'
    digests; the same on every rank (it reads the same payloads). Versions not newer than ``adopted``
    (what this round adopted) are moot: they are dropped from every rank's staged set."""
    decoded = [json.loads(payload) for payload in payloads]
    found: dict[tuple[str, int], dict[str, list[int]]] = {}
    for rank, item in enumerate(decoded):
        for kind, entries in item["staged"].items():
            for version, digest in _pairs(entries):
                found.setdefault((kind, version), {}).setdefault(digest, []).append(rank)
    return [f"{kind} version {version}: " + "; ".join(f"ranks {ranks} staged {digest[:12]}"
                                                      for digest, ranks in sorted(by_digest.items()))
            for (kind, version), by_digest in sorted(found.items())
            if len(by_digest) > 1 and version > (adopted or {}).get(kind, -1)]


def encode(seq: int, staged: dict[str, list[list]]) -> bytes:
    return json.dumps({"seq": seq, "staged": staged}, sort_keys=True).encode()


class SwapThread:
    """The background thread of one communicator; it calls back into the communicator.

    ``communicator`` provides ``_take_request(timeout)``, ``_stage(schedule)``,
    ``_sync_round(payload_fn)`` and ``_record(SwapRecord)`` (see api.Communicator).
    """

    def __init__(self, communicator: object, control: ControlChannel, poll_s: float) -> None:
        self.communicator = communicator
        self.control = control
        self.poll_s = poll_s
        self.round = 0
        self._stop = False
        self._controller_lost = False
        self._priority_applied = 0
        self.thread = threading.Thread(target=self._run, name="mccl-hotswap", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop = True
        self.thread.join(timeout=10)

    def _run(self) -> None:
        comm = self.communicator
        while not self._stop:
            self._apply_priority()
            try:
                schedule = comm._take_request(self.poll_s)
            except ControllerError as error:
                if not self._controller_lost:
                    self._controller_lost = True
                    log.warning("mccl: the controller is unreachable (%s); keeping the last schedule", error)
                    comm._controller_lost(str(error))
                continue
            except Exception as error:  # a source's own failure (a bug, a malformed answer): fail-static, as above
                # — before, it ended this thread, and with it every later swap, with nothing on the communicator
                if not self._controller_lost:
                    self._controller_lost = True
                    log.exception("mccl: the schedule source failed; keeping the last schedule")
                    comm._controller_lost(f"the schedule source failed: {error!r}")
                time.sleep(self.poll_s)  # (a source that fails at once would spin otherwise)
                continue
            if self._controller_lost and not comm.controller_lost:
                self._controller_lost = False
                log.warning("mccl: the controller answers again; taking its schedules again")
            if schedule is None:
                continue
            if getattr(schedule, "prestage_only", False):  # a candidate: prepared ahead, no round (module docstring)
                try:
                    comm._prestage(schedule.schedule)
                except Exception as error:  # a candidate that cannot be prepared is only not prepared ahead
                    log.warning("mccl: a candidate schedule could not be prepared ahead: %r", error)
                    comm.events.append(f"candidate not prepared: {error!r}")
                continue
            try:
                self._round(schedule)
            except PeerLost as error:  # a rank is gone: no round can be agreed any more (module docstring)
                lost = self._name_lost(error)
                log.error("mccl: hot swap round %d: %s; hot swap stops, the last schedule stays", self.round, lost)
                comm._swap_failed(str(lost))
                return
            except MCCLError as error:  # fail-static: report, keep the old schedule, keep running
                log.error("mccl: hot swap round %d failed: %s; keeping the last schedule", self.round, error)
                comm._swap_failed(str(error))
            except Exception as error:
                log.exception("mccl: hot swap round %d failed", self.round)
                comm._swap_failed(repr(error))

    def _apply_priority(self) -> None:
        """This thread ``swap_priority`` steps of niceness above the rank's main thread (module docstring,
        "Priority"), once the communicator asks for it; a refusal (not root) is an event, not a failure."""
        want = getattr(self.communicator, "swap_priority", None) or 0
        if want <= self._priority_applied:
            return
        step, self._priority_applied = want - self._priority_applied, want
        if not raise_thread_priority(step):
            events = getattr(self.communicator, "events", None)
            if events is not None:
                events.append(f"swap thread priority +{step} refused (needs CAP_SYS_NICE); running as before")

    def _name_lost(self, error: PeerLost) -> PeerLost:
        """``error`` named after the rank the communicator's liveness watcher lost first, when it knows one."""
        transport = getattr(self.communicator, "transport", None)
        explain = getattr(transport, "explain_loss", None)
        return explain(error) if explain is not None else error

    def _round(self, schedule: object) -> None:
        comm = self.communicator
        opened, closed = getattr(comm, "_round_opened", None), getattr(comm, "_round_closed", None)
        if opened is not None:
            opened()
        try:
            self._run_round(schedule)
        finally:
            if closed is not None:
                closed()

    def _run_round(self, schedule: object) -> None:
        comm = self.communicator
        self.round += 1
        start, started_at, cpu = time.perf_counter(), time.time(), time.thread_time()
        rejected = comm._stage(schedule)
        staged_at = time.perf_counter()
        if not self.control.ready(self.round, lambda: self._stop):
            return
        ready_at = time.perf_counter()
        seen: list[list[bytes]] = []

        def exchange(payload: bytes) -> list[bytes]:
            seen.append(self.control.allgather(self.round, payload))
            return seen[-1]

        switch_after, adopted, oob_s = comm._sync_round(exchange)
        end = time.perf_counter()
        clash = conflicts(seen[0], adopted) if seen else []
        comm._record(SwapRecord(self.round, switch_after, tuple(sorted(adopted.items())),
                                rejected or ("; ".join(clash) if clash else None),
                                staged_at - start, ready_at - staged_at, oob_s, end - start, started_at,
                                time.thread_time() - cpu))
        if clash:
            raise SwapConflict(f"hot swap round {self.round}: ranks staged different schedules under one version "
                               f"({'; '.join(clash)}); none of them adopted")
