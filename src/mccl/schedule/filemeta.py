"""What the JSON (:mod:`.serialize`) and binary (:mod:`.binary`) schedule files share: the metadata
object and the rules for reading it and the step column back. Its own module so that the two
formats import it, not each other."""

from __future__ import annotations

from typing import Any

import numpy as np

from mccl.errors import ScheduleFileError
from mccl.schedule.ir import CutLink, ScheduleMeta

__all__ = ["schedule_meta_to_dict", "schedule_meta_from_dict", "compact_steps"]


def schedule_meta_to_dict(meta: ScheduleMeta) -> dict[str, Any]:
    """The ``meta`` object of a schedule file (JSON and binary, :mod:`.binary`)."""
    return {
        "synthesizer": meta.synthesizer,
        "version": meta.version,
        "topology": meta.topology,
        "inputs": [list(pair) for pair in meta.inputs],
        "throughput_bound_gbs": meta.throughput_bound_gbs,
        "achieved_gbs": meta.achieved_gbs,
        "bottleneck_cut": [[cut.link, cut.base_slack] for cut in meta.bottleneck_cut],
        "chunks_per_link": [list(pair) for pair in meta.chunks_per_link],
        "stats": [list(pair) for pair in meta.stats],
    }


def schedule_meta_from_dict(meta_data: Any, source: str) -> ScheduleMeta:
    """A schedule file's ``meta`` object read back; ScheduleFileError if malformed."""
    if not isinstance(meta_data, dict):
        raise ScheduleFileError(f"{source}: meta: must be an object")
    try:
        return ScheduleMeta(
            synthesizer=str(meta_data.get("synthesizer", "unknown")),
            version=_version(meta_data.get("version", 0), source),
            topology=str(meta_data.get("topology", "")),
            inputs=tuple((str(key), str(value)) for key, value in meta_data.get("inputs", [])),
            throughput_bound_gbs=_optional_rate(meta_data, "throughput_bound_gbs", source),
            achieved_gbs=_optional_rate(meta_data, "achieved_gbs", source),
            bottleneck_cut=tuple(CutLink(int(link), float(slack)) for link, slack in meta_data.get("bottleneck_cut", [])),
            chunks_per_link=tuple((int(link), int(count)) for link, count in meta_data.get("chunks_per_link", [])),
            stats=tuple((str(name), float(value)) for name, value in meta_data.get("stats", [])),
        )
    except ScheduleFileError:
        raise
    except (TypeError, ValueError, OverflowError) as error:
        raise ScheduleFileError(f"{source}: malformed schedule metadata: {error}") from None


def _version(value: Any, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ScheduleFileError(f"{source}: meta.version: must be an integer in 0..2**63-1, got {str(value)[:40]}")
    return value


def _optional_rate(meta: dict[str, Any], key: str, source: str) -> float | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) < float("inf"):
        raise ScheduleFileError(f"{source}: meta.{key}: must be a finite number or null, got {str(value)[:40]}")
    return float(value)


def compact_steps(step: np.ndarray) -> np.ndarray:
    """Steps renumbered 0, 1, 2, ... in the same order (a schedule's meaning is the order of its steps)."""
    if step.size == 0 or step.min() < 0:
        return step  # validate() names a negative step
    used, compact = np.unique(step, return_inverse=True)
    return step if used[-1] == len(used) - 1 else compact.reshape(step.shape)
