"""One host, the bar's measurement (issue 16: ≤ 100 µs added per collective against in-process execution):
the tenant process of ``benchmarks/provider.py --single-host`` and the figures it reads.

Like for like. The in-process side is what ``mccl.init`` gives a rank: an mccl ``Communicator`` over a gloo
group of the tenant's own process (world 1, the agreement off) — the service runs the very same kind of
communicator for the job (world 1: it skips the agreement too, :mod:`mccl.provider.jobs`). Both calls are
synchronous (the tenant has the result when the call returns). Buffers: ``inproc`` runs on the tenant's
private tensors, ``inproc_shm`` on the very shared-memory buffers the ``provider`` call sends (the tenant's
own mapping of them), so the buffers' part of the difference shows on its own.

Variants, all in one tenant process, in a new random order every repetition (what ran just before decides
whether a thread and its caches are warm, so no variant may always follow the same one): ``inproc``,
``inproc_shm``, ``provider`` (the shim as shipped: each request spins for its reply or sleeps, whichever its own
recent calls measured cheaper, :mod:`mccl.provider.replyspin`), ``provider_spin`` (every call spins while no task
waits for a core: the fixed rule), ``provider_follow`` (as shipped, and the service's thread follows the tenant's
CPU, ``client.FOLLOW``: the sixth session's default), ``provider_plain`` (every call sleeps: the fifth session's
path), each on a session of its own, and the two traced copies of ``provider``
(wall stamps; CPU stamps) that give the stages, on a session of their own too; with ``floors``, the agreement,
the session socket and the two bare round trips. Each timed variant has threads of its own that nothing else
uses (a session: its service thread and its job's gloo thread; ``inproc`` and ``inproc_shm``: a gloo group each):
a thread used by two variants is warmer for both (measured: the fifth session's ``provider`` shared its session
with the traced copies and came out 16–56 µs faster than its twin (then ``provider_nospin``) on the same path, the
spin gated off, at load 30).

Enough repetitions to read 100 µs: ``blocks`` blocks, each ``calls(size)`` repetitions of every variant at
every size (the sizes take turns block by block, so a burst of load lands in one block of each size, not in
all of one). Per block the median of each variant; the figures are the median over blocks of the
per-block difference (provider − inproc) and its spread (the blocks' interquartile range).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time

from provider_ranks import KIB, MIB, OPS, _buffers, _calls, _echo, _interleave

BASELINES = ("inproc", "inproc_shm", "inproc_direct")
OFF = {"warm": "cold", "direct": "gloo"}
"""The label of each A/B's other side (``tenant``'s ``ab``)."""
PROVIDERS = ("provider", "provider_spin", "provider_follow", "provider_plain")
SETTINGS = {"provider": {}, "provider_spin": {"adaptive": False}, "provider_follow": {"follow": True},
            "provider_plain": {"spin_us": 0.0}}


def calls(size: int, scale: float = 1.0) -> int:
    """Repetitions per block: each block of a size takes about the same time."""
    return max(2, round(scale * (100 if size <= 64 * KIB else (50 if size <= MIB else 10))))


def tenant(endpoint: str, secret_hex: str, sizes: list[int], blocks: int, scale: float, floors: bool,
           results, gate_open: bool = False, ab: str | None = None) -> None:
    """The tenant process (module docstring); puts (times, block medians, stages, notes) on ``results``. ``ab``:
    every other block is the other side of a same-run A/B, its figures under ``<variant>:<OFF[ab]>`` (the others'
    under the variant's name): ``"warm"``, no session keeps the service's CPUs warm (:mod:`mccl.provider.keepwarm`;
    the shipped side); ``"direct"``, the sessions' one-host jobs run every collective on gloo (the path before
    :mod:`mccl.provider.direct`, which is shipped)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from mccl.control.auth import JobSecret
    from mccl.provider.keys import tenant_credential
    from mccl.provider.shim import Shim
    from mccl.runtime.communicator import Communicator
    from mccl.runtime.transport import Transport

    torch.set_num_threads(1)
    def world_one(name: str, check: bool = False) -> Communicator:  # what mccl.init gives a rank, on a group of its own
        group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=60))
        return Communicator(Transport(group, backend="gloo"), name=name, check=check)

    local = {False: world_one("inproc"), True: world_one("inproc_check", True), "shm": world_one("inproc_shm")}
    credential = tenant_credential(JobSecret.from_hex(secret_hex), "bench")
    shims = {name: Shim(endpoint, credential, **settings)
             for name, settings in {**SETTINGS, "provider_traced": SETTINGS["provider"]}.items()}
    if gate_open:  # every call may spin (or follow) whatever the load: the idle machine's gate, emulated
        for one in shims.values():
            one._gate.idle = lambda: True
    comms = {name: shim.join(f"single-{name}", [0]) for name, shim in shims.items()}
    shim = shims["provider_traced"]
    extra, close_floors = _floors(endpoint, credential, secret_hex, local) if floors else ({}, None)
    variants_at = {}
    for op in OPS:
        for size in sizes:
            mine = _buffers(op, size, 1, lambda count: torch.ones(count))
            shared = {name: _buffers(op, size, 1, one.empty) for name, one in shims.items()}
            for buffers in shared.values():
                for tensor in buffers:
                    tensor.fill_(1.0)
            variants = {"inproc": (_calls(local[False]), mine), "inproc_shm": (_calls(local["shm"]), shared["provider"]),
                        "inproc_direct": (_direct_calls(), mine),
                        **{name: (_calls(comms[name]), shared[name]) for name in PROVIDERS},
                        "provider_traced": (_calls(comms["provider_traced"]), shared["provider_traced"]),
                        "provider_cpu": (_calls(comms["provider_traced"]), shared["provider_traced"])}
            for name, (made, own) in extra.items():  # (own: the shim whose memory the variant's buffers are in)
                variants[name] = (made, mine if own is None else _buffers(op, size, 1, own.empty))
            variants_at[(op, size)] = variants
    times: dict = {}
    per_block: dict = {}
    stages: dict = {}
    for index in range(blocks):
        cold = ab is not None and index % 2 == 1
        if ab == "warm":
            for one in shims.values():
                one.keep_warm(not cold)
            if cold:
                time.sleep(0.2)  # (past keepwarm.ACTIVE_NS: the service's threads stop ticking)
        elif ab == "direct":
            for one in shims.values():
                one.direct(not cold)
        for (op, size), variants in variants_at.items():
            block: dict = {}
            _interleave(variants, shim, op, size, calls(size, scale), block, stages if not cold else {})
            for (variant, *rest), values in block.items():
                key = (f"{variant}:{OFF[ab]}" if cold else variant, *rest)
                times.setdefault(key, []).extend(values)
                per_block.setdefault(key, []).append(statistics.median(values))
    notes = {"spun": {name: (one._spin.spun, one._spin.slept, one._spin.explored)
                      for name, one in shims.items() if one._spin is not None},
             "followed": {name: one.followed for name, one in shims.items() if one._cpu is not None},
             "cpus": len(os.sched_getaffinity(0))}
    if close_floors is not None:
        close_floors()
    for one in shims.values():
        one.close()
    results.put((times, per_block, stages, notes))


