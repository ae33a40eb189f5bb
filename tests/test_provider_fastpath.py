"""The collective fast path (mccl.provider.channel): the same results and the same refusals as the session
socket, garbage on it answered or the channel closed (the socket still serving), cached reference checks that
never outlive an allocation, and the stage timestamps the benchmark reads."""

from __future__ import annotations

import os
import struct
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from conftest import provider_service  # noqa: E402
from mccl.provider import channel  # noqa: E402
from mccl.provider.client import ProviderClient  # noqa: E402
from mccl.provider.errors import BadReference, BadRequest, ProviderError  # noqa: E402
from mccl.provider.keys import tenant_credential  # noqa: E402
from mccl.provider.shim import Shim  # noqa: E402


@pytest.fixture(scope="module")
def service():
    with provider_service(job_timeout_s=10) as running:
        yield running


def _client(service, tenant: str, cls=ProviderClient, **kwargs):
    return cls(service.address, tenant_credential(service.test_secret, tenant), timeout_s=20, **kwargs)


def _raw(client: ProviderClient, frame: bytes) -> tuple[int, dict | None, list[int]]:
    """Write one frame on the client's fast path and read the one reply."""
    os.write(client._channel[0], frame)
    while True:
        frames = client._reader.read()
        assert frames is not None, "the service closed the channel"
        if frames:
            return channel.decode_reply(frames[0])
        assert client._poll.poll(10_000), "no reply on the fast path"


def test_fast_path_and_socket_give_the_same_results_and_trace_their_stages(service):
    fast, slow = _client(service, "alice", Shim), _client(service, "alice", Shim, fast=False)
    try:
        assert fast.fast and not slow.fast
        results = []
        for shim, job in ((fast, "fast"), (slow, "slow")):
            comm = shim.join(job, [0])
            x = shim.empty(8)
            x.copy_(torch.arange(8.0))
            out = shim.empty(8)
            comm.all_reduce(x, "max")
            comm.all_gather_into_tensor(out, x)
            staged = torch.zeros(8)  # outside shared memory: staged, on either path
            comm.reduce_scatter_tensor(staged, out)
            results.append(staged)
        assert torch.equal(results[0], results[1]) and torch.equal(results[0], torch.arange(8.0))
        fast.trace = []
        comm = fast.join("traced", [0])
        comm.all_reduce(fast.empty(4))
        fast.trace_cpu = True
        comm.all_reduce(fast.empty(4))
        untraced_cpu, stamps = fast.trace
        assert list(untraced_cpu) == sorted(untraced_cpu[:8]) + [0] * 7  # wall only unless asked
        wall, service_cpu = stamps[:8], stamps[9:14]
        assert list(wall) == sorted(wall)  # tenant sent .. service stages .. tenant got
        assert list(service_cpu) == sorted(service_cpu) and stamps.got_cpu > stamps.sent_cpu  # per-thread CPU
    finally:
        fast.close()
        slow.close()


