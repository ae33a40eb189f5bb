"""A one-host job's collectives run directly in the service's thread (mccl.provider.direct): results bit-equal to
the gloo path's and torch's for every kind, dtype and reduction; only what gloo has run once; buffers that overlap
in part left to gloo; a reference outside the tenant's allocation still refused; the A/B toggle."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import WORLD_ONE_DTYPES, dtype_values, provider_service  # noqa: E402
from mccl.provider.errors import BadReference, BadRequest, JobFailed  # noqa: E402
from mccl.provider.keys import tenant_credential  # noqa: E402
from mccl.provider.shim import Shim  # noqa: E402

DTYPES = tuple(getattr(torch, name) for name in WORLD_ONE_DTYPES)


@pytest.fixture(scope="module")
def service():
    with provider_service(job_timeout_s=10) as running:
        yield running


def _shim(service, tenant: str = "alice", **kwargs) -> Shim:
    return Shim(service.address, tenant_credential(service.test_secret, tenant), timeout_s=20, **kwargs)


def _join(service, shim: Shim, name: str):
    """The shim's communicator of a new one-host job ``name``, and the service's Job behind it."""
    comm = shim.join(name, [0])
    jobs = [job for session in list(service._sessions.values()) for job in session.jobs.values()
            if job.spec.name == name]
    assert len(jobs) == 1
    return comm, jobs[0]


def _run_all(shim: Shim, comm, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every kind and reduction twice (the first of each goes to gloo, the second may run directly)."""
    results = []
    reductions = ("sum", "prod", "min", "max") + (("avg",) if dtype.is_floating_point else ())
    for repeat in range(2):
        for kind in ("all_gather", "all_to_all", *(f"all_reduce/{r}" for r in reductions),
                     *(f"reduce_scatter/{r}" for r in reductions)):
            source, output = shim.empty(64, dtype), shim.empty(64, dtype)
            source.copy_(dtype_values(dtype, 64, repeat))
            output.fill_(7)
            expected = source.clone()
            name, _, reduce = kind.partition("/")
            if name == "all_gather":
                comm.all_gather_into_tensor(output, source)
            elif name == "all_to_all":
                comm.all_to_all_single(output, source)
            elif name == "reduce_scatter":
                comm.reduce_scatter_tensor(output, source, reduce)
            else:
                comm.all_reduce(source, reduce)
                output = source
            assert torch.equal(output, expected) and torch.equal(output.view(torch.uint8), expected.view(torch.uint8)), \
                (dtype, kind)  # one rank: torch's result is the input itself, bit for bit (-0.0 and inf included)
            results.append(output.clone())
            for tensor in {id(source): source, id(output): output}.values():
                shim.free_tensor(tensor)
    return results


def test_direct_collectives_equal_the_gloo_paths_and_torchs_bit_for_bit(service):
    direct, gloo = _shim(service), _shim(service)
    try:
        gloo.direct(False)
        for dtype in DTYPES:
            (on, on_job), (off, off_job) = _join(service, direct, f"d-{dtype}"), _join(service, gloo, f"g-{dtype}")
            assert on_job.direct and not off_job.direct
            ran = [_run_all(direct, on, dtype), _run_all(gloo, off, dtype)]
            assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(*ran, strict=True))
            calls = len(ran[0])
            assert on_job.direct_calls == calls // 2 and on_job.collectives == calls  # the second round, directly
            assert off_job.direct_calls == 0 and off_job.collectives == calls
            assert on_job.communicator.seq == calls // 2 and off_job.communicator.seq == calls  # gloo ran the rest
    finally:
        direct.close()
        gloo.close()


def test_a_kind_gloo_refuses_is_refused_as_before_and_a_partial_overlap_goes_to_gloo(service):
    shim = _shim(service)
    try:
        comm, job = _join(service, shim, "int16")
        x = shim.empty(8, torch.int16)
        for _ in range(2):  # gloo has no int16: it breaks the job's group on the first call, direct or not
            with pytest.raises(JobFailed):
                comm.all_reduce(x)
        comm, job = _join(service, shim, "overlap")
        buffer = shim.empty(48)
        buffer.copy_(torch.arange(48.0))
        whole, output, source = buffer[:32], buffer[:32], buffer[16:48]
        for _ in range(2):
            comm.all_gather_into_tensor(output, source)  # overlapping in part: gloo's copy, through its flat tensor
        expected = torch.arange(48.0)
        for _ in range(2):  # (the second call gathers what the first left there)
            expected[:32] = expected[16:48].clone()
        assert torch.equal(buffer, expected) and job.direct_calls == 0 and job.collectives == 2
        comm.all_gather_into_tensor(whole, whole)  # in place: already the result
        comm.all_gather_into_tensor(whole, whole)
        assert torch.equal(buffer, expected) and job.direct_calls == 2
    finally:
        shim.close()


def test_a_direct_job_still_refuses_a_reference_outside_the_tenants_memory(service):
    alice, bob = _shim(service), _shim(service, "bob")
    try:
        comm, job = _join(service, alice, "checked")
        mine, secret = alice.alloc(64), bob.alloc(64)
        bob._bytes[secret.alloc_id].fill_(9)
        joined = comm.joined
        alice.collective(joined, "all_gather", "float32", [[mine.alloc_id, 0, 32], [mine.alloc_id, 32, 32]])
        alice.collective(joined, "all_gather", "float32", [[mine.alloc_id, 0, 32], [mine.alloc_id, 32, 32]])
        assert job.direct_calls == 1
        for refs in ([[mine.alloc_id, 0, 32], [secret.alloc_id, 0, 32]],  # another tenant's allocation
                     [[mine.alloc_id, 48, 32], [mine.alloc_id, 0, 32]],  # past the end of its own
                     [[mine.alloc_id, 0, 32], [mine.alloc_id, 32, 16]]):  # sizes that disagree
            with pytest.raises((BadReference, BadRequest)):
                alice.collective(joined, "all_gather", "float32", refs)
        assert job.direct_calls == 1 and bool((bob._bytes[secret.alloc_id] == 9).all())
    finally:
        alice.close()
        bob.close()


def test_the_toggle_and_who_never_runs_directly(service):
    shim = _shim(service)
    try:
        comm, job = _join(service, shim, "toggle")
        x = shim.empty(16)
        comm.all_reduce(x)
        comm.all_reduce(x)
        shim.direct(False)
        comm.all_reduce(x)
        shim.direct(True)
        comm.all_reduce(x)
        assert job.direct_calls == 2 and job.collectives == 4
        with pytest.raises(BadRequest):
            shim.request({"op": "direct", "on": 1})
    finally:
        shim.close()
    with provider_service(strategy=_Nothing, job_timeout_s=10) as with_policy:
        shim = _shim(with_policy)
        comm = shim.join("policy", [0])
        x = shim.empty(16)
        comm.all_reduce(x)
        comm.all_reduce(x)
        job = next(iter(with_policy._sessions.values())).jobs[comm._comm]
        assert not job.can_direct and job.direct_calls == 0 and job.communicator.seq == 2
        shim.close()


class _Nothing:
    """A strategy that does nothing: its job's collectives stay on the communicator all the same."""

    def __init__(self, job) -> None:
        self.job = job

    def between(self, job, kind: str, nbytes: int) -> None:
        pass

    def closed(self, job) -> None:
        pass
