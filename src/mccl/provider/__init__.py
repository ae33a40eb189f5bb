"""mccl.provider: the provider-run collective service of MCCS §3.1 — one per host, several tenants.

Read first: ``service`` (the per-host process: sockets, sessions, authentication), ``session``
(one tenant process: its allocations, jobs and collectives, on a thread of its own), ``memory``
(shared-memory buffers and the check of every (allocation id, offset, length) reference),
``jobs`` (a tenant job's gloo group and mccl communicator across the services; the per-job
strategy seam for policies), ``shim`` (the tenant's side: mccl's collective API), ``protocol``
(the messages), ``channel`` (the collectives' fast path: a pipe pair per session, binary frames),
``backend`` (the tenant's torch.distributed backend ``"mccl_provider"``), ``keys`` (each tenant its
own CURVE key, from the provider's secret).

The service and the shim import torch and zmq; nothing else of mccl imports this package but the cli.
"""

from mccl.provider.errors import BadReference, BadRequest, JobFailed, ProviderError, QuotaExceeded
from mccl.provider.keys import TenantCredential, read_credential, tenant_credential, write_credential

__all__ = ["BadReference", "BadRequest", "JobFailed", "ProviderError", "QuotaExceeded", "TenantCredential",
           "read_credential", "tenant_credential", "write_credential"]
