import numpy as np
import pytest
from hypothesis import given, settings

from conftest import BUILDER_CASES, small_topologies
from mccl.errors import TopologyError, TopologyFileError
from mccl.topology import (
    Link,
    NodeKind,
    Router,
    Topology,
    degrade,
    dump_topology,
    dumps_topology,
    fail1,
    fail2,
    fail3,
    load_topology,
    loads_topology,
    parse_topology,
    rail_optimized,
    single_switch,
)


def test_hpn_structure(hpn):
    assert hpn.summary() == {"gpu": 16, "nvswitch": 2, "tor": 8, "aggregation": 2, "links": 96}
    assert hpn.link_between("gpu0", "nvs0").gbps == 2880 and hpn.link_between("gpu0", "nvs0").latency_us == 0.025
    assert hpn.link_between("gpu9", "tor0.1").gbps == 400 and hpn.link_between("tor0.1", "gpu9").latency_us == 0.5
    assert hpn.node("gpu9").host == "host1" and hpn.node("gpu9").rail == 1
    # each ToR's uplinks match its downlinks (1:1)
    up = sum(hpn.links[i].gbps for i in hpn.out_links["tor0.3"] if hpn.node(hpn.links[i].dst).kind is NodeKind.AGGREGATION)
    down = sum(hpn.links[i].gbps for i in hpn.out_links["tor0.3"] if hpn.node(hpn.links[i].dst).is_gpu)
    assert up == down == 800


def test_multi_segment_hpn_has_one_tor_per_rail_and_segment():
    fabric = rail_optimized(2, 4, 8)
    assert fabric.summary()["tor"] == 16 and len(fabric.gpus) == 64
    assert fabric.node("gpu32").segment == "seg1" and fabric.links_between("gpu32", "tor1.0")


@pytest.mark.parametrize("fabric", BUILDER_CASES, ids=lambda t: t.name)
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_file_round_trip(fabric, fmt, tmp_path):
    assert loads_topology(dumps_topology(fabric, fmt)) == fabric
    path = tmp_path / f"t.{fmt}"
    dump_topology(fabric, path)
    assert load_topology(path) == fabric


@given(small_topologies())
@settings(max_examples=40, deadline=None)
def test_random_topologies_round_trip(fabric):
    assert loads_topology(dumps_topology(fabric)) == fabric


GOOD = """format: mccl-topology/1
name: tiny
nodes:
  - {id: a, kind: gpu, host: h0}
  - {id: b, kind: gpu, host: h1}
  - {id: s, kind: switch}
links:
  - {src: a, dst: s, gbps: 100, latency_us: 0.5, duplex: true}
  - {src: b, dst: s, gbps: 100, latency_us: 0.5, duplex: true}
"""


