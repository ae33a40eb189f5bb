"""The pre-flight agreement's rules and the call log, without processes.

``agree`` takes the AllGather it runs as a function; here that function lays the
ranks' vectors side by side in one process, so every rule is checked on exactly the
matrix the ranks would gather (the multiprocess tests run it over gloo).
"""

from __future__ import annotations

import pytest
import torch

from mccl.runtime.agreement import CollectiveMismatch, Signature, agree
from mccl.runtime.calls import CallLog


def _agree_all(signatures):
    n = len(signatures)
    rows = [torch.tensor(s.encode(n), dtype=torch.int64) for s in signatures]

    def gather(output, _mine):
        output.copy_(torch.cat(rows))

    return agree(signatures[0], n, gather, torch.device("cpu"), "test #1")


def test_agreeing_ranks_pass():
    _agree_all([Signature("all_gather", torch.float32, 4, 8)] * 2)
    _agree_all([Signature("all_to_all", torch.int64, 3, 2, input_splits=[1, 2], output_splits=[1, 1]),
                Signature("all_to_all", torch.int64, 3, 4, input_splits=[1, 2], output_splits=[2, 2])])


@pytest.mark.parametrize(("signatures", "phrase"), [
    ([Signature("all_gather", torch.float32, 4, 8), Signature("all_gather", torch.float32, 5, 10)],
     "input elements differ (rank 0: 4, rank 1: 5)"),
    ([Signature("all_gather", torch.float32, 4, 8), Signature("all_gather", torch.bfloat16, 4, 8)],
     "dtypes differ (rank 0: float32, rank 1: bfloat16)"),
    ([Signature("all_gather", torch.float32, 4, 8), Signature("all_reduce", torch.float32, 4, 4)],
     "different collectives (rank 0: all_gather, rank 1: all_reduce)"),
    ([Signature("reduce_scatter", torch.float32, 8, 4, 0), Signature("reduce_scatter", torch.float32, 8, 4, 3)],
     "reductions differ"),
    ([Signature("all_gather", torch.float32, 4, 9), Signature("all_gather", torch.float32, 4, 9)],
     "output has 9 elements, not 2 × its input's 4"),
    ([Signature("all_to_all", torch.int64, 3, 3, input_splits=[1, 2], output_splits=[1, 2]),
      Signature("all_to_all", torch.int64, 3, 3, input_splits=[1, 2], output_splits=[2, 1])],
     "rank 1 sends rank 0 1 elements, rank 0 expects 2"),
])
def test_a_disagreement_is_named(signatures, phrase):
    with pytest.raises(CollectiveMismatch, match="nothing was sent") as error:
        _agree_all(signatures)
    assert phrase in str(error.value)


def test_call_log_counts_paths_and_versions():
    log = CallLog(keep=2)
    log.record(1, "all_gather_into_tensor", 3)
    log.record(2, "all_gather_into_tensor", None)
    log.record(3, "broadcast", None)
    assert log.scheduled("all_gather_into_tensor") == 1 and log.delegated("all_gather_into_tensor") == 1
    assert [r.label for r in log.recent()] == ["delegated", "delegated"]  # the ring keeps the last two
    assert log.counts()[("broadcast", "delegated")] == 1
