"""DDP, FSDP1 and FSDP2 train a small MLP with AdamW on "mccl" exactly as on "gloo" (2 and 4 ranks).

Each spawn trains the same model from the same seed, on the same per-rank batches,
once per wrapper on the gloo world group and once on a fresh "mccl" group, and returns
every step's loss, the final parameters and the mccl group's call counts. The tests
require bit-identical losses and parameters (``torch.equal``) and that the collectives
with an mccl schedule really ran it (FSDP2's all_gather_into_tensor and
reduce_scatter_tensor, DDP's all_reduce). ``init_process_group("mccl")`` — the
one-string change — is covered by :func:`test_init_process_group_mccl`.
"""

from __future__ import annotations

import warnings

import pytest

from mccl.runtime.launch import free_port, run_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

STEPS = 4


def schedules_for(rank, n):
    """The backend's ``setup``: a single switch, an AllGather, direct ReduceScatter and AllToAll (a
    direct ReduceScatter hands every contribution to its owner unsummed, so the owner adds them in
    gloo's order: :mod:`mccl.runtime.reduction_order`). The AllGather: on 4 ranks the examples' direct
    one (one gloo alltoallv per call, the exchange driver), on 2 a ring in two chunks."""
    from mccl.synth.direct import direct_allgather, direct_alltoall, direct_reducescatter
    from mccl.synth.ring import naive_ring
    from mccl.topology import single_switch

    topology = single_switch(n, 100)
    allgather = direct_allgather(topology) if n > 2 else naive_ring(topology, "allgather", chunks=2)
    return topology, [allgather, direct_reducescatter(topology), direct_alltoall(topology)]


def _mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def _batches(rank):
    import torch

    generator = torch.Generator().manual_seed(100 + rank)
    batch = (torch.randn(8, 16, generator=generator), torch.randn(8, 8, generator=generator))
    return [batch] * STEPS  # one batch again and again: the loss must fall, or nothing was learnt


def _train(kind, group, rank):
    """Losses of every step and the final full parameters of ``kind`` trained on ``group``."""
    import torch
    import torch.distributed as dist

    model = _mlp()
    if kind == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.001)
    elif kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped = FullyShardedDataParallel(model, process_group=group, device_id=torch.device("cpu"),
                                           use_orig_params=True)
    else:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    losses = []
    for inputs, targets in _batches(rank):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(wrapped(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(wrapped):
            params = [p.detach().clone() for p in wrapped.parameters()]
    elif kind == "fsdp2":
        params = [p.full_tensor().detach().clone() for p in wrapped.parameters()]
    else:
        params = [p.detach().clone() for p in wrapped.parameters()]
    dist.barrier(group=group)
    return torch.stack(losses), params


def _compare(rank, n, kinds):
    import torch
    import torch.distributed as dist

    import mccl.runtime.backend as mb

    warnings.filterwarnings("ignore")
    mb.register(schedules_for)
    report = {}
    for kind in kinds:
        gloo_losses, gloo_params = _train(kind, dist.group.WORLD, rank)
        group = dist.new_group(list(range(n)), backend="mccl")
        mccl_losses, mccl_params = _train(kind, group, rank)
        exact = torch.equal(gloo_losses, mccl_losses) and all(
            torch.equal(a, b) for a, b in zip(gloo_params, mccl_params, strict=True))
        worst = max(float((a - b).abs().max()) for a, b in zip(gloo_params, mccl_params, strict=True))
        report[kind] = (exact, worst, mccl_losses.tolist(), mb.communicator(group).calls.counts())
    return report


def _check(world):
    results = run_ranks(_compare, world, ("ddp", "fsdp1", "fsdp2"), timeout_s=280)
    for rank, report in enumerate(results):
        for kind, (exact, worst, losses, _counts) in report.items():
            print(f"{world} ranks, rank {rank}, {kind}: bit-identical {exact}, largest parameter difference {worst:.3g}")
            assert exact, f"rank {rank} {kind}: mccl differs from gloo by up to {worst:.3g} (losses {losses})"
            assert losses[-1] < losses[0], f"{kind} did not train: {losses}"
        ddp, fsdp1, fsdp2 = (report[kind][3] for kind in ("ddp", "fsdp1", "fsdp2"))
        assert ddp.get(("all_reduce", "schedule"), 0) >= STEPS, ddp
        assert fsdp2.get(("all_gather_into_tensor", "schedule"), 0) >= STEPS, fsdp2
        assert fsdp2.get(("reduce_scatter_tensor", "schedule"), 0) >= STEPS, fsdp2
        assert not [key for key in fsdp2 if key[1] == "delegated" and key[0] != "barrier"], fsdp2
        assert sum(count for (_op, path), count in fsdp1.items() if path == "schedule") >= STEPS, fsdp1


def test_ddp_fsdp1_fsdp2_bit_identical_to_gloo_2_ranks():
    _check(2)


def test_ddp_fsdp1_fsdp2_bit_identical_to_gloo_4_ranks():
    _check(4)


def _one_string(rank, n, port):
    """The default group itself is "mccl": destroy the launcher's gloo world, init "mccl", train DDP."""
    import torch
    import torch.distributed as dist

    import mccl.runtime.backend as mb

    warnings.filterwarnings("ignore")
    reference = _train("ddp", dist.group.WORLD, rank)
    dist.destroy_process_group()
    mb.register(schedules_for)
    dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    losses, params = _train("ddp", None, rank)
    exact = torch.equal(losses, reference[0]) and all(
        torch.equal(a, b) for a, b in zip(params, reference[1], strict=True))
    backend, communicator = dist.get_backend(), mb.communicator()
    dist.destroy_process_group()  # the group's shutdown stops the communicator's threads
    stopped = communicator._worker is None and (communicator._swapper is None or communicator._swapper._stop)
    return exact, backend, communicator.calls.counts(), stopped


def test_init_process_group_mccl():
    for exact, backend, counts, stopped in run_ranks(_one_string, 2, free_port(), timeout_s=200):
        assert exact and backend == "mccl" and stopped
        assert counts.get(("all_reduce", "schedule"), 0) >= STEPS, counts
