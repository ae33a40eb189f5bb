"""The netemu demo's entry points, kept for their callers (``benchmarks/netemu.py``, tests): the loop itself
is the one demo driver, :mod:`mccl.experiments.demo` (fabric "netemu", its default), with the rank loop in
:mod:`mccl.experiments.demo_ranks`. ``NetemuConfig`` is :class:`~mccl.experiments.demo.DemoConfig`."""

from __future__ import annotations

from mccl.experiments.demo import DemoConfig, run_demo, synth_options
from mccl.experiments.demo_ranks import COMMUNICATORS, known_answer, source_of

__all__ = ["NetemuConfig", "run_netemu_demo", "COMMUNICATORS"]

NetemuConfig = DemoConfig
run_netemu_demo = run_demo
_synth_options = synth_options
_source = source_of
_known_answer = known_answer
