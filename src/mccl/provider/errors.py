"""The errors of the provider service, each a :class:`~mccl.errors.MCCLError` that names the problem.

A tenant sees them as the ``error`` field of a reply (the class name) and its message; the shim raises
the same class again on the tenant's side, so ``except BadReference`` works across the socket.
"""

from __future__ import annotations

from mccl.errors import MCCLError

__all__ = ["ProviderError", "BadReference", "BadRequest", "QuotaExceeded", "JobFailed", "ERRORS"]


class ProviderError(MCCLError):
    """The provider service failed or refused a tenant's request."""


class BadReference(ProviderError):
    """A buffer reference (allocation id, offset, length) is not inside one of the caller's own allocations."""


class BadRequest(ProviderError):
    """A message is malformed: not JSON, an unknown operation, a field of the wrong type or out of range."""


class QuotaExceeded(ProviderError):
    """A tenant asked for more shared memory, allocations or jobs than the service grants one session."""


class JobFailed(ProviderError):
    """A job's communicator broke (a peer service or the job's rank on another host went away)."""


ERRORS: dict[str, type[ProviderError]] = {cls.__name__: cls for cls in
                                          (ProviderError, BadReference, BadRequest, QuotaExceeded, JobFailed)}