def test_garbage_on_the_fast_path_is_refused_and_a_broken_framing_closes_only_the_channel(service):
    alice, bob = _client(service, "alice"), _client(service, "bob")
    try:
        joined = bob.join("garbage", [0])
        mine, theirs = bob.alloc(64), alice.alloc(64)
        good = channel.encode_request(7, joined.comm, "all_reduce", "float32", "sum", [[mine.alloc_id, 0, 64]])
        bad_kind = bytearray(good)
        bad_kind[4 + 12] = 99  # the kind code
        cases = [
            (bytes(bad_kind), BadRequest, "codes out of range"),
            (channel.encode_request(8, joined.comm, "all_reduce", "float32", "sum", [[theirs.alloc_id, 0, 64]]),
             BadReference, "not an allocation of tenant 'bob'"),
            (channel.encode_request(9, joined.comm, "all_reduce", "float32", "sum", [[mine.alloc_id, 32, 64]]),
             BadReference, "outside allocation"),
            (channel.encode_request(10, joined.comm, "all_reduce", "float32", "sum", [[2**64 - 1, 0, 4]]),
             BadReference, "outside 0..2^63-1"),
            (channel.encode_request(11, 999, "all_reduce", "float32", "sum", [[mine.alloc_id, 0, 4]]),
             BadRequest, "no communicator"),
            (struct.pack("<I", channel.REQUEST.size + 5) + good[4:4 + channel.REQUEST.size] + b"\0" * 5,
             BadRequest, "bytes, not"),
            (struct.pack("<I", 3) + b"abc", BadRequest, "at least"),
            # a request that names a CPU is checked the same
            (channel.encode_request(12, joined.comm, "all_reduce", "float32", "sum", [[theirs.alloc_id, 0, 64]],
                                    channel.FOLLOW, cpu=1), BadReference, "not an allocation of tenant 'bob'"),
        ]
        for frame, error, words in cases:
            _, reply, _ = _raw(bob, frame)
            assert reply is not None and reply["error"] == error.__name__ and words in reply["message"], (words, reply)
        assert _raw(bob, good) == (7, None, [])  # still serving
        for cpu in (1, 2, 1):  # the same request from any CPU runs (its cached check keyed without the CPU)
            assert _raw(bob, channel.encode_request(13, joined.comm, "all_reduce", "float32", "sum",
                                                    [[mine.alloc_id, 0, 64]], channel.FOLLOW, cpu=cpu)) == (13, None, [])
        os.write(bob._channel[0], struct.pack("<I", 2**32 - 1))  # no framing left: the service closes the channel
        with pytest.raises(ProviderError, match="closed this session's fast path"):
            bob.collective(joined, "all_reduce", "float32", [[mine.alloc_id, 0, 64]])
        assert not bob.fast
        bob.collective(joined, "all_reduce", "float32", [[mine.alloc_id, 0, 64]])  # on the session socket
    finally:
        alice.close()
        bob.close()


def test_a_cached_reference_check_never_outlives_its_allocation(service):
    owner, user = _client(service, "alice"), _client(service, "alice")  # two sessions of one tenant
    try:
        joined = user.join("cache", [0])
        shared, own = owner.alloc(64), user.alloc(64)
        for ref in ([shared.alloc_id, 0, 64], [own.alloc_id, 0, 64]):
            user.collective(joined, "all_reduce", "float32", [ref])  # checked, then cached
            user.collective(joined, "all_reduce", "float32", [ref])  # from the cache
        owner.free(shared)  # freed by the other session: the user's cached check must not survive it
        with pytest.raises(BadReference, match="not an allocation"):
            user.collective(joined, "all_reduce", "float32", [[shared.alloc_id, 0, 64]])
        user.free(own)
        with pytest.raises(BadReference, match="not an allocation"):
            user.collective(joined, "all_reduce", "float32", [[own.alloc_id, 0, 64]])
    finally:
        owner.close()
        user.close()


def test_a_spinning_shim_gets_the_same_results(service):
    spinning = _client(service, "alice", Shim, spin_us=200.0)
    try:
        assert spinning.spin_ns == 200_000
        spinning._gate.idle = lambda: True  # spin whatever the machine's load (the rule is tested below)
        comm = spinning.join("spin", [0])
        x = spinning.empty(8)
        x.copy_(torch.arange(8.0))
        out = spinning.empty(8)
        for _ in range(4):
            comm.all_gather_into_tensor(out, x)
            comm.all_reduce(x, "max")
        assert torch.equal(out, torch.arange(8.0))
        # each request alternated between the two ways, one duration recorded per call
        assert spinning._spin.spun == 4 and spinning._spin.slept == 4 and len(spinning._spin._ways) == 2
        assert all(len(ways.spin) == 2 and len(ways.sleep) == 2 for ways in spinning._spin._ways.values())
    finally:
        spinning.close()