def _direct_calls() -> dict:
    """``inproc_direct``: what the service's direct path runs (:mod:`mccl.provider.direct`), in the tenant's own
    process — the copy, or nothing for AllReduce: the in-process side of the same work."""
    return {"all_gather": lambda output, source: output.copy_(source), "all_reduce": lambda tensor: None}


def _floors(endpoint: str, credential, secret_hex: str, local: dict) -> tuple[dict, object]:
    """The fourth session's extra variants: the agreement, the session socket, the two bare round trips."""
    import zmq

    from mccl.provider.shim import Shim

    socket_shim = Shim(endpoint, credential, fast=False)
    remote_socket = socket_shim.join("single-socket", [0])
    context = mp.get_context("spawn")
    mine_end, echo_end = context.Pipe()
    echo = context.Process(target=_echo, args=(secret_hex, echo_end), daemon=True)
    echo.start()
    zmq_endpoint, request_path, reply_path = mine_end.recv()
    dealer = zmq.Context().socket(zmq.DEALER)
    credential.make_client(dealer)
    dealer.connect(zmq_endpoint)
    pipe_out, pipe_in = os.open(request_path, os.O_WRONLY), os.open(reply_path, os.O_RDONLY)
    mine_end.send("opened")
    message = b"x" * 100  # about a collective request's size

    def zmq_round_trip(*_: object) -> None:
        dealer.send(message)
        dealer.recv()

    def pipe_round_trip(*_: object) -> None:
        os.write(pipe_out, message)
        os.read(pipe_in, 4096)

    def close() -> None:
        os.close(pipe_out)
        os.close(pipe_in)
        dealer.close(linger=0)
        echo.join(timeout=10)
        socket_shim.close()

    return {"inproc_check": (_calls(local[True]), None), "provider_socket": (_calls(remote_socket), socket_shim),
            "zmq_floor": (dict.fromkeys(OPS, zmq_round_trip), None),
            "pipe_floor": (dict.fromkeys(OPS, pipe_round_trip), None)}, close


def quartiles(values: list[float]) -> tuple[float, float]:
    """The first and third quartiles (the median of a single value for both)."""
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def added(per_block: dict, variant: str, baseline: str, op: str, size: int) -> tuple[float, float, float]:
    """(median, q1, q3) over blocks of the per-block median difference variant − baseline, in µs."""
    differences = [(a - b) * 1e6 for a, b in zip(per_block[(variant, op, size)], per_block[(baseline, op, size)],
                                                 strict=True)]
    return (statistics.median(differences), *quartiles(differences))


def ratio(per_block: dict, variant: str, baseline: str, op: str, size: int) -> float:
    """The median over blocks of variant ÷ baseline (per-block medians): the same-run ratio."""
    return statistics.median(a / b for a, b in zip(per_block[(variant, op, size)], per_block[(baseline, op, size)],
                                                   strict=True))
