"""The executor's drivers: how one rank issues and waits for its operations (mccl-paper §3.3).

Every driver implements one small protocol, :class:`~mccl.runtime.drivers.base.Driver`:
``prepare(plan, bound, buffers) -> program`` once per block sizes (cached in
:attr:`~mccl.runtime.binding.Bound.programs`), then ``run(program, transport, tensors,
buffers, seq=, meters=)`` per call.

* ``stepwise`` (:mod:`.stepwise`): one group per step (receives first), waited per
  step; NCCL and gloo both run it.
* ``eager`` (:mod:`.eager`, gloo): posts every operation as soon as the operations it
  depends on have finished, so chunks pipeline across trees and paths.
* ``exchange`` (:mod:`.exchange`, gloo): each step as one gloo alltoallv.
"""

from __future__ import annotations

from mccl.runtime.drivers.base import Driver
from mccl.runtime.drivers.eager import EagerDriver
from mccl.runtime.drivers.exchange import ExchangeDriver, ExchangeStep
from mccl.runtime.drivers.stepwise import StepwiseDriver

__all__ = ["DRIVERS", "Driver", "EagerDriver", "ExchangeDriver", "ExchangeStep", "StepwiseDriver"]

DRIVERS: dict[str, Driver] = {driver.name: driver for driver in (EagerDriver(), ExchangeDriver(), StepwiseDriver())}
