"""TS live, over the controller channel: the tenancy controller inside the controller service.

:class:`TenancyManager` is a :class:`~mccl.control.manager.ScheduleManager` (so the
service, :class:`~mccl.control.service.ControllerService`, runs it unchanged, with its
authentication, bounds and threads) that plans the tenants' jobs with a
:class:`~mccl.control.tenancy.TenancyController`:

1. **Telemetry in.** Every rank of every job sends its samples as today (the ``telemetry``
   message). The samples of the prioritized jobs (the top priority) go to a
   :class:`BusyTracker`, which merges them per collective (sequence number) across ranks and
   batches into the job's busy intervals, first window start to last window end. A collective
   is complete once a later one was reported and ``settle_s`` passed without news of it.
2. **Windows.** On every check (the service's ``check_interval_s``), new busy intervals go to
   the controller (:meth:`TenancyController.observe_busy`) and it re-plans: TS windows from
   :func:`~mccl.control.tenancy.timeshare.idle_windows`, kept while the rhythm holds (its
   ``_same_rhythm``), new ones when the prioritized job's pattern changes.
3. **Out.** A changed plan is registered here under a new version (ranks fetch it with their
   ``poll`` and switch by the runtime's (min version, max seq) agreement), and its windows are
   served under that version by the ``windows`` message (:func:`windows_reply`); the ranks'
   send gates (:func:`mccl.runtime.sendgate.attach`) apply a version's windows to exactly the
   collectives that run that version.

The message (protocol version 1): ``{"op": "windows", "communicator": name}``; reply
``{"op": "windows", "version": v, "windows": null | [origin_s, period_s, [[start, end], ...]]}``.
The manager's own drift loop still serves any other communicator registered with it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any

from mccl.control.config import ControlConfig
from mccl.control.manager import ScheduleManager
from mccl.control.protocol import encode, text_field
from mccl.control.tenancy.controller import TenancyController
from mccl.control.tenancy.jobs import JobPlan
from mccl.errors import ControllerError
from mccl.telemetry import Sample, SendWindows

__all__ = ["BusyTracker", "TenancyManager", "windows_field", "windows_of", "windows_reply", "windows_fetcher"]

log = logging.getLogger("mccl.control")

MAX_WINDOWS = 64  # windows per period a message may carry


def windows_field(windows: SendWindows | None) -> list | None:
    return None if windows is None else [windows.origin_s, windows.period_s, [list(w) for w in windows.windows]]


def windows_of(field: Any) -> SendWindows | None:
    """The checked ``windows`` field of a reply: ControllerError naming what is wrong."""
    if field is None:
        return None
    if not isinstance(field, list) or len(field) != 3 or not isinstance(field[2], list) or len(field[2]) > MAX_WINDOWS:
        raise ControllerError(f"'windows' must be [origin_s, period_s, [[start, end], ...]] (at most {MAX_WINDOWS})")
    numbers = [field[0], field[1], *(x for pair in field[2] for x in (pair if isinstance(pair, list) else [None]))]
    if any(isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) for x in numbers) or any(
            len(pair) != 2 for pair in field[2]):
        raise ControllerError("'windows' holds something other than finite numbers in pairs")
    try:
        return SendWindows(float(field[0]), float(field[1]), tuple((float(a), float(b)) for a, b in field[2]))
    except ValueError as error:
        raise ControllerError(f"'windows' are not valid send windows: {error}") from None


class BusyTracker:
    """Per job: the busy interval of each collective, merged from every rank's samples (module docstring).
    Thread-safe (the service's ingest thread adds, its check thread takes)."""

    def __init__(self, *, settle_s: float = 0.15, max_open: int = 64) -> None:
        self.settle_s = settle_s
        self.max_open = max_open
        self._lock = threading.Lock()
        self._open: dict[str, dict[int, list[float]]] = {}  # job -> seq -> [begin, end, last update (monotonic)]
        self._newest: dict[str, int] = {}
        self._done: dict[str, int] = {}  # the newest seq already handed out

    def add(self, job: str, samples: Iterable[Sample]) -> None:
        now = time.monotonic()
        with self._lock:
            spans = self._open.setdefault(job, {})
            done = self._done.get(job, -1)
            for sample in samples:
                if sample.seconds <= 0 or sample.seq <= done:
                    continue
                begin, end = sample.end_time - sample.seconds, sample.end_time
                span = spans.get(sample.seq)
                if span is None:
                    spans[sample.seq] = [begin, end, now]
                else:
                    span[0], span[1], span[2] = min(span[0], begin), max(span[1], end), now
                self._newest[job] = max(self._newest.get(job, -1), sample.seq)
            for seq in sorted(spans)[:-self.max_open]:  # bounded: the oldest go
                del spans[seq]

    def take(self) -> dict[str, list[tuple[float, float]]]:
        """The completed collectives' busy intervals since the last call, by job, in seq order."""
        now = time.monotonic()
        out: dict[str, list[tuple[float, float]]] = {}
        with self._lock:
            for job, spans in self._open.items():
                newest = self._newest.get(job, -1)
                ready = [seq for seq in sorted(spans) if seq < newest and now - spans[seq][2] >= self.settle_s]
                for seq in ready:
                    begin, end, _ = spans.pop(seq)
                    out.setdefault(job, []).append((begin, end))
                    self._done[job] = max(self._done.get(job, -1), seq)
        return out


class TenancyManager(ScheduleManager):
    """A schedule manager whose tenants' jobs are planned by ``tenancy`` (module docstring)."""

    def __init__(self, tenancy: TenancyController, config: ControlConfig | None = None, *,
                 settle_s: float = 0.15) -> None:
        super().__init__(tenancy.topology, config or ControlConfig(guard=False))
        self.tenancy = tenancy
        self.tracker = BusyTracker(settle_s=settle_s)
        self._plans_lock = threading.Lock()  # the windows served (the socket thread reads them)
        self._tenancy_lock = threading.Lock()  # the tenancy controller (the check thread and operators change it)
        self._windows: dict[str, tuple[int, SendWindows | None]] = {}
        self.replans = 0
        self.busy_intervals = 0
        self.publish(dict(tenancy.plans))

    def publish(self, plans: dict[str, JobPlan]) -> dict[str, int]:
        """Register ``plans`` here (ranks poll them) and serve their windows under the same version. The
        windows go first: a rank that gets version v has its windows to ask for (a rank still running an
        older version keeps the older windows it has, :class:`mccl.runtime.sendgate.SendGate`)."""
        versions = {}
        for name, plan in plans.items():
            active = self.latest(name, plan.schedule.collective)
            versions[name] = max(plan.version, (active[0] + 1) if active else 0)
        with self._plans_lock:
            for name, version in versions.items():
                self._windows[name] = (version, plans[name].gate)
        published = self.tenancy.publish(self, plans)
        if published != versions:  # (only another registration racing this one could do it)
            log.warning("mccl tenancy: published versions %s, windows served under %s", published, versions)
        return published

    def _prioritized(self) -> set[str]:
        jobs = self.tenancy.jobs
        top = max((job.priority for job in jobs.values()), default=0)
        return {name for name, job in jobs.items() if job.priority == top}

    def ingest(self, samples: Iterable[Sample]) -> int:
        batch = samples if isinstance(samples, list) else list(samples)
        watched = self._prioritized()
        mine: dict[str, list[Sample]] = {}
        rest = []
        for sample in batch:
            if sample.communicator in watched:
                mine.setdefault(sample.communicator, []).append(sample)
            elif sample.communicator not in self.tenancy.jobs:
                rest.append(sample)  # not a tenant's job: the manager's own loop
        for job, group in mine.items():
            self.tracker.add(job, group)
        return sum(len(group) for group in mine.values()) + (super().ingest(rest) if rest else 0)

    def step(self) -> list:
        events = super().step()
        fresh = self.tracker.take()
        for job, intervals in fresh.items():
            for start, end in intervals:
                self.tenancy.observe_busy(job, start, end)
            self.busy_intervals += len(intervals)
        if fresh:
            with self._tenancy_lock:
                self._published(self.tenancy.replan())
        return events

    def set_policy(self, policy: str) -> dict[str, int]:
        """Switch every job to ``policy`` (an operator's or a benchmark's call, while jobs run); returns the
        versions published for the plans that changed."""
        with self._tenancy_lock:
            return self._published(self.tenancy.set_policy(policy))

    def _published(self, changed: dict[str, JobPlan]) -> dict[str, int]:
        if not changed:
            return {}
        self.replans += 1
        published = self.publish(changed)
        log.info("mccl tenancy: re-planned %s", ", ".join(f"{n} v{v}" for n, v in sorted(published.items())))
        return published

    def send_windows(self, communicator: str) -> tuple[int, SendWindows | None]:
        """(version, windows) of ``communicator``'s plan; ControllerError for a job not registered."""
        with self._plans_lock:
            found = self._windows.get(communicator)
        if found is None:
            raise ControllerError(f"windows: no tenant job {communicator[:80]!r} "
                                  f"(registered: {sorted(self.tenancy.jobs)[:8]})")
        return found


def windows_reply(manager: ScheduleManager, message: dict[str, Any]) -> bytes:
    """The service's answer to a ``windows`` message (module docstring)."""
    communicator = text_field(message, "communicator")
    if not isinstance(manager, TenancyManager):
        raise ControllerError("windows: this controller runs no tenancy policies")
    version, windows = manager.send_windows(communicator)
    return encode("windows", version=version, windows=windows_field(windows))


def windows_fetcher(client: Any, timeout_s: float = 1.0):
    """A rank's ``fetch`` for :func:`mccl.runtime.sendgate.attach`: one ``windows`` request on the
    client's authenticated channel (:meth:`mccl.control.client.ControllerClient.request`)."""

    def fetch() -> tuple[int, SendWindows | None]:
        reply = client.request("windows", timeout_s=timeout_s, communicator=client.communicator)
        version = reply.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ControllerError(f"windows: a reply without a valid version ({str(version)[:20]})")
        return version, windows_of(reply.get("windows"))

    return fetch
