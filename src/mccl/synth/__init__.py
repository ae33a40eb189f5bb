"""Synthesizers: functions from a topology (and ranks) to a validated-shape Schedule.

Every synthesizer shares one calling convention: ``f(topology, collective?, ranks=None,
**options) -> Schedule`` with the metadata of :class:`mccl.schedule.ScheduleMeta`
filled in. Baselines: rings (naive, NCCL-style, locality-aware) and direct AllToAll;
AllGather / ReduceScatter by optimal spanning-tree packing in :mod:`mccl.synth.treepack`;
bounds every schedule must respect live in :mod:`mccl.synth.bounds`.
"""

from mccl.synth.alltoall import synthesize as synthesize_alltoall
from mccl.synth.bounds import CutBound, allgather_cut_bound
from mccl.synth.common import check_ranks, describe_on
from mccl.synth.direct import direct_alltoall
from mccl.synth.optimize import optimize
from mccl.synth.ring import (
    cross_rack_flows,
    cross_rack_ratio,
    locality_order,
    locality_ring,
    naive_ring,
    nccl_ring,
    nccl_ring_orders,
    ring_schedule,
)
from mccl.synth.treepack import synthesize as treepack_allgather
from mccl.synth.treepack import synthesize_reducescatter as treepack_reducescatter

__all__ = [
    "CutBound",
    "allgather_cut_bound",
    "check_ranks",
    "cross_rack_flows",
    "cross_rack_ratio",
    "describe_on",
    "direct_alltoall",
    "locality_order",
    "locality_ring",
    "naive_ring",
    "nccl_ring",
    "nccl_ring_orders",
    "optimize",
    "ring_schedule",
    "synthesize_alltoall",
    "treepack_allgather",
    "treepack_reducescatter",
]
