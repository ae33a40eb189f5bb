"""The Schedule IR, its validator, files and link-load accounting."""

from mccl.schedule.accounting import (
    bottleneck_cut,
    chunks_per_link,
    gbps_to_gbs,
    link_load,
    link_slack,
    steady_state_algbw,
)
from mccl.schedule.binary import dumps_schedule_binary, loads_schedule_binary, schedule_binary_text
from mccl.schedule.ir import (
    Chunks,
    Collective,
    CutLink,
    Schedule,
    ScheduleMeta,
    Transfer,
    TransferList,
    TransferOp,
    Transfers,
)
from mccl.schedule.msccl import to_msccl_xml
from mccl.schedule.serialize import dump_schedule, dumps_schedule, load_schedule, loads_schedule
from mccl.schedule.validate import validate

__all__ = [
    "Chunks",
    "Collective",
    "CutLink",
    "Schedule",
    "ScheduleMeta",
    "Transfer",
    "TransferList",
    "TransferOp",
    "Transfers",
    "bottleneck_cut",
    "chunks_per_link",
    "dump_schedule",
    "dumps_schedule",
    "dumps_schedule_binary",
    "gbps_to_gbs",
    "link_load",
    "link_slack",
    "load_schedule",
    "loads_schedule",
    "loads_schedule_binary",
    "schedule_binary_text",
    "steady_state_algbw",
    "to_msccl_xml",
    "validate",
]
