"""The ``mccl sim mccs-*`` scenarios of issue 16 (MCCS §5 side by side, and one beyond it), by name.

``mccs-reversal`` (the ring reversal) lives in :mod:`mccl.experiments.mccs` and the paper
scenarios' table; these return a :class:`~mccl.experiments.mccs_common.ComparisonReport`.
"""

from __future__ import annotations

from collections.abc import Callable

from mccl.experiments.mccs_common import ComparisonReport
from mccl.experiments.mccs_crossrack import cross_rack
from mccl.experiments.mccs_gray import gray_tenants
from mccl.experiments.mccs_single import ring_order, size_sweep
from mccl.experiments.mccs_tenants import tenant_setups
from mccl.experiments.mccs_training import training_mix

__all__ = ["MCCS_SCENARIOS"]

MCCS_SCENARIOS: dict[str, Callable[[], ComparisonReport]] = {
    "mccs-order": ring_order,
    "mccs-sizes": size_sweep,
    "mccs-tenants": tenant_setups,
    "mccs-training": training_mix,
    "mccs-crossrack": cross_rack,
    "mccs-gray": gray_tenants,
}
