"""mccl.topology.FabricView: the one graph view the solvers and the validator share."""

from __future__ import annotations

import numpy as np
import pytest

from mccl.errors import Infeasible, TopologyError
from mccl.topology import Node, NodeKind, Topology, degrade, fabric_view, fail2, rail_optimized


def test_ranks_first_in_rank_order_then_switches() -> None:
    topology = rail_optimized(1, 2, 8)
    ranks = list(reversed(topology.gpus))[:10]
    view = fabric_view(topology, ranks)
    assert view.names[:10] == tuple(ranks)
    switches = [node.id for node in topology.nodes if not node.is_gpu]
    assert view.names[10:] == tuple(switches)
    assert view.foreign == tuple(gpu for gpu in topology.gpus if gpu not in ranks)
    # Arcs are the links between graph nodes, in link-id order, with their endpoints and capacities.
    assert np.all(np.diff(view.link) > 0)
    for arc in range(view.n_arcs):
        link = topology.links[view.link[arc]]
        assert (view.names[view.tail[arc]], view.names[view.head[arc]]) == (link.src, link.dst)
        assert view.gbps[arc] == link.gbps
        assert view.arc_of_link[link.id] == arc
    # Every link has endpoint positions; those that touch a foreign GPU have no arc.
    for link in topology.links:
        assert (view.name(int(view.link_src[link.id])), view.name(int(view.link_dst[link.id]))) == (link.src, link.dst)
    assert np.all((view.arc_of_link < 0) == ~np.isin(np.arange(view.n_links), view.link))
    # Hosts: each rank's host, numbered by first appearance.
    assert [view.hosts[h] for h in view.rank_hosts] == [topology.node(gpu).host for gpu in ranks]


def test_capacities_change_the_structure_stays_shared() -> None:
    topology = rail_optimized(1, 2, 8)
    view = fabric_view(topology)
    faulty = fail2(topology)
    again = view.with_capacities(faulty)
    assert again.tail is view.tail and again.head is view.head and again.link is view.link
    assert np.array_equal(again.gbps, fabric_view(faulty).gbps)
    assert view.fits(faulty) and not view.fits(rail_optimized(1, 4, 8))
    assert not np.array_equal(again.gbps, view.gbps)
    with pytest.raises(TopologyError, match="capacities"):
        view.with_capacities(np.ones(3))
    with pytest.raises(ValueError):
        view.tail[0] = 1  # structure arrays are read-only: shared views cannot corrupt each other
    assert np.array_equal(view.with_capacities(degrade(topology, 0, factor=0.5)).gbps[1:], view.gbps[1:])


def test_connectivity_check_names_the_gpu() -> None:
    nodes = [Node(f"g{i}", NodeKind.GPU) for i in range(3)]
    edges = [("g0", "g1", 10.0, 0.0), ("g1", "g0", 10.0, 0.0), ("g1", "g2", 10.0, 0.0), ("g2", "g1", 10.0, 0.0)]
    chain = Topology.from_edges("chain", nodes, edges)
    assert fabric_view(chain).require_connected("AllGather").n_ranks == 3
    view = fabric_view(chain, ["g0", "g2"])
    assert view.disconnected_pair() == ("g0", "g2")
    assert view.is_gpu_position(view.link_dst).all()  # g1 is a foreign GPU, the others ranks
    with pytest.raises(Infeasible, match="AllToAll is infeasible on topology 'chain': rank GPU 'g0' cannot reach "
                                         "rank GPU 'g2'"):
        view.require_connected("AllToAll")


def test_bad_ranks_are_refused() -> None:
    topology = rail_optimized(1, 2, 8)
    with pytest.raises(TopologyError, match="no node 'nope'"):
        fabric_view(topology, ["gpu0", "nope"])
    with pytest.raises(TopologyError, match="not a GPU"):
        fabric_view(topology, ["gpu0", "nvs0"])
    with pytest.raises(TopologyError, match="distinct"):
        fabric_view(topology, ["gpu0", "gpu0"])
