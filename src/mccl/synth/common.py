"""Pieces every synthesizer shares: rank checks and the metadata a schedule reports."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mccl.errors import Infeasible, SynthesisError, TopologyError
from mccl.schedule import Schedule, bottleneck_cut, chunks_per_link, link_load, steady_state_algbw
from mccl.topology import Router, Topology

__all__ = ["check_ranks", "describe_on", "route_or_infeasible"]


def route_or_infeasible(router: Router, src: str, dst: str, flow_key: str, why: str) -> tuple[int, ...]:
    """The ECMP route ``src → dst``, or :class:`Infeasible` saying which hop the schedule lacks."""
    try:
        return router.route(src, dst, flow_key=flow_key)
    except TopologyError:
        raise Infeasible(f"{why} needs a route from {src} to {dst} through switches only, and "
                         f"topology {router.topology.name!r} has none (only a relay through a GPU could connect them)") from None


def check_ranks(topology: Topology, ranks: Sequence[str] | None) -> tuple[str, ...]:
    """The ranks' GPUs (all GPUs of the topology by default), checked."""
    chosen = tuple(topology.gpus if ranks is None else ranks)
    if len(chosen) < 2:
        raise SynthesisError(f"a collective needs at least 2 ranks, got {len(chosen)}")
    if len(set(chosen)) != len(chosen):
        raise SynthesisError("ranks must be distinct GPUs")
    for gpu in chosen:
        if gpu not in topology.node_index or not topology.node(gpu).is_gpu:
            raise SynthesisError(f"rank GPU {gpu!r} is not a GPU of topology {topology.name!r}")
    return chosen


def describe_on(schedule: Schedule, topology: Topology, *, load: np.ndarray | None = None) -> Schedule:
    """Fill the metadata a schedule reports about itself on ``topology`` (achieved algbw, K_s, n_a).

    ``load``: the schedule's ``link_load`` when the caller has computed it already."""
    load = link_load(schedule, len(topology.links)) if load is None else load
    counts = chunks_per_link(schedule, len(topology.links))
    return schedule.with_meta(
        achieved_gbs=steady_state_algbw(load, topology.capacities_gbps, schedule.n_ranks),
        bottleneck_cut=bottleneck_cut(schedule, topology, load=load),
        chunks_per_link=tuple((int(link), int(counts[link])) for link in counts.nonzero()[0]),
    )
