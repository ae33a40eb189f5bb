"""The eager driver learns of each completion as it happens (mccl.runtime.completions).

In-process, as the driver structure tests (test_runtime_drivers.py): a gloo-like transport whose receives
complete when the test says, so the order of arrivals is the test's. The multi-process tests
(test_runtime_collectives.py, test_runtime_peer_lost.py) run the same driver on real gloo ranks; the gain on a
real fabric is measured by ``benchmarks/netemu_candidates.py`` (BENCHMARKS.md, fourteenth session)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from mccl.runtime import executor  # noqa: E402
from mccl.runtime.completions import CompletionWaiters  # noqa: E402
from mccl.runtime.plan import build_plan  # noqa: E402
from mccl.synth import optimize  # noqa: E402
from mccl.synth.ring import naive_ring  # noqa: E402
from mccl.topology import rail_optimized, single_switch  # noqa: E402

WAIT_S = 5.0


class _Held:
    """A Work that completes when released (or at once); waited on once, as gloo's."""

    def __init__(self, done: bool = False, error: BaseException | None = None) -> None:
        self.event = threading.Event()
        self.error = error
        self.waits = 0
        if done:
            self.event.set()

    def wait(self) -> bool:
        self.waits += 1
        assert self.waits == 1, "a Work was waited on twice (gloo would block for good)"
        if not self.event.wait(WAIT_S * 4):
            raise RuntimeError("never released")
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:  # (gloo: False until waited on)
        return False


def _wait(work, peer) -> None:
    work.wait()


def test_a_waiter_reports_each_completion_when_it_happens_and_its_errors():
    pool = CompletionWaiters(_wait, limit=4)
    reports: queue.SimpleQueue = queue.SimpleQueue()
    late, failing = _Held(), _Held(error=RuntimeError("peer gone"))
    assert pool.submit(late, 1, 7, reports) and pool.submit(failing, 2, 8, reports)
    assert pool.threads == 2
    failing.event.set()
    index, began, ended, error = reports.get(timeout=WAIT_S)
    assert (index, str(error)) == (8, "peer gone") and began <= ended
    late.event.set()
    index, began, ended, error = reports.get(timeout=WAIT_S)
    assert (index, error) == (7, None) and began <= ended
    assert pool.submit(_Held(done=True), 1, 9, reports) and reports.get(timeout=WAIT_S)[0] == 9
    assert pool.threads == 2  # idle threads are reused
    pool.close()


def test_a_full_pool_refuses_rather_than_queue_a_work_nobody_waits_on():
    pool = CompletionWaiters(_wait, limit=2)
    reports: queue.SimpleQueue = queue.SimpleQueue()
    held = [_Held(), _Held()]
    assert all(pool.submit(work, 1, index, reports) for index, work in enumerate(held))
    assert not pool.submit(_Held(), 1, 2, reports)  # the driver then waits on it itself
    held[0].event.set()
    assert reports.get(timeout=WAIT_S)[0] == 0
    assert pool.submit(_Held(done=True), 1, 3, reports) and reports.get(timeout=WAIT_S)[0] == 3
    held[1].event.set()
    reports.get(timeout=WAIT_S)
    pool.close()
    assert not pool.submit(_Held(done=True), 1, 4, reports)
    with pytest.raises(ValueError, match="at least one thread"):
        CompletionWaiters(_wait, limit=0)


