"""What the examples install on every "mccl" group: one schedule per collective, made on the spot.

``mccl.runtime.backend.register(setup)`` calls ``setup(rank, size)`` in every new group.
Here: a single switch joining the ranks (what one host's loopback is), a ring
AllGather and ReduceScatter and a direct AllToAll. On a real cluster ``setup`` would
load the cluster's topology file and the schedules the controller synthesized for it
(``mccl synth``), or return only the topology and let the controller stage schedules.
"""

from __future__ import annotations

from mccl.schedule import Schedule
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import naive_ring
from mccl.topology import Topology, single_switch


def ring_setup(rank: int, size: int) -> tuple[Topology, list[Schedule]]:
    topology = single_switch(size, 100)
    return topology, [naive_ring(topology, "allgather"), naive_ring(topology, "reducescatter"),
                      direct_alltoall(topology)]