def test_hand_written_file_with_duplex_links():
    fabric = loads_topology(GOOD)
    assert len(fabric.links) == 4 and fabric.link_between("s", "a").gbps == 100


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("dst: s, gbps: 100, latency_us: 0.5, duplex: true}\n  - {src: b", "dst: q, gbps: 100, latency_us: 0.5, duplex: true}\n  - {src: b"), r"t\.yaml:8: links\[0\]\.dst: unknown node 'q'"),
        (("src: b, dst: s, gbps: 100", "src: b, dst: s, gbps: 0"), r"t\.yaml:9: links\[1\]\.gbps: capacity must be positive, got 0"),
        (("src: b, dst: s, gbps: 100", "src: b, dst: s, gbps: -3.5"), r"links\[1\]\.gbps: capacity must be positive"),
        (("{id: b, kind: gpu", "{id: a, kind: gpu"), r"t\.yaml:5: nodes\[1\]\.id: duplicate node id 'a'"),
        (("{id: s, kind: switch}", "{id: s, kind: router}"), r"nodes\[2\]\.kind: unknown node kind 'router'"),
        (("mccl-topology/1", "mccl-topology/9"), r"t\.yaml:1: format: expected format"),
        (("gbps: 100, latency_us: 0.5, duplex: true}\n  - {src: b, dst: s, gbps: 100, latency_us: 0.5, duplex: true}",
          "gbps: 100, latency_us: 0.5, duplex: true}\n  - {src: b, dst: s, gbps: 100, latency_us: 0.5}"),
         r"t\.yaml:\d+: nodes\[1\]: GPU 'b' has no incoming links: GPU 'a' cannot reach it"),
        (("latency_us: 0.5, duplex: true}\n  - {src: b", "latency_us: x, duplex: true}\n  - {src: b"), r"links\[0\]\.latency_us: must be a finite number"),
        (("nodes:\n", "nodes: {\n"), r"t\.yaml:\d+: not valid YAML/JSON"),
    ],
)
def test_malformed_files_name_line_and_field(edit, message):
    old, new = edit
    assert old in GOOD
    with pytest.raises(TopologyFileError, match=message):
        loads_topology(GOOD.replace(old, new, 1), source="t.yaml")


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(TopologyFileError, match="cannot read"):
        load_topology(tmp_path / "missing.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(TopologyFileError, match="empty"):
        load_topology(tmp_path / "empty.yaml")


def test_disconnected_gpu_in_code_is_rejected():
    fabric = single_switch(3, 100)
    links = [link for link in fabric.links if link.src != "gpu2"]
    with pytest.raises(TopologyError, match="GPU 'gpu2' has no outgoing links: it cannot reach GPU 'gpu0'"):
        Topology.from_edges("cut", fabric.nodes, [(k.src, k.dst, k.gbps, k.latency_us) for k in links])


def test_a_gpu_without_links_is_named_not_the_first_gpu():
    """The GPU left without links is the one reported (it was reported as ``nodes[0]``, the first GPU, which
    merely cannot reach it), in code and at its own entry in a file."""
    fabric = single_switch(4, 100)
    links = [(k.src, k.dst, k.gbps, k.latency_us) for k in fabric.links if "gpu2" not in (k.src, k.dst)]
    with pytest.raises(TopologyError, match=r"^GPU 'gpu2' has no links: it cannot reach any other GPU"):
        Topology.from_edges("cut", fabric.nodes, links)
    text = GOOD.replace("  - {id: s, kind: switch}", "  - {id: c, kind: gpu, host: h2}\n  - {id: s, kind: switch}")
    with pytest.raises(TopologyFileError, match=r"t\.yaml:6: nodes\[2\]: GPU 'c' has no links"):
        loads_topology(text, source="t.yaml")
    islands = GOOD.replace("  - {id: s, kind: switch}", "  - {id: c, kind: gpu, host: h2}\n  - {id: s, kind: switch}"
                           "\n  - {id: s2, kind: switch}").replace(
        "links:\n", "links:\n  - {src: c, dst: s2, gbps: 100, latency_us: 0.5, duplex: true}\n")
    with pytest.raises(TopologyFileError, match=r"nodes\[2\]: GPU 'c' cannot reach GPU 'a': the fabric is disconnected"):
        loads_topology(islands, source="t.yaml")


def test_degrade_returns_a_new_value(hpn):
    slow = degrade(hpn, ("gpu0", "tor0.0"), factor=0.5)
    assert slow.link_between("gpu0", "tor0.0").gbps == 200
    assert slow.link_between("tor0.0", "gpu0").gbps == 400  # one direction only
    assert hpn.link_between("gpu0", "tor0.0").gbps == 400  # the original is untouched
    both = degrade(hpn, hpn.link_between("gpu0", "tor0.0").id, gbps=10, duplex=True)
    assert both.link_between("tor0.0", "gpu0").gbps == 10
    with pytest.raises(TopologyError, match="no such link"):
        degrade(hpn, ("gpu0", "gpu1"), gbps=1)
    with pytest.raises(TopologyError, match="exactly one"):
        degrade(hpn, 0, gbps=1, factor=0.5)
    with pytest.raises(TopologyError, match="positive"):
        degrade(hpn, 0, gbps=0)


def test_named_faults(hpn):
    assert fail1(hpn).link_between("gpu0", "nvs0").gbps == 800 == fail1(hpn).link_between("nvs0", "gpu0").gbps
    assert fail2(hpn).link_between("gpu0", "tor0.0").gbps == 50 == fail2(hpn).link_between("tor0.0", "gpu0").gbps
    spare = fail3(hpn)
    assert spare.link_between("gpu0", "nvs0").gbps == 50 and spare.link_between("gpu0", "tor0.0").gbps == 100
    assert spare.link_between("gpu0", "tor0.0").latency_us == pytest.approx(1.5)
    assert spare.node("gpu0").rack != hpn.node("gpu0").rack and spare.node("gpu0").host != "host0"
    with pytest.raises(TopologyError, match="nvswitch"):
        fail1(single_switch(4, 100))


def test_routes_avoid_gpus_and_spread_by_ecmp(hpn):
    router = Router(hpn)
    assert [hpn.links[i].dst for i in router.route("gpu0", "gpu8")] == ["tor0.0", "gpu8"]
    assert [hpn.links[i].dst for i in router.route("gpu0", "gpu1")] == ["nvs0", "gpu1"]
    cross = router.routes("gpu0", "gpu9")
    assert len(cross) == 2 and all(len(route) == 4 for route in cross)  # via either aggregation switch
    chosen = {router.route("gpu0", "gpu9", flow_key=f"f{i}") for i in range(32)}
    assert chosen == set(cross)


def test_builder_specs_and_bad_specs():
    assert parse_topology("rail_optimized(1,2,8)+Fail2").link_between("gpu0", "tor0.0").gbps == 50
    assert parse_topology("switch_ring(4,1,2,100)+sw0->sw1=25").link_between("sw0", "sw1").gbps == 25
    assert parse_topology("single_switch(4,100)+gpu0<->sw0*0.5").link_between("sw0", "gpu0").gbps == 50
    with pytest.raises(TopologyError, match="unknown topology builder"):
        parse_topology("torus(4)")
    with pytest.raises(TopologyError, match="must be positive"):
        parse_topology("single_switch(0,100)")
    with pytest.raises(TopologyError, match="no such topology file"):
        parse_topology("missing.yaml")


def test_with_capacities_equals_a_topology_built_afresh():
    """with_capacities checks only the capacity rules and hands on the structural lookups: the result must
    equal the topology built from scratch with those links (every lookup too), and refuse what it refuses."""
    fabric = rail_optimized(1, 2, 4)
    _ = fabric.node_index, fabric.gpus, fabric.out_links, fabric.link_endpoints, fabric.latencies_us  # cached
    _ = fabric.capacities_gbps
    values = fabric.capacities_gbps * np.linspace(0.25, 1.0, len(fabric.links))
    values[3] = fabric.links[3].gbps  # an unchanged link
    got = fabric.with_capacities(values, name="reweighted")
    fresh = Topology("reweighted", fabric.nodes, tuple(Link(k.id, k.src, k.dst, float(v), k.latency_us)
                                                          for k, v in zip(fabric.links, values, strict=True)))
    assert got == fresh and got.links == fresh.links
    assert np.array_equal(got.capacities_gbps, values) and not np.array_equal(got.capacities_gbps,
                                                                              fabric.capacities_gbps)
    for lookup in ("node_index", "gpus", "out_links", "latencies_us"):
        assert getattr(got, lookup) == getattr(fresh, lookup) if lookup != "latencies_us" else np.array_equal(
            got.latencies_us, fresh.latencies_us)
    assert all(np.array_equal(a, b) for a, b in zip(got.link_endpoints, fresh.link_endpoints, strict=True))
    assert got.links_between("gpu0", "nvs0") == fresh.links_between("gpu0", "nvs0")
    assert fabric.with_capacities(fabric.capacities_gbps).links == fabric.links  # name kept, nothing changed
    for bad, message in ((0.0, "has capacity 0.0 Gbit/s; it must be positive"), (np.nan, "it must be positive"),
                         (1e-12, "too slow to schedule around")):
        changed = fabric.capacities_gbps.copy()
        changed[5] = bad
        with pytest.raises(TopologyError, match=message):
            fabric.with_capacities(changed)
        with pytest.raises(TopologyError, match=message):
            Topology("x", fabric.nodes, tuple(Link(k.id, k.src, k.dst, float(v), k.latency_us)
                                              for k, v in zip(fabric.links, changed, strict=True)))
