"""FSDP2 (``fully_shard``) training on mccl: a plain FSDP2 script; only BACKEND says "mccl".

    torchrun --standalone --nproc-per-node 4 examples/train_fsdp2.py                 # on mccl
    torchrun --standalone --nproc-per-node 4 examples/train_fsdp2.py --backend gloo  # the same on gloo

FSDP2's parameter all-gathers (``all_gather_into_tensor``) and gradient reduce-scatters
(``reduce_scatter_tensor``, ReduceOp.AVG) run mccl's schedules; the end of the run prints
the call log that shows it.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from mccl_setup import direct_setup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from train_ddp import batch_for, mlp, parse_args, report, step

import mccl.runtime.backend as mb

BACKEND = "mccl"  # the one string a job changes ("gloo" / "nccl" before)


def build(group: dist.ProcessGroup | None, width: int, layers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = mlp(width, layers)
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def main() -> None:
    args = parse_args(__doc__)
    mb.register(direct_setup)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    model, optimizer = build(None, args.width, args.layers)
    batch = batch_for(rank, args.width)
    times = []
    for index in range(args.steps):
        start = time.perf_counter()
        loss = step(model, optimizer, batch)
        times.append(time.perf_counter() - start)
        if rank == 0 and index % 10 == 0:
            print(f"step {index}: loss {loss:.5f}")
    report(rank, args.backend, loss, times)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
