"""The exception hierarchy of mccl.

Every failure a user can cause (a malformed file, an infeasible collective, a
schedule that breaks a rule) raises a subclass of :class:`MCCLError` whose message
names the problem in the user's terms. This module imports nothing of mccl, so every
package may use it without breaking the layering of DESIGN.md.
"""

from __future__ import annotations

__all__ = [
    "MCCLError",
    "TopologyError",
    "TopologyFileError",
    "InvalidSchedule",
    "ScheduleFileError",
    "SynthesisError",
    "Infeasible",
    "SynthesisUnavailable",
    "InvalidOptions",
    "ControllerError",
    "PeerLost",
]


class MCCLError(Exception):
    """Base of every error mccl raises on purpose."""


class TopologyError(MCCLError):
    """A topology is malformed: unknown node, bad capacity, duplicate id, a GPU cut off."""


class TopologyFileError(TopologyError):
    """A topology file could not be read; the message names the file, line and field."""


class InvalidSchedule(MCCLError):
    """A schedule breaks a rule of its collective; the message names the first violation."""


class ScheduleFileError(InvalidSchedule):
    """A schedule file could not be read; the message names the file and field."""


class SynthesisError(MCCLError):
    """A synthesizer could not produce a schedule."""


class Infeasible(SynthesisError):
    """The requested collective cannot be carried out on the given topology."""


class SynthesisUnavailable(SynthesisError):
    """No registered synthesizer makes ``collective`` (or none called ``method``).

    Callers decide on the fields, never on the message: the controller keeps the current
    schedule of a collective nothing can re-synthesize."""

    def __init__(self, collective: str, method: str | None, available: tuple[str, ...]) -> None:
        self.collective, self.method, self.available = collective, method, available
        what = f"synthesizer {method!r}" if method else "a synthesizer"
        offer = ", ".join(available) if available else "none"
        super().__init__(f"{what} for {collective} is not available (available for {collective}: {offer})")


class InvalidOptions(SynthesisError):
    """A synthesizer's options are wrong: an unknown name, a value out of range, the options
    class of another method. ``option`` is None when the whole options object is the problem."""

    def __init__(self, method: str, option: str | None, reason: str) -> None:
        self.method, self.option, self.reason = method, option, reason
        where = f"option {option!r} of {method!r}" if option else f"options of {method!r}"
        super().__init__(f"{where}: {reason}")


class ControllerError(MCCLError):
    """The controller service failed or refused a request."""


class PeerLost(MCCLError):
    """A rank of the group stopped answering in the middle of a collective (its process died or its
    connection broke); the transport group is broken and the communicator cannot run collectives again."""
