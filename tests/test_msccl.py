"""MSCCL XML export, checked by a pure-Python simulation of the XML (what the MSCCL executor would do)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict, deque

import pytest

from mccl.errors import InvalidSchedule
from mccl.schedule import Collective, to_msccl_xml, validate
from mccl.synth.alltoall import synthesize as synthesize_alltoall
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import nccl_ring
from mccl.synth.treepack import synthesize
from mccl.topology import degrade, fail2, rail_optimized, single_switch

ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
              "minBytes", "maxBytes")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")


class XmlRejected(Exception):
    """The XML would not run correctly on an MSCCL executor."""


def check_msccl_xml(text: str) -> None:
    """Structural rules, then a simulation: threadblocks run their steps in order, a step waits for its
    dependency, sends and receives pair up FIFO per (sender, receiver, channel); every output unit must
    end up holding the right input unit."""
    if not text.lstrip().startswith("<algo"):
        raise XmlRejected("the file must start with <algo> (no XML declaration before it)")
    root = ET.fromstring(text)
    for attr in ALGO_ATTRS:
        if attr not in root.attrib:
            raise XmlRejected(f"<algo> lacks {attr}")
    if root.get("outofplace") != "1" or root.get("inplace") != "0":
        raise XmlRejected("expected an out-of-place algorithm")
    coll, n, channels = root.get("coll"), int(root.get("ngpus")), int(root.get("nchannels"))
    gpus = root.findall("gpu")
    if sorted(int(g.get("id")) for g in gpus) != list(range(n)):
        raise XmlRejected("gpu ids must be 0..ngpus-1")
    tbs: dict[tuple[int, int], dict] = {}
    sizes: dict[int, dict[str, int]] = {}
    for gpu in gpus:
        rank = int(gpu.get("id"))
        sizes[rank] = {"i": int(gpu.get("i_chunks")), "o": int(gpu.get("o_chunks")), "s": int(gpu.get("s_chunks"))}
        seen: set[tuple[int, int, str]] = set()
        per_channel: dict[tuple[int, str], int] = defaultdict(int)
        for tb in gpu.findall("tb"):
            tb_id, send, recv, chan = (int(tb.get(a)) for a in ("id", "send", "recv", "chan"))
            if (rank, tb_id) in tbs:
                raise XmlRejected(f"gpu {rank} has two threadblocks {tb_id}")
            if not 0 <= chan < channels:
                raise XmlRejected(f"gpu {rank} tb {tb_id}: channel {chan} outside nchannels={channels}")
            for peer, direction in ((send, "send"), (recv, "recv")):
                if peer == rank:
                    raise XmlRejected(f"gpu {rank} tb {tb_id} names itself as peer")
                if peer >= 0:
                    if (peer, chan, direction) in seen:
                        raise XmlRejected(f"gpu {rank}: two threadblocks {direction} with peer {peer} on channel {chan}")
                    seen.add((peer, chan, direction))
                    per_channel[(chan, direction)] += 1
                    if per_channel[(chan, direction)] > 32:
                        raise XmlRejected(f"gpu {rank}: more than 32 {direction} threadblocks on channel {chan}")
            steps = []
            for index, step in enumerate(tb.findall("step")):
                for attr in STEP_ATTRS:
                    if attr not in step.attrib or not re.fullmatch(r"-?\w+", step.get(attr)):
                        raise XmlRejected(f"gpu {rank} tb {tb_id} step {index}: missing or malformed {attr}")
                if int(step.get("s")) != index:
                    raise XmlRejected(f"gpu {rank} tb {tb_id}: steps must be numbered 0.. in order")
                kind = step.get("type")
                if kind not in ("s", "r", "rcs", "cpy", "nop"):
                    raise XmlRejected(f"gpu {rank} tb {tb_id} step {index}: unsupported type {kind}")
                if kind in ("s", "rcs") and send < 0 or kind in ("r", "rcs") and recv < 0:
                    raise XmlRejected(f"gpu {rank} tb {tb_id} step {index}: {kind} without a peer")
                steps.append(dict(step.attrib))
            if len(steps) > 64:
                raise XmlRejected(f"gpu {rank} tb {tb_id} has {len(steps)} steps; at most 64")
            tbs[(rank, tb_id)] = {"send": send, "recv": recv, "chan": chan, "steps": steps, "pc": 0}
    for (rank, tb_id), tb in tbs.items():
        for index, step in enumerate(tb["steps"]):
            dep_tb, dep_step = int(step["depid"]), int(step["deps"])
            if dep_tb < 0:
                continue
            target = tbs.get((rank, dep_tb))
            if target is None or not 0 <= dep_step < len(target["steps"]):
                raise XmlRejected(f"gpu {rank} tb {tb_id} step {index} depends on a step that does not exist")
            if target["steps"][dep_step]["hasdep"] != "1":
                raise XmlRejected(f"gpu {rank} tb {dep_tb} step {dep_step} is depended on but lacks hasdep=\"1\"")
    _simulate(coll, n, tbs, sizes)


def _simulate(coll: str, n: int, tbs: dict, sizes: dict) -> None:
    buffers = {rank: {"i": [("in", rank, u) for u in range(sz["i"])], "o": [None] * sz["o"], "s": [None] * sz["s"]}
               for rank, sz in sizes.items()}
    fifo: dict[tuple[int, int, int], deque] = defaultdict(deque)

    def read(rank: int, buf: str, off: int, cnt: int) -> list:
        if off < 0 or off + cnt > len(buffers[rank][buf]):
            raise XmlRejected(f"gpu {rank}: {buf}[{off}:{off + cnt}] is out of bounds")
        values = buffers[rank][buf][off:off + cnt]
        if any(v is None for v in values):
            raise XmlRejected(f"gpu {rank} reads {buf}[{off}:{off + cnt}] before it holds data there")
        return values

    def write(rank: int, buf: str, off: int, values: list) -> None:
        if off < 0 or off + len(values) > len(buffers[rank][buf]):
            raise XmlRejected(f"gpu {rank}: {buf}[{off}:{off + len(values)}] is out of bounds")
        buffers[rank][buf][off:off + len(values)] = values

    pending = sum(len(tb["steps"]) for tb in tbs.values())
    while pending:
        progressed = False
        for (rank, _), tb in tbs.items():
            while tb["pc"] < len(tb["steps"]):
                step = tb["steps"][tb["pc"]]
                dep_tb, dep_step = int(step["depid"]), int(step["deps"])
                if dep_tb >= 0 and tbs[(rank, dep_tb)]["pc"] <= dep_step:
                    break
                kind, cnt = step["type"], int(step["cnt"])
                if kind in ("r", "rcs"):
                    queue = fifo[(tb["recv"], rank, tb["chan"])]
                    if not queue:
                        break
                    values = queue.popleft()
                    if len(values) != cnt:
                        raise XmlRejected(f"gpu {rank} receives {len(values)} units where its step expects {cnt}")
                    write(rank, step["dstbuf"], int(step["dstoff"]), values)
                    if kind == "rcs":
                        fifo[(rank, tb["send"], tb["chan"])].append(values)
                elif kind == "s":
                    fifo[(rank, tb["send"], tb["chan"])].append(read(rank, step["srcbuf"], int(step["srcoff"]), cnt))
                elif kind == "cpy":
                    write(rank, step["dstbuf"], int(step["dstoff"]), read(rank, step["srcbuf"], int(step["srcoff"]), cnt))
                tb["pc"] += 1
                pending -= 1
                progressed = True
        if not progressed:
            raise XmlRejected("deadlock: no threadblock can take its next step")
    if any(fifo.values()):
        raise XmlRejected("data was sent that nobody received")
    for rank in range(n):
        out = buffers[rank]["o"]
        k = len(out) // n
        for block in range(n):
            for u in range(k):
                want = ("in", block, u) if coll == "allgather" else ("in", block, rank * k + u)
                if out[block * k + u] != want:
                    raise XmlRejected(f"gpu {rank} output unit {block * k + u} holds {out[block * k + u]}, not {want}")


@pytest.fixture(scope="module")
def hpn_tree():
    hpn = rail_optimized(1, 2, 8)
    return synthesize(hpn).schedule


def _schedules():
    hpn = rail_optimized(1, 2, 8)
    healthy = synthesize(hpn).schedule
    yield "treepack-hpn", healthy
    yield "treepack-fail2", synthesize(fail2(hpn), previous=healthy).schedule
    for degradation in (0.5, 0.75, 0.88):
        yield f"treepack-nic-{degradation}", synthesize(degrade(hpn, ("gpu0", "tor0.0"), factor=1 - degradation,
                                                                duplex=True)).schedule
    yield "treepack-32-latency", synthesize(rail_optimized(1, 4, 8), latency_aware=True).schedule
    yield "ring-8-chunks", nccl_ring(hpn, Collective.ALLGATHER, chunks=8)  # > 64 steps per connection
    yield "alltoall-pxn", direct_alltoall(hpn, chunks=2)  # relays keep chunks in scratch
    yield "alltoall-cg-fail2", synthesize_alltoall(fail2(hpn)).schedule  # column generation: multi-hop relays, uneven chunks


@pytest.mark.parametrize(("label", "schedule"), list(_schedules()), ids=lambda x: x if isinstance(x, str) else "")
def test_exported_schedules_pass_checker(label: str, schedule) -> None:
    text = to_msccl_xml(schedule)
    assert not text.startswith("<?xml")
    check_msccl_xml(text)
    root = ET.fromstring(text)
    assert root.get("coll") == schedule.collective.value and int(root.get("ngpus")) == schedule.n_ranks


def test_export_is_pure(hpn_tree) -> None:
    before = (hpn_tree.transfers, hpn_tree.chunks, hpn_tree.meta)
    assert to_msccl_xml(hpn_tree) == to_msccl_xml(hpn_tree)
    assert (hpn_tree.transfers, hpn_tree.chunks, hpn_tree.meta) == before


def test_many_peers_split_across_channels() -> None:
    fabric = single_switch(40, 100)
    schedule = direct_alltoall(fabric)
    validate(schedule, fabric)
    text = to_msccl_xml(schedule)
    assert int(ET.fromstring(text).get("nchannels")) >= 2  # 39 peers per direction > 32 per channel (first fit)
    check_msccl_xml(text)
    with pytest.raises(InvalidSchedule, match="needs more than 1 channels"):
        to_msccl_xml(schedule, max_channels=1)


def test_only_copy_collectives() -> None:
    with pytest.raises(InvalidSchedule, match="allgather and alltoall"):
        to_msccl_xml(nccl_ring(rail_optimized(1, 2, 8), Collective.REDUCESCATTER))


# --- the checker rejects broken XML --------------------------------------------------------------------

def _mutate(text: str, mutation) -> str:
    root = ET.fromstring(text)
    mutation(root)
    return ET.tostring(root, encoding="unicode")


def _first_recv_tb(root, min_steps: int = 1):
    for gpu in root.findall("gpu"):
        for tb in gpu.findall("tb"):
            if tb.get("recv") != "-1" and len(tb.findall("step")) >= min_steps:
                return gpu, tb
    raise AssertionError("no receive threadblock")


def test_checker_rejects_wrong_offset(hpn_tree) -> None:
    def wrong_offset(root) -> None:
        _, tb = _first_recv_tb(root)
        step = tb.find("step")
        step.set("dstoff", str(int(step.get("dstoff")) + 1))

    with pytest.raises(XmlRejected):
        check_msccl_xml(_mutate(to_msccl_xml(hpn_tree), wrong_offset))


def test_checker_rejects_swapped_fifo_order(hpn_tree) -> None:
    def swap(root) -> None:
        _, tb = _first_recv_tb(root, min_steps=2)
        first, second = tb.findall("step")[:2]
        for attr in ("srcoff", "dstoff", "dstbuf", "srcbuf"):
            a, b = first.get(attr), second.get(attr)
            first.set(attr, b)
            second.set(attr, a)

    with pytest.raises(XmlRejected, match="holds|before it holds"):
        check_msccl_xml(_mutate(to_msccl_xml(hpn_tree), swap))


def test_checker_rejects_two_threadblocks_on_one_connection(hpn_tree) -> None:
    def duplicate(root) -> None:
        for gpu in root.findall("gpu"):
            senders = [tb for tb in gpu.findall("tb") if tb.get("send") != "-1"]
            if len(senders) >= 2:
                senders[1].set("send", senders[0].get("send"))
                senders[1].set("chan", senders[0].get("chan"))
                return

    with pytest.raises(XmlRejected, match="two threadblocks send"):
        check_msccl_xml(_mutate(to_msccl_xml(hpn_tree), duplicate))


def test_checker_rejects_missing_hasdep(hpn_tree) -> None:
    def drop_hasdep(root) -> None:
        for gpu in root.findall("gpu"):
            for tb in gpu.findall("tb"):
                for step in tb.findall("step"):
                    if step.get("hasdep") == "1":
                        step.set("hasdep", "0")
                        return

    with pytest.raises(XmlRejected, match="lacks hasdep"):
        check_msccl_xml(_mutate(to_msccl_xml(hpn_tree), drop_hasdep))


def test_checker_rejects_declaration_and_missing_attributes(hpn_tree) -> None:
    text = to_msccl_xml(hpn_tree)
    with pytest.raises(XmlRejected, match="no XML declaration"):
        check_msccl_xml('<?xml version="1.0"?>\n' + text)
    with pytest.raises(XmlRejected, match="lacks maxBytes"):
        check_msccl_xml(text.replace(' maxBytes="1099511627776"', "", 1))
