"""mccl: collective schedules kept matched to the network a training job really has.

Read first: ``mccl.topology`` (the fabric), ``mccl.schedule`` (the Schedule IR and its
validator), ``mccl.synth`` (who makes schedules), ``mccl.sim`` (how fast they run).
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

__all__ = [
    "ControllerError",
    "Infeasible",
    "InvalidSchedule",
    "MCCLError",
    "SynthesisError",
    "TopologyError",
    "__version__",
]
