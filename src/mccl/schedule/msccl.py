"""Lowering a Schedule to the MSCCL XML algorithm format (msccl-executor-nccl, RCCL's MSCCL).

Pure: a new string out, the schedule untouched. Copy collectives only (AllGather,
AllToAll); out-of-place (``inplace="0" outofplace="1"``).

Buffers in chunk units. A block (S/n bytes) is K units, K the least common
denominator of the chunk fractions; chunk c is ``cnt`` units at an offset inside
its block. AllGather: input ``i`` holds the rank's block (K units); output ``o``
holds every block, source s at ``s·K``; relays forward from ``o``. AllToAll: input
and output hold n blocks (block for/from rank r at ``r·K``); a relay keeps a chunk
in scratch ``s`` (one slot per relayed chunk).

Threadblocks and channels. Each directed connection (sender, receiver) gets its
transfers in schedule order (step, chunk), identical on both ends, so the FIFO
order of the connection matches. A send threadblock has one send peer and a receive
threadblock one receive peer; a connection's steps are cut into segments of at most
64 steps, and each segment goes to the lowest channel where the sender has fewer
than 32 send and the receiver fewer than 32 receive threadblocks and the
connection is not yet used: never two threadblocks of one GPU on the same
(peer, channel, direction). More than ``max_channels`` channels is an error.

Dependencies. A relay's send waits for the receive that brought the chunk (one
``depid/deps`` per step; a step with several dependencies puts the extra ones in
``nop`` steps before it, as MSCCL chains them); every depended-on step carries
``hasdep="1"``. Local copies (own block to output) sit in one peerless threadblock.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction
from xml.sax.saxutils import quoteattr

import numpy as np

from mccl.errors import InvalidSchedule
from mccl.schedule.ir import Collective, Schedule

__all__ = ["to_msccl_xml", "MAX_STEPS_PER_TB", "MAX_TBS_PER_CHANNEL", "MAX_CHANNELS", "MAX_COUNT"]

MAX_STEPS_PER_TB = 64  # MSCCL_MAX_NUM_STEPS
MAX_TBS_PER_CHANNEL = 32  # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL, per direction
MAX_CHANNELS = 32  # MAXCHANNELS
MAX_COUNT = 72  # MSCCL_MAX_COUNT: units one step may move


@dataclass
class _Step:
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    deps: list[tuple[int, int]]  # (tb, step index) this step waits for
    hasdep: bool = False


@dataclass
class _Tb:
    send: int
    recv: int
    chan: int
    steps: list[_Step]


def _units(schedule: Schedule) -> tuple[int, np.ndarray, np.ndarray]:
    """K units per block, and per chunk its offset inside the block and its count."""
    fractions = [Fraction(float(f)).limit_denominator(4096) for f in schedule.chunks.fraction]
    for value, exact in zip(fractions, schedule.chunks.fraction, strict=True):
        if abs(float(value) - exact) > 1e-9:
            raise InvalidSchedule(f"chunk fraction {exact} is not a ratio of small integers; MSCCL needs whole chunk units")
    k = 1
    for value in fractions:
        k = k * value.denominator // math.gcd(k, value.denominator)
    counts = np.array([int(value * k) for value in fractions], dtype=np.int64)
    offsets = np.zeros(len(counts), dtype=np.int64)
    blocks = schedule.block_of_chunks()
    filled: dict[int, int] = defaultdict(int)
    for chunk in range(len(counts)):
        offsets[chunk] = filled[int(blocks[chunk])]
        filled[int(blocks[chunk])] += int(counts[chunk])
    if counts.max() > MAX_COUNT:
        raise InvalidSchedule(f"a chunk is {counts.max()} units; MSCCL moves at most {MAX_COUNT} per step")
    return k, offsets, counts


def to_msccl_xml(schedule: Schedule, *, name: str | None = None, proto: str = "Simple",
                 min_bytes: int = 0, max_bytes: int = 2**40, max_channels: int = MAX_CHANNELS) -> str:
    """The MSCCL XML text of an AllGather or AllToAll schedule (see the module docstring)."""
    kind = schedule.collective
    if kind not in (Collective.ALLGATHER, Collective.ALLTOALL):
        raise InvalidSchedule(f"MSCCL export covers allgather and alltoall, not {kind.value}")
    n = schedule.n_ranks
    k, offset, count = _units(schedule)
    source, destination = schedule.chunks.source, schedule.chunks.destination
    transfers = schedule.transfers
    order = np.lexsort((np.arange(len(transfers)), transfers.chunk, transfers.step))
    scratch: dict[tuple[int, int], int] = {}  # (rank, chunk) -> scratch offset (AllToAll relays)
    s_chunks = [0] * n

    def home(rank: int, chunk: int) -> tuple[str, int]:
        """Where ``rank`` keeps ``chunk`` (its source sends from input)."""
        src = int(source[chunk])
        if rank == src:
            block = 0 if kind is Collective.ALLGATHER else int(destination[chunk])
            return "i", block * k + int(offset[chunk])
        if kind is Collective.ALLGATHER:
            return "o", src * k + int(offset[chunk])
        if rank == int(destination[chunk]):
            return "o", src * k + int(offset[chunk])
        if (rank, chunk) not in scratch:
            scratch[(rank, chunk)] = s_chunks[rank]
            s_chunks[rank] += int(count[chunk])
        return "s", scratch[(rank, chunk)]

    # Per connection, transfers in schedule order; segments of <= MAX_STEPS_PER_TB steps.
    connections: dict[tuple[int, int], list[int]] = defaultdict(list)
    for index in order.tolist():
        connections[(int(transfers.sender[index]), int(transfers.receiver[index]))].append(index)
    send_count = np.zeros((n, max_channels), dtype=np.int64)
    recv_count = np.zeros((n, max_channels), dtype=np.int64)
    gpu_tbs: list[list[_Tb]] = [[] for _ in range(n)]
    recv_at: dict[tuple[int, int], tuple[int, int]] = {}  # (rank, chunk) -> (tb, step) of its receive
    send_steps: list[tuple[int, int, int, int]] = []  # (rank, tb, step index, transfer)
    for (sender, receiver), indices in sorted(connections.items()):
        used = np.zeros(max_channels, dtype=bool)
        for start in range(0, len(indices), MAX_STEPS_PER_TB):
            segment = indices[start:start + MAX_STEPS_PER_TB]
            channel = _free_channel(send_count, recv_count, used, sender, receiver, max_channels)
            used[channel] = True
            send_count[sender, channel] += 1
            recv_count[receiver, channel] += 1
            send_tb = _Tb(send=receiver, recv=-1, chan=channel, steps=[])
            recv_tb = _Tb(send=-1, recv=sender, chan=channel, steps=[])
            gpu_tbs[sender].append(send_tb)
            gpu_tbs[receiver].append(recv_tb)
            for index in segment:
                chunk = int(transfers.chunk[index])
                src_buf, src_off = home(sender, chunk)
                dst_buf, dst_off = home(receiver, chunk)
                cnt = int(count[chunk])
                send_steps.append((sender, len(gpu_tbs[sender]) - 1, len(send_tb.steps), index))
                send_tb.steps.append(_Step("s", src_buf, src_off, dst_buf, dst_off, cnt, []))
                recv_at[(receiver, chunk)] = (len(gpu_tbs[receiver]) - 1, len(recv_tb.steps))
                recv_tb.steps.append(_Step("r", src_buf, src_off, dst_buf, dst_off, cnt, []))
    for rank, tb, step, index in send_steps:
        chunk = int(transfers.chunk[index])
        if rank != int(source[chunk]):
            gpu_tbs[rank][tb].steps[step].deps.append(recv_at[(rank, chunk)])
    _own_copies(schedule, gpu_tbs, k, offset, count)
    _place_nops(gpu_tbs)
    return _render(schedule, gpu_tbs, k, s_chunks, name, proto, min_bytes, max_bytes)


def _free_channel(send_count: np.ndarray, recv_count: np.ndarray, used: np.ndarray, sender: int, receiver: int,
                  limit: int) -> int:
    """Lowest channel where both ends have a free threadblock slot and this connection has no segment yet."""
    free = np.flatnonzero((send_count[sender] < MAX_TBS_PER_CHANNEL) & (recv_count[receiver] < MAX_TBS_PER_CHANNEL)
                          & ~used)
    if free.size == 0:
        raise InvalidSchedule(f"rank {sender} -> rank {receiver} needs more than {limit} channels of "
                              f"{MAX_TBS_PER_CHANNEL} threadblocks (at most {MAX_STEPS_PER_TB} steps each); "
                              "the schedule is too large for MSCCL")
    return int(free[0])


def _own_copies(schedule: Schedule, gpu_tbs: list[list[_Tb]], k: int, offset: np.ndarray, count: np.ndarray) -> None:
    """Each rank copies its own data from input to output (out-of-place), in one peerless threadblock."""
    source, destination = schedule.chunks.source, schedule.chunks.destination
    per_rank: dict[int, list[_Step]] = defaultdict(list)
    if schedule.collective is Collective.ALLGATHER:
        for chunk in range(len(source)):
            src = int(source[chunk])
            per_rank[src].append(_Step("cpy", "i", int(offset[chunk]), "o", src * k + int(offset[chunk]),
                                       int(count[chunk]), []))
    else:
        for rank in range(schedule.n_ranks):
            per_rank[rank].append(_Step("cpy", "i", rank * k, "o", rank * k, k, []))
        del destination
    for rank, steps in per_rank.items():
        for start in range(0, len(steps), MAX_STEPS_PER_TB):
            gpu_tbs[rank].append(_Tb(send=-1, recv=-1, chan=0, steps=steps[start:start + MAX_STEPS_PER_TB]))


def _place_nops(gpu_tbs: list[list[_Tb]]) -> None:
    """Extra dependencies into nop steps before their step; mark every depended-on step hasdep."""
    for tbs in gpu_tbs:
        for tb in tbs:
            if any(len(step.deps) > 1 for step in tb.steps):
                expanded: list[_Step] = []
                for step in tb.steps:
                    for extra in step.deps[:-1]:
                        expanded.append(_Step("nop", "i", 0, "i", 0, 0, [extra]))
                    expanded.append(_Step(step.type, step.srcbuf, step.srcoff, step.dstbuf, step.dstoff, step.cnt,
                                          step.deps[-1:]))
                if len(expanded) > MAX_STEPS_PER_TB:
                    raise InvalidSchedule(f"a threadblock needs {len(expanded)} steps with its nop dependencies; "
                                          f"MSCCL allows {MAX_STEPS_PER_TB}")
                tb.steps = expanded
    # Step indices of receives do not move: receive threadblocks carry no dependencies, so no nops.
    for tbs in gpu_tbs:
        for tb in tbs:
            for step in tb.steps:
                for dep_tb, dep_step in step.deps:
                    tbs[dep_tb].steps[dep_step].hasdep = True


def _render(schedule: Schedule, gpu_tbs: list[list[_Tb]], k: int, s_chunks: list[int], name: str | None,
            proto: str, min_bytes: int, max_bytes: int) -> str:
    n = schedule.n_ranks
    kind = schedule.collective
    channels = 1 + max((tb.chan for tbs in gpu_tbs for tb in tbs), default=0)
    i_chunks = k if kind is Collective.ALLGATHER else n * k
    label = name or f"mccl_{kind.value}_{schedule.meta.synthesizer}_v{schedule.meta.version}"
    lines = [f'<algo name={quoteattr(label)} proto="{proto}" nchannels="{channels}" nchunksperloop="{n * k}" '
             f'ngpus="{n}" coll="{kind.value}" inplace="0" outofplace="1" minBytes="{min_bytes}" maxBytes="{max_bytes}">']
    for rank, tbs in enumerate(gpu_tbs):
        lines.append(f'  <gpu id="{rank}" i_chunks="{i_chunks}" o_chunks="{n * k}" s_chunks="{s_chunks[rank]}">')
        for tb_id, tb in enumerate(tbs):
            lines.append(f'    <tb id="{tb_id}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">')
            for index, step in enumerate(tb.steps):
                dep_tb, dep_step = step.deps[0] if step.deps else (-1, -1)
                lines.append(f'      <step s="{index}" type="{step.type}" srcbuf="{step.srcbuf}" srcoff="{step.srcoff}" '
                             f'dstbuf="{step.dstbuf}" dstoff="{step.dstoff}" cnt="{step.cnt}" depid="{dep_tb}" '
                             f'deps="{dep_step}" hasdep="{int(step.hasdep)}"/>')
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"
