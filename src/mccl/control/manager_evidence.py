"""What the measured evidence says the fabric is, for a schedule manager (split from :mod:`mccl.control.manager`,
which keeps the decisions): the measured capacities (scale-free, :func:`~mccl.control.drift.measured_capacities`),
what a re-synthesis is made for (the level EWMA's reading; with ``absolute_rates`` the link that slowed the
collective read at its traffic, :mod:`.saturation`), and the swap back's evidence (the receiving NICs' rates kept
from registration, :mod:`.portlevel`; the recovery a version was not made for, :mod:`.opportunity`). A base
class: :class:`~mccl.control.manager.ScheduleManager` sets up every attribute used here in its ``__init__``."""

from __future__ import annotations

import numpy as np

from mccl.control.drift import measured_capacities
from mccl.control.ewma import OverlayEWMA
from mccl.control.manager_state import _ManagerState
from mccl.control.opportunity import Opportunity, nics_alike, port_recovered
from mccl.control.records import Decision, _Communicator
from mccl.control.saturation import adopted, saturated_for
from mccl.schedule import Schedule
from mccl.topology import Topology

__all__: list[str] = []


class _Evidence(_ManagerState):
    """The measured fabric and the recovery evidence of a schedule manager (module docstring)."""

    def _measured(self, comm: _Communicator, ewma: OverlayEWMA) -> np.ndarray:
        return measured_capacities(comm.coverage, *ewma.factors(), self._nominal, base_gbps=comm.base,
                                   recovered_factor=1.0 + self.config.gamma)

    def _synthesis_capacities(self, comm: _Communicator, decision: Decision) -> np.ndarray:
        """What a re-synthesis is made for: the level EWMA's measured capacities when there is one; with
        ``absolute_rates``, the link that slowed the collective read at its traffic now (:mod:`.saturation`)."""
        with self._lock:
            ewma = comm.ewma if comm.level is None else comm.level
            capacities = decision.capacities_gbps if comm.level is None else self._measured(comm, ewma)
            if not self.config.absolute_rates:
                return capacities
            reading = saturated_for(self.guard, self.config, comm, ewma, decision.collective, capacities)
        return adopted(self.guard, self.config, decision.communicator, decision.collective, capacities,
                       reading)[0]  # predicts: outside the lock

    def _measured_topology(self, capacities: np.ndarray) -> Topology:
        return self.topology.with_capacities(capacities, name=f"{self.topology.name}+measured")

    def register(self, communicator: str, schedule: Schedule, **options) -> int:  # noqa: ANN003 - as the base's
        """:meth:`_ManagerState.register`, and the communicator's NIC rates kept for the swap back (:mod:`.portlevel`)."""
        version = super().register(communicator, schedule, **options)
        with self._lock:
            ewma = self._comms[communicator].ewma
            if ewma.ports is None:
                names = [self.topology.node(gpu).host for gpu in schedule.ranks]
                codes = {name: code for code, name in enumerate(dict.fromkeys(names))}
                host = np.array([codes[name] for name in names])
                ewma.track_ports(np.not_equal.outer(host, host))
        return version

    def _opportunity(self, decision: Decision) -> Opportunity | None:
        """A recovery the unflagged active schedule was not made for (:mod:`.opportunity`), or None; the
        receiving NICs' evidence first, where the version's base believes some link degraded."""
        with self._lock:
            comm = self._comms[decision.communicator]
            base = None if comm.base is None else comm.base.copy()
            ports, alike, hold = None, None, None
            if base is not None and comm.ewma.ports is not None and np.any(
                    base * (1.0 + self.config.gamma) < self._nominal):
                schedules = [active.schedule for active in comm.active.values()]
                covered = self.opportunities.port_links(decision.communicator, schedules, self.topology)
                alike = nics_alike(comm.ewma.ports.rates(), covered, self.config.gamma)
                factors = comm.ewma.ports.factors()
                if np.any(factors > 1.0 + self.config.gamma):
                    ports = port_recovered(factors, covered, base, self._nominal, self.config.gamma)
                if alike is False:  # a NIC still slow: links no NIC speaks for are not reopened by a path alone
                    hold = np.setdiff1d(np.arange(len(self._nominal)), np.concatenate(covered))
        return self.opportunities.find(decision.communicator, decision.collective, decision.version, base,
                                       decision.capacities_gbps, self._nominal, ports, bool(alike), hold)