class _Scripted:
    """A gloo-like transport: sends complete at once, receives when the test releases them (:meth:`release`
    writes what the sender would have: the source rank, read from the output block the receive lands in).
    Every post is logged as (is_send, peer, where in the output it reads or writes)."""

    backend = "gloo"
    dependency_driven = True

    def __init__(self, size: int, rank: int, output: torch.Tensor, block: int) -> None:
        self.size, self.rank = size, rank
        self.output_at, self.block_bytes = output.data_ptr(), block * output.element_size()
        self.posts: list[tuple[bool, int, int]] = []
        self.receives: list[tuple[int, torch.Tensor, _Held]] = []  # (peer, tensor, work), in posting order
        self.posted = threading.Condition()
        self._waiters = CompletionWaiters(self.wait)

    def post(self, op) -> _Held:
        work = _Held(done=op.is_send)
        with self.posted:
            self.posts.append((op.is_send, op.peer, op.tensor.data_ptr()))
            if not op.is_send:
                self.receives.append((op.peer, op.tensor, work))
            self.posted.notify_all()
        return work

    def release(self, tensor: torch.Tensor, work: _Held) -> None:
        tensor.fill_(float((tensor.data_ptr() - self.output_at) // self.block_bytes))
        work.event.set()

    def wait(self, work, peer) -> None:
        work.wait()

    def waiting(self, peer):
        return contextlib.nullcontext()

    def waiters(self) -> CompletionWaiters:
        return self._waiters


def test_a_relay_forwards_a_chunk_that_arrived_while_an_earlier_receive_still_waits():
    """Rank 0 of a tree packing on a 2-host fabric relays chunks from two peers (ranks 2 and 3). One chunk from
    rank 3 arrives while every chunk from rank 2 is still on its way (a slow path): its forward must go out at
    once. The driver before the fourteenth session waited on the earliest posted receive (one from rank 2) and
    forwarded nothing meanwhile."""
    topology = rail_optimized(1, 2, 2)
    schedule = optimize(topology, "allgather", method="treepack").schedule
    rank, n, block = 0, schedule.n_ranks, 1 << 10
    plan = build_plan(schedule, rank)
    relayed = {d for op in plan.ops for d in op.deps}
    assert {op.peer for op in plan.ops if not op.is_send and op.index in relayed} == {2, 3}
    output, source = torch.zeros(block * n), torch.full((block,), float(rank))
    transport = _Scripted(n, rank, output, block)
    buffers = executor.all_gather_buffers(plan, output, source)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            executor.execute(transport, plan, buffers, seq=1, layout_cache={}, driver="eager")
        except BaseException as error:  # (reported to the test's thread)
            failure.append(error)

    caller = threading.Thread(target=run, daemon=True)
    caller.start()
    expected = sum(1 for op in plan.ops if not op.is_send)
    with transport.posted:
        assert transport.posted.wait_for(lambda: len(transport.receives) == expected, WAIT_S)
    peer, tensor, work = [item for item in transport.receives if item[0] == 3][-1]
    transport.release(tensor, work)
    forward = (True, 1, tensor.data_ptr())  # rank 0 relays to its host peer, from where it received
    with transport.posted:
        forwarded = transport.posted.wait_for(lambda: forward in transport.posts, WAIT_S)
    held = [item for item in transport.receives if item[0] == 2]
    assert not any(item[2].event.is_set() for item in held)
    for _peer, tensor, work in transport.receives:
        if not work.event.is_set():
            transport.release(tensor, work)
    caller.join(WAIT_S)
    assert not caller.is_alive() and not failure, failure
    assert forwarded, "a chunk from rank 3 was not forwarded while rank 2's chunks were still on their way"
    assert torch.equal(output, torch.arange(n, dtype=torch.float32).repeat_interleave(block))
    transport.waiters().close()


def test_a_ring_rank_waits_on_its_one_upstream_without_threads():
    """A ring's watched receives all come from one peer, in the order it sends them: no hand-over (its cost is
    a thread switch per completion, which nothing repays there)."""
    n, rank = 4, 1
    plan = build_plan(naive_ring(single_switch(n, 100), "allgather"), rank)
    output, source = torch.zeros(64 * n), torch.full((64,), float(rank))
    transport = _Scripted(n, rank, output, 64)
    buffers = executor.all_gather_buffers(plan, output, source)
    caller = threading.Thread(target=executor.execute, args=(transport, plan, buffers),
                              kwargs={"seq": 1, "layout_cache": {}, "driver": "eager"}, daemon=True)
    caller.start()
    released = 0
    while released < n - 1:
        with transport.posted:
            assert transport.posted.wait_for(lambda count=released: len(transport.receives) > count, WAIT_S)
        _peer, tensor, work = transport.receives[released]
        transport.release(tensor, work)
        released += 1
    caller.join(WAIT_S)
    assert not caller.is_alive()
    assert transport.waiters().threads == 0
    assert torch.equal(output, torch.arange(n, dtype=torch.float32).repeat_interleave(64))


class _AutoScripted(_Scripted):
    """As :class:`_Scripted`, but receives from every peer but ``held`` complete at once (their data written)."""

    def __init__(self, size: int, rank: int, output: torch.Tensor, block: int, held: int) -> None:
        super().__init__(size, rank, output, block)
        self.held = held

    def post(self, op) -> _Held:
        work = super().post(op)
        if not op.is_send and op.peer != self.held:
            work.event.set()
        return work


def _reachable(plan, held: int) -> set[int]:
    """The operations that can complete while every receive from ``held`` waits: their dependencies and the
    partial sums they wait on, transitively, avoid those receives."""
    ops = plan.ops
    blocked: set[int] = {op.index for op in ops if not op.is_send and op.peer == held}
    changed = True
    while changed:
        changed = False
        for op in ops:
            if op.index not in blocked and any(d in blocked for d in (*op.deps, *op.apply_deps)):
                blocked.add(op.index)
                changed = True
    return {op.index for op in ops} - blocked


@pytest.mark.parametrize("repeat", range(6))
def test_partial_sums_reported_while_the_driver_runs_are_added_in_before_it_blocks(repeat):
    """A reduce-scatter over three rings at once (several upstreams: the waiter threads report): while one peer's
    chunks are held back, every send that does not depend on them must go out — including those behind a
    partial sum whose report the driver took without blocking (a first version added such sums in only after
    the next report, which the peers could then never send: a hang, 1 in ~300 calls on real gloo)."""
    import numpy as np
    import torch.distributed as dist

    from mccl.synth.common import check_ranks
    from mccl.synth.ring import ring_schedule

    topology = rail_optimized(1, 2, 2)
    ranks = check_ranks(topology, None)
    rings = [list(np.random.default_rng(seed + repeat).permutation(len(ranks))) for seed in range(3)]
    schedule = ring_schedule(topology, "reducescatter", ranks, rings, chunks=2)
    rank, n, held = 0, schedule.n_ranks, 2
    plan = build_plan(schedule, rank)
    count = 8
    output, source = torch.zeros(count), torch.ones(count * n)
    transport = _AutoScripted(n, rank, torch.zeros(count * n), count, held)
    buffers = executor.reduce_scatter_buffers(plan, output, source, dist.ReduceOp.SUM)
    reachable = _reachable(plan, held)
    want = sum(1 for op in plan.ops if op.is_send and op.index in reachable)
    assert 0 < want < sum(1 for op in plan.ops if op.is_send)
    caller = threading.Thread(target=executor.execute, args=(transport, plan, buffers),
                              kwargs={"seq": 1, "layout_cache": {}, "driver": "eager"}, daemon=True)
    caller.start()

    def sent() -> int:
        return sum(1 for is_send, _peer, _at in transport.posts if is_send)

    with transport.posted:
        posted = transport.posted.wait_for(lambda: sent() >= want, WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while caller.is_alive() and time.monotonic() < deadline:  # (release the held receives, and any posted later)
        for _peer, _tensor, work in list(transport.receives):
            work.event.set()
        caller.join(0.05)
    assert not caller.is_alive()
    assert posted, f"{sent()} of the {want} sends that need nothing from rank {held} went out"
    assert transport.waiters().threads > 0  # (several upstreams: the reports path ran)
    transport.waiters().close()
