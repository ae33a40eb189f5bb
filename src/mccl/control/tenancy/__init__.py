"""Provider mode (MCCS, issue 16): several tenants' jobs on one fabric, policies the controller computes.

Read first: ``controller`` (:class:`TenancyController`: jobs, plans, the gray-failure
loop), ``assign`` (ECMP, FFA, PFA), ``timeshare`` (TS windows from telemetry),
``pinning`` (a chosen path becomes the transfers' route), ``flows`` and ``jobs``; ``live``
(the controller inside the controller service: TS windows to the ranks over its channel).
"""

from mccl.control.tenancy.controller import PathRate, TenancyController
from mccl.control.tenancy.jobs import JobPlan, JobProfile, Policy, TenantJob
from mccl.control.tenancy.pinning import pin_routes
from mccl.control.tenancy.timeshare import idle_windows

__all__ = ["JobPlan", "JobProfile", "PathRate", "Policy", "TenancyController", "TenantJob", "idle_windows",
           "pin_routes"]
