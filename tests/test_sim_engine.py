"""The flow-level engine on hand-checkable cases, and against the analytic model where it is tight."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import small_topologies
from mccl.errors import InvalidSchedule, MCCLError
from mccl.schedule import Chunks, Collective, Schedule, TransferList, validate
from mccl.sim import (
    BackgroundFlow,
    CapacityChange,
    CollectiveOp,
    ControlHook,
    Job,
    SimOptions,
    evaluate,
    gray_failure,
    simulate,
    simulate_schedule,
)
from mccl.sim.ecmp import EcmpPaths, PinnedPaths, ecmp_route, flow_key
from mccl.sim.inputs import path_links
from mccl.sim.results import Cause
from mccl.synth.direct import direct_alltoall
from mccl.synth.ring import naive_ring, ring_schedule
from mccl.topology import Router, single_switch, spine_leaf, switch_ring

GB = 1e9


def pair_allgather(fabric, a, b):
    """Two ranks swapping their blocks: one transfer each way."""
    return naive_ring(fabric, Collective.ALLGATHER, ranks=[a, b])


def test_one_transfer_takes_bytes_over_rate_plus_route_latency():
    fabric = single_switch(2, 100)  # 12.5 GB/s, 0.5 µs per link
    run = simulate_schedule(pair_allgather(fabric, "gpu0", "gpu1"), fabric, 2 * GB)
    assert run.time_s == pytest.approx(1 * GB / 12.5e9 + 1e-6, rel=1e-12)
    assert run.algbw_gbs == pytest.approx(2 / run.time_s)
    assert run.busbw_gbs == pytest.approx(run.algbw_gbs / 2)


def test_two_jobs_sharing_a_link_get_half_each():
    fabric = single_switch(3, 100)
    jobs = [Job.single(pair_allgather(fabric, "gpu0", "gpu2"), 2 * GB, name="a"),
            Job.single(pair_allgather(fabric, "gpu1", "gpu2"), 2 * GB, name="b")]
    result = simulate(fabric, jobs)
    for job in ("a", "b"):
        (run,) = result.runs_of(job)
        assert run.time_s == pytest.approx(1 * GB / 6.25e9 + 1e-6, rel=1e-9)  # sw0 -> gpu2 is shared
    link = fabric.link_between("sw0", "gpu2").id
    assert result.utilization.mean()[link] == pytest.approx(1.0, rel=1e-4)  # idle only for the last µs
    assert result.utilization.link_bytes[:, link].sum() == pytest.approx(2 * GB)


def test_capacity_change_mid_flow():
    fabric = single_switch(2, 100)
    link = fabric.link_between("gpu0", "sw0").id
    run = simulate_schedule(pair_allgather(fabric, "gpu0", "gpu1"), fabric, 2 * GB,
                            changes=[CapacityChange(0.04, link, 50.0)])
    # 0.5 GB by 0.04 s, the other 0.5 GB at 6.25 GB/s: 0.08 s more.
    assert run.time_s == pytest.approx(0.12 + 1e-6, rel=1e-9)


def test_gray_failure_that_starts_and_ends():
    fabric = single_switch(2, 100)
    changes = gray_failure(fabric, ("gpu0", "sw0"), start_s=0.02, end_s=0.04, factor=0.5)
    assert [(c.time_s, c.gbps) for c in changes] == [(0.02, 50.0), (0.04, 100.0)]
    ring = pair_allgather(fabric, "gpu0", "gpu1")
    run = simulate_schedule(ring, fabric, 2 * GB, changes=changes)
    # 0.25 GB by 0.02, 0.125 GB in the slow 20 ms, 0.625 GB at full speed: 0.05 s.
    assert run.time_s == pytest.approx(0.09 + 1e-6, rel=1e-9)
    assert run.critical_chain[-1].bottleneck_link in ring.transfers.route(0) + ring.transfers.route(1)


def test_utilization_follows_a_capacity_change():
    """The recorder integrates capacity only when it changes: its totals must still be
    capacity x time, piecewise, and the slowed link runs full while it is slow."""
    fabric = single_switch(2, 100)
    changes = gray_failure(fabric, ("gpu0", "sw0"), start_s=0.02, end_s=0.04, factor=0.5)
    link = changes[0].link
    result = simulate(fabric, [Job.single(pair_allgather(fabric, "gpu0", "gpu1"), 2 * GB)], changes=changes)
    end = result.end_s
    util = result.utilization
    assert util.capacity_bytes[:, link].sum() == pytest.approx(12.5e9 * (end - 0.02) + 6.25e9 * 0.02, rel=1e-9)
    other = fabric.link_between("sw0", "gpu0").id
    assert util.capacity_bytes[:, other].sum() == pytest.approx(12.5e9 * end, rel=1e-9)
    assert util.link_bytes[:, link].sum() == pytest.approx(1 * GB, rel=1e-9)
    slow = (util.edges_s[:-1] >= 0.02) & (util.edges_s[1:] <= 0.04)
    assert slow.any() and np.all(util.utilization()[slow, link] == pytest.approx(1.0, rel=1e-9))


def test_tiny_message_is_latency_only_alpha_beta():
    fabric = single_switch(4, 100)
    for collective, steps in ((Collective.ALLGATHER, 3), (Collective.ALLREDUCE, 6)):
        ring = naive_ring(fabric, collective)
        run = simulate_schedule(ring, fabric, 4)  # 1 byte per block
        # every step: 2 links of 0.5 µs, plus 1 byte at 12.5 GB/s
        assert run.time_s == pytest.approx(steps * (1e-6 + 1 / 12.5e9), rel=1e-9)
        assert run.time_s == pytest.approx(evaluate(ring, fabric, 4).time_s, rel=1e-3)
        assert len(run.critical_chain) == steps


@pytest.mark.parametrize("collective", list(Collective))
def test_agrees_with_the_analytic_model_where_it_is_tight(collective):
    fabric = single_switch(8, 100)
    size = 8 * GB  # latency negligible
    if collective is Collective.ALLTOALL:
        schedules = [direct_alltoall(fabric), direct_alltoall(fabric, chunks=4)]  # the all-pairs exchange
    else:
        schedules = [naive_ring(fabric, collective), naive_ring(fabric, collective, chunks=4)]
    if collective is Collective.ALLGATHER:
        schedules.append(star_allgather(fabric))  # a depth-1 tree per source
    for schedule in schedules:
        validate(schedule, fabric)
        run = simulate_schedule(schedule, fabric, size)
        assert run.time_s == pytest.approx(evaluate(schedule, fabric, size).time_s, rel=0.01)


def star_allgather(fabric):
    """Every source sends its block straight to every rank: one star tree per source."""
    n = len(fabric.gpus)
    router = Router(fabric)
    transfers = TransferList()
    for source in range(n):
        for rank in range(n):
            if rank != source:
                transfers.add(source, source, rank, 0, router.route(f"gpu{source}", f"gpu{rank}"))
    return Schedule(Collective.ALLGATHER, fabric.gpus, Chunks(list(range(n)), [-1] * n, [1.0] * n), transfers.freeze())


def test_chunks_on_one_path_are_streams_of_their_own_and_slices_pipeline_them():
    """One source's 4 chunks relayed gpu0 -> gpu1 -> gpu2 -> gpu3. Every chunk is its own stream on a
    hop (as the executor posts it), so the 4 chunks share each link like racing flows, and all four
    reach gpu3 together; cut into slices they pipeline, which is faster."""
    fabric = single_switch(4, 100)
    router = Router(fabric)
    k, n = 4, 4
    transfers = TransferList()
    sources, fractions = [], []
    for source in range(n):
        for _piece in range(k):
            chunk = len(sources)
            sources.append(source)
            fractions.append(1 / k)
            path = [source] + [r for r in range(n) if r != source]
            for step, (a, b) in enumerate(zip(path, path[1:], strict=False)):
                if source == 0:  # only source 0 is a chain; the others are stars on idle links
                    transfers.add(chunk, a, b, step, router.route(f"gpu{a}", f"gpu{b}"))
            if source != 0:
                for rank in range(n):
                    if rank != source:
                        transfers.add(chunk, source, rank, 0, router.route(f"gpu{source}", f"gpu{rank}"))
    schedule = Schedule(Collective.ALLGATHER, fabric.gpus, Chunks(sources, [-1] * len(sources), fractions),
                        transfers.freeze())
    validate(schedule, fabric)
    size = 4e6  # block 1 MB, chunk 0.25 MB: 20 µs at 12.5 GB/s
    alone = simulate(fabric, [Job.single(schedule, size)], options=SimOptions(keep_chain=True)).only()
    chain = [step for step in alone.critical_chain if step.chunk < k]
    assert chain, "the chain of source 0 is critical"
    racing = simulate(fabric, [Job.single(schedule, size)], options=SimOptions(serialize_connections=False)).only()
    assert alone.time_s == pytest.approx(racing.time_s, rel=1e-9)  # a stream per chunk: they do race
    sliced = simulate(fabric, [Job.single(schedule, size)], options=SimOptions(slices=4)).only()
    assert sliced.time_s < 0.9 * alone.time_s

def test_ecmp_collision_versus_pinned_paths_on_two_spines():
    fabric = spine_leaf(2, 2, 1, 2, 100, 100)  # gpu0, gpu1 under leaf0; gpu2, gpu3 under leaf1
    a = pair_allgather(fabric, "gpu0", "gpu2")
    b = pair_allgather(fabric, "gpu1", "gpu3")
    router = Router(fabric)

    def spine(job, src, dst, salt):
        route = ecmp_route(fabric, src, dst, flow_key(job, src, dst, salt), router)
        return fabric.links[route[1]].dst

    # CRC32 is linear: keys of equal length differing only in the salt keep their XOR, so
    # the two jobs get salts of their own (as two tenants' source ports differ).
    pairs = [(str(i), str(j)) for i in range(8) for j in range(8)]

    def same(sa, sb):
        return (spine("a", "gpu0", "gpu2", sa) == spine("b", "gpu1", "gpu3", sb),
                spine("a", "gpu2", "gpu0", sa) == spine("b", "gpu3", "gpu1", sb))

    colliding = next(p for p in pairs if same(*p) == (True, True))
    apart = next(p for p in pairs if same(*p) == (False, False))
    alone = 1 * GB / 12.5e9 + 4 * 0.5e-6

    def times(policy_a, policy_b):
        result = simulate(fabric, [Job.single(a, 2 * GB, name="a", paths=policy_a),
                                   Job.single(b, 2 * GB, name="b", paths=policy_b)])
        return [result.runs_of(job)[0].time_s for job in ("a", "b")]

    assert times(EcmpPaths(colliding[0]), EcmpPaths(colliding[1])) == pytest.approx([2 * alone - 4 * 0.5e-6] * 2,
                                                                                   rel=1e-6)
    assert times(EcmpPaths(apart[0]), EcmpPaths(apart[1])) == pytest.approx([alone] * 2, rel=1e-6)
    via = {spine_name: {pair: router.routes(*pair) for pair in [("gpu0", "gpu2"), ("gpu2", "gpu0"),
                                                                 ("gpu1", "gpu3"), ("gpu3", "gpu1")]}
           for spine_name in ("spine0", "spine1")}
    pinned = {name: {pair: next(r for r in routes if fabric.links[r[1]].dst == name or fabric.links[r[1]].src == name)
                     for pair, routes in table.items()} for name, table in via.items()}
    policy_a = PinnedPaths.of({p: r for p, r in pinned["spine0"].items() if p[0] in ("gpu0", "gpu2")})
    policy_b = PinnedPaths.of({p: r for p, r in pinned["spine1"].items() if p[0] in ("gpu1", "gpu3")})
    assert times(policy_a, policy_b) == pytest.approx([alone] * 2, rel=1e-6)
    with pytest.raises(MCCLError, match="never uses"):
        times(policy_b, policy_b)


def test_background_flows_constant_and_greedy():
    fabric = single_switch(2, 100)
    ring = pair_allgather(fabric, "gpu0", "gpu1")
    route = path_links(fabric, ["sw0", "gpu1"])
    constant = simulate_schedule(ring, fabric, 2 * GB, background=[BackgroundFlow("udp", route, rate_gbps=75)])
    assert constant.time_s == pytest.approx(1 * GB / (25 / 8 * 1e9) + 1e-6, rel=1e-9)  # 25 Gbit/s left
    greedy = simulate_schedule(ring, fabric, 2 * GB, background=[BackgroundFlow("tcp", route)])
    assert greedy.time_s == pytest.approx(1 * GB / 6.25e9 + 1e-6, rel=1e-9)  # max-min: half
    late = simulate_schedule(ring, fabric, 2 * GB, background=[BackgroundFlow("tcp", route, start_s=0.04, end_s=0.06)])
    # 0.5 GB by 0.04, 0.125 GB shared for 20 ms, 0.375 GB alone: 0.03 s
    assert late.time_s == pytest.approx(0.09 + 1e-6, rel=1e-9)


def test_critical_chain_of_a_ring():
    fabric = single_switch(4, 100)
    run = simulate_schedule(naive_ring(fabric, Collective.ALLGATHER), fabric, 4 * GB)
    chain = run.critical_chain
    assert len(chain) == 3 and [step.step for step in chain] == [0, 1, 2]
    assert chain[0].cause is Cause.LAUNCH and all(step.cause is Cause.CHUNK for step in chain[1:])
    assert all(later.start_s == pytest.approx(earlier.arrive_s) for earlier, later in zip(chain, chain[1:], strict=False))
    assert chain[-1].arrive_s == pytest.approx(run.time_s)
    assert sum(run.chain_links().values()) == pytest.approx(3 * 1 * GB / 12.5e9)


def test_closed_loop_hook_reads_paths_and_swaps_the_ring():
    """MCCS §3.3 in miniature: background on a clockwise link, the hook reverses the ring."""
    fabric = switch_ring(4, 1, 2, 100)
    ranks = fabric.gpus
    clockwise = naive_ring(fabric, Collective.ALLREDUCE)
    counter = ring_schedule(fabric, Collective.ALLREDUCE, ranks, [list(reversed(range(8)))])
    loaded = path_links(fabric, ["sw0", "sw1"])
    seen = []

    def controller(view):
        slow = [s for s in view.samples if loaded[0] in s.route]
        seen.append((view.time_s, [s.gbps for s in slow]))
        if view.time_s >= 0.2 and view.schedule("train", "allreduce") is clockwise:
            view.swap("train", "allreduce", counter)

    job = Job("train", (CollectiveOp(clockwise, 64 * 2**20),), iterations=30)
    result = simulate(fabric, [job], background=[BackgroundFlow("bg", loaded, rate_gbps=75, start_s=0.05)],
                      hook=ControlHook(0.05, controller))
    runs = result.runs_of("train")
    first, worst, last = runs[0].algbw_gbs, min(r.algbw_gbs for r in runs), runs[-1].algbw_gbs
    assert first == pytest.approx(12.5 / (2 * 7 / 8), rel=0.01)  # 7.14 GB/s on 100 Gbit/s links
    assert worst == pytest.approx(25 / 8 / (2 * 7 / 8), rel=0.02)  # 25 Gbit/s left: 1.79 GB/s
    assert last == pytest.approx(first, rel=1e-6)
    assert runs[0].schedule == "ring.naive" and runs[-1].schedule == "ring"  # the swap took effect
    before = [rates for t, rates in seen if 0.0 < t <= 0.05 and rates]
    during = [rates for t, rates in seen if 0.1 <= t <= 0.2 and rates]
    assert before and max(before[0]) == pytest.approx(100, rel=0.01)
    assert during and max(during[0]) == pytest.approx(25, rel=0.01)


def test_swap_must_keep_collective_and_ranks():
    fabric = single_switch(4, 100)
    ring = naive_ring(fabric, Collective.ALLGATHER)

    def controller(view):
        view.swap("job", "allgather", naive_ring(fabric, Collective.ALLREDUCE))

    with pytest.raises(MCCLError, match="keeps the collective"):
        simulate(fabric, [Job("job", (CollectiveOp(ring, 1e6),), iterations=50)], hook=ControlHook(1e-6, controller))


def test_a_sender_that_never_holds_its_chunk_is_rejected():
    fabric = single_switch(3, 100)
    router = Router(fabric)
    transfers = TransferList()
    transfers.add(0, 1, 2, 0, router.route("gpu1", "gpu2"))  # gpu1 forwards chunk 0 it never got
    bad = Schedule(Collective.ALLGATHER, fabric.gpus, Chunks([0], [-1], [1.0]), transfers.freeze())
    with pytest.raises(InvalidSchedule, match="never receives it"):
        simulate_schedule(bad, fabric, 3e6)


def test_bad_inputs_name_the_problem():
    fabric = single_switch(2, 100)
    ring = pair_allgather(fabric, "gpu0", "gpu1")
    with pytest.raises(MCCLError, match="size must be positive"):
        CollectiveOp(ring, 0)
    with pytest.raises(MCCLError, match="capacity must be positive"):
        CapacityChange(0.0, 0, 0.0)
    with pytest.raises(MCCLError, match="link 99"):
        simulate_schedule(ring, fabric, 1e6, changes=[CapacityChange(0.0, 99, 1.0)])
    with pytest.raises(MCCLError, match="job names must differ"):
        simulate(fabric, [Job.single(ring, 1e6), Job.single(ring, 1e6)])
    with pytest.raises(MCCLError, match="end after it starts"):
        gray_failure(fabric, 0, start_s=1.0, end_s=0.5, factor=0.5)


def test_jobs_run_iterations_with_gaps():
    fabric = single_switch(2, 100)
    ring = pair_allgather(fabric, "gpu0", "gpu1")
    result = simulate(fabric, [Job("loop", (CollectiveOp(ring, 2 * GB),), iterations=3, start_s=0.5, gap_s=0.1)])
    starts = [run.start_s for run in result.runs]
    one = 1 * GB / 12.5e9 + 1e-6
    assert starts == pytest.approx([0.5, 0.5 + one + 0.1, 0.5 + 2 * (one + 0.1)])
    assert [run.iteration for run in result.runs] == [0, 1, 2]
    assert result.stats.events > 0 and result.stats.batches > 0
    assert np.isclose(result.end_s, 0.5 + 3 * one + 0.2)


@settings(max_examples=25, deadline=None)
@given(small_topologies(), st.sampled_from(list(Collective)), st.integers(1, 3))
def test_random_fabrics_respect_bounds_and_conserve_bytes(fabric, collective, chunks):
    """No schedule finishes faster than its busiest link allows; every byte sent is counted once."""
    try:
        schedule = (direct_alltoall(fabric, chunks=chunks) if collective is Collective.ALLTOALL
                    else naive_ring(fabric, collective, chunks=chunks))
    except MCCLError:
        return  # the fabric cannot carry this schedule (a hop needs a GPU relay)
    size = 1e6 * schedule.n_ranks
    result = simulate(fabric, [Job.single(schedule, size)])
    run = result.only()
    analytic = evaluate(schedule, fabric, size)
    assert run.time_s >= analytic.bandwidth_time_s * (1 - 1e-9)
    assert result.utilization.link_bytes.sum(axis=0) == pytest.approx(analytic.link_bytes, rel=1e-6, abs=1e-3)
    assert np.all(result.utilization.utilization() <= 1 + 1e-9)
    assert run.critical_chain[-1].arrive_s == pytest.approx(run.time_s)


def test_slices_pipeline_a_relayed_chunk():
    """A 3-level relay chain: slices let each hop forward while the next slice arrives."""
    fabric = single_switch(4, 100)
    router = Router(fabric)
    transfers = TransferList()
    for source in range(4):
        path = [source] + [r for r in range(4) if r != source]  # source -> a -> b -> c, one chunk each
        for step, (a, b) in enumerate(zip(path, path[1:], strict=False)):
            transfers.add(source, a, b, step, router.route(f"gpu{a}", f"gpu{b}"))
    schedule = Schedule(Collective.ALLGATHER, fabric.gpus, Chunks(list(range(4)), [-1] * 4, [1.0] * 4),
                        transfers.freeze())
    validate(schedule, fabric)
    size = 4e9
    bound = evaluate(schedule, fabric, size).bandwidth_time_s
    whole = simulate_schedule(schedule, fabric, size)
    sliced = simulate_schedule(schedule, fabric, size, options=SimOptions(slices=8))
    assert bound <= sliced.time_s < whole.time_s
    assert sliced.time_s == pytest.approx(bound, rel=0.1)  # near perfect pipelining: fill and drain cost ~1/T
    assert {step.chunk for step in sliced.critical_chain} <= set(range(4))  # reported in schedule chunk ids
    with pytest.raises(MCCLError, match="slices"):
        SimOptions(slices=0)


def test_every_chunk_is_a_stream_of_its_own_on_every_hop():
    """Two identical trees of one source are two streams (two link shares), not one: the executor posts
    every chunk's transfer on its own (mccl.sim.compiled)."""
    from mccl.sim.compiled import compile_schedule
    from mccl.sim.ecmp import AS_SCHEDULED, routes_for
    from mccl.synth.treepack import synthesize
    from mccl.topology import rail_optimized

    fabric = rail_optimized(1, 2, 8)
    schedule = synthesize(fabric).schedule
    sources = schedule.chunks.source
    assert len(np.unique(sources)) < len(sources)  # several trees per source
    offsets, links = routes_for(schedule, fabric, AS_SCHEDULED, "job")
    for slices in (1, 3):
        compiled = compile_schedule(schedule, fabric, offsets, links, slices=slices)
        assert compiled.n_connections == len(schedule.transfers)
        per_connection = np.bincount(compiled.connection)
        assert (per_connection == slices).all()  # a connection moves one chunk's slices on one hop


def test_executor_options_slice_by_size():
    from mccl.schedule.slicing import MAX_SLICES, SLICE_BYTES
    from mccl.synth.ring import nccl_ring
    from mccl.topology import rail_optimized

    fabric = rail_optimized(1, 2, 8)
    ring = nccl_ring(fabric, "allgather")  # 8 channels: a chunk is 1/8 of a block
    options = SimOptions.executor()
    assert options.step_priority == 1.0 and options.slice_bytes == SLICE_BYTES
    assert options.slices_for(ring, 16 * 8 * SLICE_BYTES) == 1
    assert options.slices_for(ring, 16 * 8 * SLICE_BYTES * 3) == 3
    assert options.slices_for(ring, 2**40) == MAX_SLICES
    assert SimOptions(slices=5).slices_for(ring, 2**40) == 5
    with pytest.raises(MCCLError, match="slice_bytes"):
        SimOptions(slice_bytes=0)
