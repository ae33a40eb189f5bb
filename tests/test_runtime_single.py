"""A world-1 gloo communicator runs its collectives as the copies they are (mccl.runtime.single): results
bit-equal to gloo's and torch's for every kind, dtype and reduction; only what gloo has run once; calls whose
shapes or dtypes gloo would refuse still go to gloo and fail there; the provider's A/B toggle turns it off."""

from __future__ import annotations

from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from conftest import WORLD_ONE_DTYPES, dtype_values  # noqa: E402
from mccl.errors import MCCLError  # noqa: E402
from mccl.runtime.communicator import Communicator  # noqa: E402
from mccl.runtime.single import copy_collective  # noqa: E402
from mccl.runtime.transport import Transport  # noqa: E402

DTYPES = tuple(getattr(torch, name) for name in WORLD_ONE_DTYPES)
REDUCTIONS = (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX)


def _communicator(copies: bool = True) -> Communicator:
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=20))
    comm = Communicator(Transport(group, backend="gloo"), name="one")
    if not copies:
        comm.transport.world_of_one = None
    return comm


def _every_call(comm: Communicator, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """Every kind and reduction once, on fresh inputs; the outputs (written over a fill of 7)."""
    results = []
    calls = [("all_gather", lambda out, src: comm.all_gather_into_tensor(out, src)),
             ("all_to_all", lambda out, src: comm.all_to_all_single(out, src)),
             ("all_to_all splits", lambda out, src: comm.all_to_all_single(out, src, [8], [8]))]
    calls += [(f"reduce_scatter {op}", lambda out, src, op=op: comm.reduce_scatter_tensor(out, src, op))
              for op in REDUCTIONS]
    for _name, call in calls:
        source, output = dtype_values(dtype, 64, seed).reshape(8, 8), torch.full((8, 8), 7).to(dtype)
        call(output, source)
        results.append(output)
    for op in REDUCTIONS:
        tensor = dtype_values(dtype, 64, seed)
        comm.all_reduce(tensor, op)
        results.append(tensor)
    return results


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_world_one_copies_are_bit_equal_to_gloo_and_torch(dtype):
    copies, gloo = _communicator(), _communicator(copies=False)
    for seed in range(2):  # the first of each (kind, dtype, reduction) is gloo's; the second a copy
        expected = dtype_values(dtype, 64, seed)
        for mine, theirs in zip(_every_call(copies, dtype, seed), _every_call(gloo, dtype, seed), strict=True):
            assert torch.equal(mine.reshape(-1).view(torch.uint8), theirs.reshape(-1).view(torch.uint8))
            assert torch.equal(mine.reshape(-1).view(torch.uint8), expected.view(torch.uint8))
        # seed 0: only the AllToAll with splits (gloo ran the one without); seed 1: all 11 more
        assert copies.transport.world_of_one.calls == (1 if seed == 0 else 12)


def test_only_what_gloo_ran_is_copied_and_gloo_still_refuses_what_it_refuses():
    comm = _communicator()
    source = torch.arange(6.0)
    output = torch.empty(6)
    comm.all_gather_into_tensor(output, source)
    assert comm.transport.world_of_one.calls == 0 and torch.equal(output, source)
    comm.all_gather_into_tensor(output, source + 1)
    assert comm.transport.world_of_one.calls == 1 and torch.equal(output, source + 1)
    # another dtype is not vouched for: gloo runs it first
    comm.all_gather_into_tensor(torch.empty(6, dtype=torch.float64), source.double())
    assert comm.transport.world_of_one.calls == 1
    # a wrong length is refused at the call (naming it), not copied in part; the communicator goes on
    wrong = torch.full((7,), -1.0)
    with pytest.raises(MCCLError, match="the output has 7 elements; it must have 1 × 6"):
        comm.all_gather_into_tensor(wrong, source)
    assert torch.equal(wrong, torch.full((7,), -1.0)) and comm.broken is None
    comm.all_gather_into_tensor(output, source + 2)
    assert comm.transport.world_of_one.calls == 2 and torch.equal(output, source + 2)
    # a dtype gloo refuses stays refused on the second call too (a fresh group: gloo's refusal breaks it)
    refused = _communicator()
    for _ in range(2):
        with pytest.raises(MCCLError, match="Invalid scalar type|cannot run collectives"):
            refused.all_gather_into_tensor(torch.empty(4, dtype=torch.int16), torch.ones(4, dtype=torch.int16))
    assert refused.transport.world_of_one.calls == 0


def test_a_shape_error_names_the_tensor_and_leaves_the_communicator_working():
    """Calls that reach torch's own collective (no schedule installed) are checked before the launch: before,
    gloo's refusal surfaced as "a rank of the group stopped answering" and broke the communicator for good."""
    comm = _communicator()
    x = torch.ones(4)
    cases = [(lambda: comm.all_gather_into_tensor(torch.empty(4, dtype=torch.float64), x),
              "all_gather: output dtype torch.float64 differs from input dtype torch.float32"),
             (lambda: comm.reduce_scatter_tensor(torch.empty(3), x), "the input has 4 elements; it must have 1 × 3"),
             (lambda: comm.all_to_all_single(torch.empty(4), x, [3], [4]),
              r"output_split_sizes \[3\] must be 1 non-negative sizes summing to the 4 rows"),
             (lambda: comm.all_to_all_single(torch.empty(2, 2), x), "input rows hold 1 elements, output rows 2")]
    for call, message in cases:
        with pytest.raises(MCCLError, match=message):
            call()
    assert comm.broken is None and comm.seq == 0  # nothing was launched
    output = torch.empty(4)
    comm.all_gather_into_tensor(output, x)
    assert torch.equal(output, x)


def test_the_copy_declines_what_is_not_the_whole_call():
    base = torch.arange(8.0)
    assert not copy_collective("all_gather", base[2:8], base[0:6])  # a partial overlap: gloo's flat copy
    assert not copy_collective("all_gather", torch.empty(8, dtype=torch.float64), base)  # dtype: no conversion
    assert not copy_collective("all_gather", torch.empty(7), base)
    assert not copy_collective("all_gather", torch.empty(8, 2)[:, 0], base)  # not contiguous
    assert copy_collective("all_gather", base, base)  # in place: already the result
    output = torch.empty(8)
    assert copy_collective("all_to_all", output, base) and torch.equal(output, base)
    assert copy_collective("all_reduce", base, base)


def test_non_contiguous_output_is_written_through():
    comm = _communicator()
    source = torch.arange(4.0)
    for _ in range(2):
        holder = torch.zeros(4, 2)
        comm.all_gather_into_tensor(holder[:, 1], source)
        assert torch.equal(holder[:, 1], source) and torch.equal(holder[:, 0], torch.zeros(4))
    assert comm.transport.world_of_one.calls == 1
