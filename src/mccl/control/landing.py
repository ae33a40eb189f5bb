"""Late landing (issue 15, the AllToAll that stayed at 0.90 of healthy). A version made for a fault that
clears before the ranks reach its first collective learns its references on the repaired fabric while
its base says degraded: ``base · factor`` stays degraded, no path speeds up against references learned
after the repair, and the schedule made for the fault runs on for good. Where ranks report collective
times, the replaced version's keep reaching its clock series after the issue; once the new version has
run a collective, the replaced one's last time is compared with its time when the flag was decided: faster
by more than Γ (the drift test's own threshold) and back within Γ of its own reference time means the
change cleared before the new version landed, and the base goes back to the one before it ("rebased"
event). The drift test then reads the version's cut, profiled on the degraded fabric, against the fabric
as it is, and flags it back (a second swap for that repair: the first landed after it).

Both conditions: one slow outlier in the clock's level at the flag must not read as a repair.
"""

from __future__ import annotations

from mccl.control.observed import CollectiveClock
from mccl.control.records import _Active
from mccl.schedule import Collective

__all__ = ["cleared_before_landing"]


def cleared_before_landing(clock: CollectiveClock, kind: Collective, active: _Active,
                           gamma: float) -> tuple[int, float, float, object] | None:
    """Once ``active`` has run a collective (its ``landing`` is then consumed): did the version it replaced get
    faster by more than ``gamma`` between the flag and its own last collective, back to within ``gamma`` of
    the time it had when its references were learned? If so (replaced version, its time at the flag, its
    last time, the base before ``active`` was issued); None otherwise, or while ``active`` has not landed."""
    if active.landing is None or clock.last(kind, active.version) is None:
        return None  # nothing to check, or not landed yet (or its collective times not reported)
    replaced, (reference_s, at_flag_s), base_before = active.landing
    active.landing = None
    last_s = clock.last(kind, replaced)
    if last_s is None or not (at_flag_s > last_s * (1.0 + gamma) and last_s <= reference_s * (1.0 + gamma)):
        return None
    return replaced, at_flag_s, last_s, base_before
