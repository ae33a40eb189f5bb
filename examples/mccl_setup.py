"""What the examples install on every "mccl" group: one schedule per collective, made on the spot.

``mccl.runtime.backend.register(setup)`` calls ``setup(rank, size)`` in every new group.
Here: a single switch joining the ranks (what one host's loopback is) and a direct
AllGather, ReduceScatter and AllToAll: on one switch every pair has its own path, so
sending every block straight to where it goes is as fast as a ring on the wire, and on
gloo the executor runs each one-step schedule as one alltoallv (its waits in C++, not
a Python wait per message). The direct ReduceScatter moves the ring's bytes and hands
every contribution to its owner unsummed, so the owner adds them in gloo's order and
training is bit-identical to gloo's (:mod:`mccl.runtime.reduction_order`); a ring
ReduceScatter adds in its own order. On a real cluster ``setup`` would
load the cluster's topology file and the schedules the controller synthesized for it
(``mccl synth``), or return only the topology and let the controller stage schedules.

A group of one rank (``torchrun --nproc-per-node 1``, a debugging run) has nothing to schedule: every
collective is a copy of its input (:mod:`mccl.runtime.single`), so the set-up installs nothing there (a
schedule needs two ranks; synthesizing one for a single rank is refused).
"""

from __future__ import annotations

from mccl.schedule import Schedule
from mccl.synth.direct import direct_allgather, direct_alltoall, direct_reducescatter
from mccl.synth.ring import naive_ring
from mccl.topology import Topology, single_switch


def direct_setup(rank: int, size: int) -> tuple[Topology | None, list[Schedule]]:
    if size == 1:
        return None, []
    topology = single_switch(size, 100)
    return topology, [direct_allgather(topology), direct_reducescatter(topology), direct_alltoall(topology)]


def ring_setup(rank: int, size: int) -> tuple[Topology | None, list[Schedule]]:
    """The earlier examples' set: a ring AllGather (the eager driver, forwarding block by block)
    instead of the direct one; for comparison (benchmarks/backend.py ``--ring-ag``)."""
    if size == 1:
        return None, []
    topology = single_switch(size, 100)
    return topology, [naive_ring(topology, "allgather"), direct_reducescatter(topology), direct_alltoall(topology)]