def test_the_reply_wait_takes_the_way_measured_cheaper_and_sees_the_regime_change():
    from mccl.provider.replyspin import _EXPLORE, _EXPLORE_NS, _FIRST, MAX_SPIN_NS, ReplyWait

    read_end, write_end = os.pipe()
    try:
        busy = ReplyWait(200_000, read_end, idle=lambda: False)
        assert busy.choose("k", time.perf_counter_ns()) is None and busy.spun == busy.slept == 0  # sleeps, unrecorded

        wait = ReplyWait(200_000, read_end, idle=lambda: True)
        cost = {True: 100_000, False: 300_000}  # spinning cheaper: the idle machine's case

        def call() -> bool:
            spin = wait.choose("k", time.perf_counter_ns())
            wait.record("k", cost[spin], spin)
            return spin

        first = [call() for _ in range(2 * _FIRST)]
        assert first == [True, False] * _FIRST  # alternates until each way has its first durations
        every = wait._ways["k"].explore_every
        assert every == max(_EXPLORE, 200_000 // _EXPLORE_NS)  # explorations cost ≤ _EXPLORE_NS a call on average
        chosen = [call() for _ in range(3 * every)]
        assert chosen.count(False) == 3 and wait.explored == 3  # the other way once in `every` calls
        cost = {True: 500_000, False: 100_000}  # a core got busy: sleeping is cheaper now
        after = [call() for _ in range(2 * every)]
        flipped = after.index(False)
        assert flipped < every and after[flipped + 1:].count(True) <= 2  # seen at the next exploration

        wait.record("k", MAX_SPIN_NS + 1, True)  # a call longer than MAX_SPIN_NS never spins
        assert wait.choose("k", time.perf_counter_ns()) is False

        started = time.perf_counter_ns()  # a spin polls until the reply ...
        threading.Timer(0.02, os.write, (write_end, b"r")).start()
        wait.spin("new", started)
        assert os.read(read_end, 1) == b"r" and time.perf_counter_ns() - started < 10**9
        started = time.perf_counter_ns()  # ... or until its window past the expected duration
        wait.spin("new", started)
        assert 200_000 <= time.perf_counter_ns() - started < 10**8
    finally:
        os.close(read_end)
        os.close(write_end)


def _fast_threads() -> set[int]:
    """The native ids of the fast-path threads of the service fixture (it runs in this process)."""
    return {thread.native_id for thread in threading.enumerate() if thread.name.endswith("-fast")}


def test_the_service_thread_follows_its_tenant_to_a_cpu_and_only_to_the_services_own(service):
    allowed = os.sched_getaffinity(0)
    target = max(allowed)
    before = _fast_threads()
    follows = _client(service, "alice", Shim, follow=True)  # (off by default: client.FOLLOW)
    follows._gate.idle = lambda: True  # (it follows only while no task waits for a core: tested as if so)
    followers = _fast_threads() - before
    stays = _client(service, "bob", Shim, follow=False)
    stayers = _fast_threads() - before - followers
    try:
        assert len(followers) == 1 and len(stayers) == 1
        comm, other = follows.join("follow", [0]), stays.join("stay", [0])
        x, y = follows.empty(8), stays.empty(8)
        x.fill_(1.0)
        os.sched_setaffinity(0, {target})  # this (the calling) thread runs on one CPU now
        comm.all_reduce(x)
        other.all_reduce(y)
        assert [os.sched_getaffinity(tid) for tid in followers] == [{target}]  # moved to the tenant's CPU
        assert follows.followed == 1 and stays.followed == 0
        assert [os.sched_getaffinity(tid) for tid in stayers] == [allowed]  # a tenant that does not ask: unmoved
        # a CPU the service may not use sends the thread back to all of the service's CPUs; the call still runs
        frame = channel.encode_request(5, comm.joined.comm, "all_reduce", "float32", "sum", [follows.ref(x)],
                                       channel.FOLLOW, cpu=60_000)
        assert _raw(follows, frame)[1] is None
        assert [os.sched_getaffinity(tid) for tid in followers] == [allowed]
        comm.all_reduce(x)
        assert [os.sched_getaffinity(tid) for tid in followers] == [{target}]
        follows._gate.idle, follows._gate._sampled = (lambda: False), -10**18  # a loaded machine: no following
        comm.all_reduce(x)
        assert [os.sched_getaffinity(tid) for tid in followers] == [allowed]
        assert torch.equal(x, torch.ones(8))
    finally:
        os.sched_setaffinity(0, allowed)
        follows.close()
        stays.close()


def test_a_loops_repeated_call_is_resent_without_its_lookups_but_never_past_a_free_or_a_layout_change(service):
    shim = _client(service, "alice", Shim)
    try:
        comm = shim.join("resend", [0])
        x, out = shim.empty((4, 4)), shim.empty((4, 4))
        x.copy_(torch.arange(16.0).view(4, 4))
        looked_up = []
        find = shim.ref
        shim.ref = lambda tensor: looked_up.append(tensor) or find(tensor)
        for _ in range(3):
            comm.all_gather_into_tensor(out, x)
            comm.all_reduce(x, "max")
        assert len(looked_up) == 3  # the first call of each looked its tensors up; the repeats sent the cached frame
        assert torch.equal(out, x)
        # the same address, size and dtype but not contiguous: looked up again (staged), torch's result
        out.zero_()
        comm.all_gather_into_tensor(out.t(), x)
        assert torch.equal(out.t(), x) and len(looked_up) > 3
        # freed: the tensor is no longer in shared memory, so the call is staged, not sent with the freed id
        shim.free_tensor(x)
        assert not shim._sent
        comm.all_reduce(x, "max")
        assert torch.equal(x, torch.arange(16.0).view(4, 4))
    finally:
        shim.close()


def test_a_request_that_differs_from_a_cached_one_in_any_byte_is_checked_again(service):
    bob, alice = _client(service, "bob"), _client(service, "alice")
    try:
        joined = bob.join("rechecked", [0])
        mine, theirs = bob.alloc(64), alice.alloc(64)
        good = channel.encode_request(1, joined.comm, "all_reduce", "float32", "sum", [[mine.alloc_id, 0, 64]])
        assert _raw(bob, good) == (1, None, []) and _raw(bob, good) == (1, None, [])  # checked, then from the cache
        for at, value in ((len(good) - 24, theirs.alloc_id), (len(good) - 16, 32), (len(good) - 8, 128)):
            frame = bytearray(good)
            frame[at:at + 8] = struct.pack("<Q", value)  # the reference's id, offset or length
            _, reply, _ = _raw(bob, bytes(frame))
            assert reply is not None and reply["error"] == "BadReference", (at, reply)
        for garbage in (good + b"\0", good[:-1]):  # a cached request with a byte more or less
            _, reply, _ = _raw(bob, struct.pack("<I", len(garbage) - 4) + garbage[4:])
            assert reply is not None and reply["error"] == "BadRequest", reply
        assert _raw(bob, good) == (1, None, [])  # still serving
    finally:
        bob.close()
        alice.close()


def _thread_cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as handle:
        return int(handle.read().split()[0])


def _python_share(seconds: float) -> float:
    """CPU ÷ wall of this thread running Python for ``seconds`` (about 1 when no other thread holds the GIL)."""
    cpu, start = time.thread_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        sum(range(100))
    return (time.thread_time() - cpu) / (time.perf_counter() - start)


def test_the_service_thread_polls_for_the_next_request_within_its_window_then_sleeps():
    """ServiceConfig.poll_us: after each reply the session's thread polls its request pipe (on a CPU, without the
    GIL) for the window, then sleeps in read; the tenant's "poll" request turns it off and on; a loaded machine (a
    task waiting for a core) gets no polling; requests during and after the window get the same results."""
    from mccl.provider import pollwait

    with provider_service(job_timeout_s=10, poll_us=150_000) as polling:
        before = _fast_threads()
        shim = _client(polling, "alice", Shim)
        try:
            (thread,) = _fast_threads() - before
            fast = next(iter(polling._sessions.values())).fast
            assert fast.poll_ns == 150_000_000
            fast._gate.idle, fast._gate._sampled = (lambda: True), -10**18  # (it polls only while no task waits
            # for a core: tested as if so)
            deadline = time.monotonic() + 60
            while not pollwait.compiled() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pollwait.compiled()
            comm = shim.join("poll", [0])
            x, out = shim.empty(4), shim.empty(4)
            x.copy_(torch.arange(4.0))

            def idle_cpu_ms(seconds: float) -> float:
                """The fast-path thread's CPU while the tenant calls nothing for ``seconds``, after one call."""
                comm.all_gather_into_tensor(out, x)
                start = _thread_cpu_ns(thread)
                time.sleep(seconds)
                return (_thread_cpu_ns(thread) - start) / 1e6

            assert idle_cpu_ms(0.1) > 40  # polling through the idle 100 ms (inside the 150 ms window)
            shares = []  # (while polled, after the window): the best of 3 pairs, as another task on the machine can
            for _ in range(3):  # take a core from this thread in one; a Python loop holding the GIL: about half, always
                comm.all_gather_into_tensor(out, x)
                polled_share = _python_share(0.1)  # this process's Python runs while the thread polls: no GIL held
                time.sleep(0.1)  # past the window: asleep in read
                start = _thread_cpu_ns(thread)
                time.sleep(0.1)
                assert (_thread_cpu_ns(thread) - start) / 1e6 < 10
                shares.append((polled_share, _python_share(0.1)))
                if polled_share > 0.8 * shares[-1][1]:
                    break
            assert any(polled > 0.8 * after for polled, after in shares), shares
            shim.poll(False)
            assert fast.poll_ns == 0 and idle_cpu_ms(0.1) < 10
            shim.poll(True)
            fast._gate.idle, fast._gate._sampled = (lambda: False), -10**18  # a loaded machine: no polling
            assert idle_cpu_ms(0.1) < 10
            with pytest.raises(BadRequest):
                shim.request({"op": "poll", "on": "yes"})
            fast._gate.idle, fast._gate._sampled = (lambda: True), -10**18
            out.zero_()
            comm.all_gather_into_tensor(out, x)  # the thread polls now, and the session ends while it does
            assert torch.equal(out, torch.arange(4.0))
        finally:
            shim.close()
    assert not any(t.native_id == thread for t in threading.enumerate())  # stopped, even while polling


def test_a_poll_loop_that_cannot_compile_is_said_once_and_never_retried(monkeypatch, caplog):
    from mccl.provider import pollwait

    attempts = []

    def broken() -> None:
        attempts.append(1)
        raise OSError("no libc poll here")

    monkeypatch.setattr(pollwait, "_compiled", [])
    monkeypatch.setattr(pollwait, "_failed", [])
    monkeypatch.setattr(pollwait, "_compile", broken)
    with caplog.at_level("WARNING", logger="mccl.provider"):
        for _ in range(3):
            pollwait.compile_in_background()
            deadline = time.monotonic() + 10
            while not pollwait._failed and time.monotonic() < deadline:
                time.sleep(0.01)
            while pollwait._compiling.locked():
                time.sleep(0.01)
    assert len(attempts) == 1 and not pollwait.compiled()
    assert [record.getMessage() for record in caplog.records] == [
        "mccl provider: no polling for requests (could not compile the poll loop: OSError: no libc poll here)"]
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"x")
        assert pollwait.PipePoll(read_end).wait(10_000_000) is False  # not compiled: returns at once, no poll
    finally:
        os.close(read_end)
        os.close(write_end)
