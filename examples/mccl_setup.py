"""What the examples install on every "mccl" group: one schedule per collective, made on the spot.

``mccl.runtime.backend.register(setup)`` calls ``setup(rank, size)`` in every new group.
Here: a single switch joining the ranks (what one host's loopback is), a ring
AllGather, a direct ReduceScatter and a direct AllToAll. The direct ReduceScatter moves
the ring's bytes and hands every contribution to its owner unsummed, so the owner adds
them in gloo's order and training is bit-identical to gloo's
(:mod:`mccl.runtime.reduction_order`); a ring ReduceScatter adds in its own order. On a real cluster ``setup`` would
load the cluster's topology file and the schedules the controller synthesized for it
(``mccl synth``), or return only the topology and let the controller stage schedules.
"""

from __future__ import annotations

from mccl.schedule import Schedule
from mccl.synth.direct import direct_alltoall, direct_reducescatter
from mccl.synth.ring import naive_ring
from mccl.topology import Topology, single_switch


def ring_setup(rank: int, size: int) -> tuple[Topology, list[Schedule]]:
    topology = single_switch(size, 100)
    return topology, [naive_ring(topology, "allgather"), direct_reducescatter(topology),
                      direct_alltoall(topology)]
