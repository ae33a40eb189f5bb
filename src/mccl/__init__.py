"""mccl: collective schedules kept matched to the network a training job really has.

Read first: ``mccl.topology`` (the fabric), ``mccl.schedule`` (the Schedule IR and its
validator), ``mccl.synth`` (who makes schedules), ``mccl.sim`` (how fast they run),
``mccl.runtime`` (the executor on torch.distributed; ``mccl.init``,
``mccl.all_gather_into_tensor``, ... load it, and torch, on first use).
"""

from mccl.errors import (
    ControllerError,
    Infeasible,
    InvalidSchedule,
    MCCLError,
    SynthesisError,
    TopologyError,
)

__version__ = "0.1.0"

_RUNTIME_NAMES = ("init", "all_gather_into_tensor", "all_to_all_single", "reduce_scatter_tensor", "all_reduce",
                  "barrier", "Communicator")


def __getattr__(name: str) -> object:
    """``mccl.init`` and the collectives come from :mod:`mccl.runtime`, imported (with torch) on first use."""
    if name in _RUNTIME_NAMES:
        import importlib

        runtime = importlib.import_module("mccl.runtime")
        globals().update({runtime_name: getattr(runtime, runtime_name) for runtime_name in _RUNTIME_NAMES})
        return globals()[name]  # later look-ups skip this hook (it cost ~5 µs per collective call)
    raise AttributeError(f"module 'mccl' has no attribute {name!r}")

__all__ = [
    "ControllerError",
    "Infeasible",
    "InvalidSchedule",
    "MCCLError",
    "SynthesisError",
    "TopologyError",
    "__version__",
]
