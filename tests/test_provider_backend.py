"""The "mccl_provider" torch.distributed backend: two tenants, each a 2-rank job on 2 emulated hosts (one
service process per host), every collective and a DDP step through the services, equal to gloo's."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue

import pytest

from mccl.control.auth import JobSecret, new_secret
from mccl.provider.keys import tenant_credential
from mccl.runtime.launch import free_port


def _rank(tenant: str, rank: int, endpoint: str, secret_hex: str, port: int, results) -> None:
    try:
        results.put((tenant, rank, _checks(tenant, rank, endpoint, secret_hex, port)))
    except BaseException as error:  # reported, not lost in a child's stderr
        import traceback

        results.put((tenant, rank, {"error": f"{error!r}\n{traceback.format_exc()}"}))
    results.close()
    results.join_thread()
    os._exit(0)  # the report is out: skip the interpreter's (and torch's) slow teardown


def _checks(tenant: str, rank: int, endpoint: str, secret_hex: str, port: int) -> dict:
    import torch
    import torch.distributed as dist

    from mccl.provider import backend as provider_backend
    from mccl.provider.shim import Shim

    torch.set_num_threads(1)
    shim = Shim(endpoint, tenant_credential(JobSecret.from_hex(secret_hex), tenant), timeout_s=120)
    provider_backend.register(shim)
    dist.init_process_group("mccl_provider", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    provider = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    generator = torch.Generator().manual_seed(rank + (100 if tenant == "tb" else 0))
    x = torch.randn(6, 4, generator=generator)
    ints = torch.randint(-50, 50, (8,), generator=generator)
    wrong = []

    def both(name: str, run) -> None:
        got = [run(group) for group in (provider, gloo)]
        if not all(torch.equal(a, b) for a, b in zip(*got, strict=True)):
            wrong.append(name)

    both("all_gather_into_tensor", lambda g: _out(lambda o: dist.all_gather_into_tensor(o, x, group=g),
                                                  torch.empty(12, 4)))
    both("all_gather (list)", lambda g: _gathered(x, g))
    both("reduce_scatter_tensor", lambda g: _out(lambda o: dist.reduce_scatter_tensor(o, x, group=g),
                                                 torch.empty(3, 4)))
    both("all_reduce", lambda g: _out(lambda o: dist.all_reduce(o, group=g), x.clone()))
    both("all_reduce max int64", lambda g: _out(lambda o: dist.all_reduce(o, dist.ReduceOp.MAX, group=g),
                                                ints.clone()))
    both("all_reduce bitwise and (delegated to gloo)",
         lambda g: _out(lambda o: dist.all_reduce(o, dist.ReduceOp.BAND, group=g), ints.clone()))
    both("all_to_all_single", lambda g: _out(lambda o: dist.all_to_all_single(o, x, group=g), torch.empty(6, 4)))
    both("broadcast from 1", lambda g: _out(lambda o: dist.broadcast(o, 1, group=g), x.clone()))
    dist.barrier(group=provider)
    both("DDP step", lambda g: _ddp_step(g, rank))
    served, delegated = dict(provider.served), dict(provider.delegated)
    dist.destroy_process_group()
    shim.close()
    return {"wrong": wrong, "served": served, "delegated": delegated}


def _out(call, tensor):
    call(tensor)
    return [tensor]


def _gathered(x, group):
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(2)]
    dist.all_gather(parts, x, group=group)
    return parts


def _ddp_step(group, rank: int):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    if rank == 1:  # differs until DDP broadcasts rank 0's parameters
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)
    ddp = DistributedDataParallel(model, process_group=group)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        optimizer.zero_grad()
        ddp(data).square().mean().backward()
        optimizer.step()
    return [parameter.detach().clone() for parameter in model.parameters()]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_tenants_torch_jobs_through_the_services_equal_gloo():
    pytest.importorskip("torch")
    from mccl.provider.launch import start_services

    secret = new_secret()
    context = mp.get_context("spawn")
    with start_services(2, secret, ["ta", "tb"], store_port=free_port()) as services:
        results = context.Queue()
        ports = {"ta": free_port(), "tb": free_port()}
        processes = [context.Process(target=_rank, args=(tenant, rank, services.endpoints[rank], secret.hex,
                                                         ports[tenant], results), daemon=True)
                     for tenant in ("ta", "tb") for rank in (0, 1)]
        for process in processes:
            process.start()
        found = {}
        try:
            for _ in processes:
                tenant, rank, report = results.get(timeout=400)
                found[(tenant, rank)] = report
        except queue.Empty:
            pytest.fail(f"tenant ranks did not report: {sorted(found)}")
        finally:
            for process in processes:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
    for key, report in sorted(found.items()):
        assert "error" not in report, (key, report.get("error"))
        assert report["wrong"] == [], (key, report["wrong"])
        served = report["served"]
        for op in ("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "all_reduce",
                   "all_to_all_single", "broadcast", "barrier"):
            assert served.get(op, 0) >= 1, (key, op, served)
        assert served["all_reduce"] >= 3 and served["broadcast"] >= 2  # DDP's gradients and its parameter broadcast
        assert report["delegated"] == {"all_reduce": 1}, (key, report["delegated"])  # the bitwise one only
