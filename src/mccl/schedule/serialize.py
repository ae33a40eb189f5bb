"""Schedule files: JSON, versioned (``mccl-schedule/1``), columnar like the IR.

The controller's messages, test fixtures and bug reports are such files, so a
schedule read back is equal to the one written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mccl.errors import ScheduleFileError
from mccl.schedule.ir import Chunks, Collective, CutLink, Schedule, ScheduleMeta, Transfers

__all__ = ["FORMAT", "schedule_to_dict", "schedule_from_dict", "dumps_schedule", "loads_schedule",
           "dump_schedule", "load_schedule"]

FORMAT = "mccl-schedule/1"


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    meta = schedule.meta
    transfers = schedule.transfers
    return {
        "format": FORMAT,
        "collective": schedule.collective.value,
        "ranks": list(schedule.ranks),
        "chunks": {
            "source": schedule.chunks.source.tolist(),
            "destination": schedule.chunks.destination.tolist(),
            "fraction": schedule.chunks.fraction.tolist(),
        },
        "transfers": {
            "chunk": transfers.chunk.tolist(),
            "sender": transfers.sender.tolist(),
            "receiver": transfers.receiver.tolist(),
            "step": transfers.step.tolist(),
            "op": transfers.op.tolist(),
            "route_offsets": transfers.route_offsets.tolist(),
            "route_links": transfers.route_links.tolist(),
        },
        "meta": {
            "synthesizer": meta.synthesizer,
            "version": meta.version,
            "topology": meta.topology,
            "inputs": [list(pair) for pair in meta.inputs],
            "throughput_bound_gbs": meta.throughput_bound_gbs,
            "achieved_gbs": meta.achieved_gbs,
            "bottleneck_cut": [[cut.link, cut.base_slack] for cut in meta.bottleneck_cut],
            "chunks_per_link": [list(pair) for pair in meta.chunks_per_link],
            "stats": [list(pair) for pair in meta.stats],
        },
    }


def _field(data: dict[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise ScheduleFileError(f"{where}: missing field '{key}'")
    return data[key]


def schedule_from_dict(data: Any, source: str = "<schedule>") -> Schedule:
    if not isinstance(data, dict):
        raise ScheduleFileError(f"{source}: a schedule file is a JSON object")
    if data.get("format") != FORMAT:
        raise ScheduleFileError(f"{source}: format: expected {FORMAT!r}, got {data.get('format')!r}")
    try:
        collective = Collective(_field(data, "collective", source))
    except ValueError:
        raise ScheduleFileError(f"{source}: collective: unknown collective {data['collective']!r}; "
                                f"known: {', '.join(c.value for c in Collective)}") from None
    ranks = _field(data, "ranks", source)
    if not isinstance(ranks, list) or not all(isinstance(gpu, str) for gpu in ranks):
        raise ScheduleFileError(f"{source}: ranks: must be a list of GPU ids")
    chunk_data = _field(data, "chunks", source)
    transfer_data = _field(data, "transfers", source)
    meta_data = data.get("meta", {})
    try:
        chunks = Chunks(*(_field(chunk_data, key, f"{source}: chunks") for key in ("source", "destination", "fraction")))
        transfers = Transfers(*(
            _field(transfer_data, key, f"{source}: transfers")
            for key in ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links")
        ))
        meta = ScheduleMeta(
            synthesizer=str(meta_data.get("synthesizer", "unknown")),
            version=int(meta_data.get("version", 0)),
            topology=str(meta_data.get("topology", "")),
            inputs=tuple((str(key), str(value)) for key, value in meta_data.get("inputs", [])),
            throughput_bound_gbs=meta_data.get("throughput_bound_gbs"),
            achieved_gbs=meta_data.get("achieved_gbs"),
            bottleneck_cut=tuple(CutLink(int(link), float(slack)) for link, slack in meta_data.get("bottleneck_cut", [])),
            chunks_per_link=tuple((int(link), int(count)) for link, count in meta_data.get("chunks_per_link", [])),
            stats=tuple((str(name), float(value)) for name, value in meta_data.get("stats", [])),
        )
    except ScheduleFileError:
        raise
    except (TypeError, ValueError, OverflowError) as error:
        raise ScheduleFileError(f"{source}: malformed schedule: {error}") from None
    return Schedule(collective, tuple(ranks), chunks, transfers, meta)


def dumps_schedule(schedule: Schedule) -> str:
    return json.dumps(schedule_to_dict(schedule), separators=(",", ":")) + "\n"


def loads_schedule(text: str, source: str = "<schedule>") -> Schedule:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ScheduleFileError(f"{source}:{error.lineno}: not valid JSON: {error.msg}") from None
    return schedule_from_dict(data, source)


def dump_schedule(schedule: Schedule, path: str | Path) -> None:
    Path(path).write_text(dumps_schedule(schedule))


def load_schedule(path: str | Path) -> Schedule:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ScheduleFileError(f"{path}: cannot read schedule file: {error.strerror or error}") from None
    return loads_schedule(text, str(path))
