"""DDP training on mccl: the script is a plain torch DDP script; only BACKEND says "mccl".

    torchrun --standalone --nproc-per-node 4 examples/train_ddp.py                 # on mccl
    torchrun --standalone --nproc-per-node 4 examples/train_ddp.py --backend gloo  # the same on gloo

Prints every 10th step's loss and, at the end, the median step time and which
collectives ran an mccl schedule (the mccl group's call log).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from mccl_setup import direct_setup
from torch.nn.parallel import DistributedDataParallel

import mccl.runtime.backend as mb

BACKEND = "mccl"  # the one string a job changes ("gloo" / "nccl" before)


def mlp(width: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial model on every rank and every backend
    blocks: list[torch.nn.Module] = []
    for _ in range(layers - 1):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, width))


def build(group: dist.ProcessGroup | None, width: int, layers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = DistributedDataParallel(mlp(width, layers), process_group=group)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    inputs, targets = batch
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def batch_for(rank: int, width: int, rows: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    return torch.randn(rows, width, generator=generator), torch.randn(rows, width, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=BACKEND)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    mb.register(direct_setup)  # makes "mccl" known to torch.distributed; harmless for other backends
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
    if rank == 0:
        print(f"{args.backend}: median step {statistics.median(times) * 1e3:.1f} ms over {args.steps} steps")
        if args.backend == "mccl":
            print("calls by (operation, path):", mb.communicator().calls.counts())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
