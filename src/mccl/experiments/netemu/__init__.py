"""The live loop on a kernel-emulated fabric: network namespaces, veths, bridges and ``tc`` shaping.

``fabric`` builds an mccl topology as namespaces and shaped links and changes them at run time
(gray failures); ``shaping`` holds the iproute2 commands; ``ranks`` starts gloo ranks inside their
GPU's namespace; ``demo`` is ``mccl demo`` (the default fabric). Needs root; :func:`unsupported_reason`
says in one line why not when it cannot run. ``python -m mccl.experiments.netemu cleanup`` deletes
what a killed run left behind.
"""

from mccl.experiments.netemu.fabric import EmulatedFabric, FabricPlan, RankPort, sweep, unsupported_reason
from mccl.experiments.netemu.shaping import FabricError

__all__ = ["EmulatedFabric", "FabricPlan", "RankPort", "FabricError", "sweep", "unsupported_reason"]
