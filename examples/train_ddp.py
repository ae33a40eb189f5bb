"""DDP training on mccl: the script is a plain torch DDP script; only BACKEND says "mccl".

    torchrun --standalone --nproc-per-node 4 examples/train_ddp.py                 # on mccl
    torchrun --standalone --nproc-per-node 4 examples/train_ddp.py --backend gloo  # the same on gloo

Prints every 10th step's loss and, at the end, the final loss in full (bit-identical on
mccl and gloo), the median step time and which collectives ran an mccl schedule (the
mccl group's call log). Flags: ``--backend mccl|gloo``, ``--width``, ``--layers``, ``--steps``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
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


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (0 steps, width or layers would train nothing or divide by zero)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(description: str) -> argparse.Namespace:
    """The examples' flags; a usage error (exit 2) for a bad value or a run outside torchrun."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=BACKEND, choices=("mccl", "gloo"),
                        help="torch.distributed backend (default: %(default)s; gloo: the same run without mccl)")
    parser.add_argument("--width", type=positive_int, default=256, help="features per layer (default: %(default)s)")
    parser.add_argument("--layers", type=positive_int, default=4, help="linear layers (default: %(default)s)")
    parser.add_argument("--steps", type=positive_int, default=30, help="training steps (default: %(default)s)")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        parser.error("start it with torchrun, which gives every rank its place: "
                     "torchrun --standalone --nproc-per-node 4 " + parser.prog)
    return args


def report(rank: int, backend: str, loss: float, times: list[float]) -> None:
    """Rank 0's last lines: the final loss in full (compare it with the other backend's), the median
    step time and, on mccl, which path ran each call. Flushed: under torchrun stdout is a pipe, and lines
    still buffered are lost if the process is killed in teardown."""
    if rank == 0:
        print(f"final loss {loss!r}")
        print(f"{backend}: median step {statistics.median(times) * 1e3:.1f} ms over {len(times)} steps")
        if backend == "mccl":
            print("calls by (operation, path):", mb.communicator().calls.counts())
        sys.stdout.flush()


def main() -> None:
    args = parse_args(__doc__)
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
    report(rank, args.backend, loss, times)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
