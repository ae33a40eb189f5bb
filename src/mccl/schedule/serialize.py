"""Schedule files: JSON, versioned (``mccl-schedule/1``), columnar like the IR.

The controller's messages, test fixtures and bug reports are such files, so a
schedule read back is equal to the one written.

Reading is bounded (files come from users and, through the controller, from the
network): a file that is not UTF-8, nested too deeply, holds a non-finite number or
an integer beyond 64 bits, or a column that is not a flat list of integers (fractions:
numbers) is refused with a :class:`~mccl.errors.ScheduleFileError`. Step numbers are
renumbered compactly on reading (``0, 1, 2, ...`` in the same order — the meaning of a
schedule depends only on the order of its steps), so a file with steps ``{0, 2e9}``
cannot make an executor loop over two billion empty steps; :func:`mccl.schedule.validate`
refuses such a schedule built in memory.

Writing encodes the large columns in slices of ``_SLICE`` values, so writing a 40 MiB
schedule never holds the GIL for long in one C call (the controller writes schedules on
a worker thread while its socket thread must keep answering polls). Writing a file
goes to a temporary file renamed over the target: a failed write never leaves a partial
file or damages the previous one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from mccl.errors import ScheduleFileError
from mccl.schedule.binary import decode_text, dumps_schedule_binary, is_binary, loads_schedule_binary
from mccl.schedule.filemeta import compact_steps, schedule_meta_from_dict, schedule_meta_to_dict
from mccl.schedule.ir import Chunks, Collective, Schedule, Transfers
from mccl.topology.fileformat import write_atomic

__all__ = ["FORMAT", "schedule_to_dict", "schedule_from_dict", "dumps_schedule", "loads_schedule",
           "dump_schedule", "load_schedule", "schedule_digest"]

FORMAT = "mccl-schedule/1"
_SLICE = 1 << 16


_CHUNK_COLUMNS = ("source", "destination", "fraction")
_TRANSFER_COLUMNS = ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links")


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    return _to_dict(schedule, lambda group, key, array: array.tolist())


def _to_dict(schedule: Schedule, column: Any) -> dict[str, Any]:
    """The file's document; ``column(group, key, array)`` gives each column's value."""
    meta = schedule.meta
    return {
        "format": FORMAT,
        "collective": schedule.collective.value,
        "ranks": list(schedule.ranks),
        "chunks": {key: column("chunks", key, getattr(schedule.chunks, key)) for key in _CHUNK_COLUMNS},
        "transfers": {key: column("transfers", key, getattr(schedule.transfers, key)) for key in _TRANSFER_COLUMNS},
        "meta": schedule_meta_to_dict(meta),
    }


def _field(data: dict[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise ScheduleFileError(f"{where}: missing field '{key}'")
    return data[key]


def _column(data: dict[str, Any], key: str, where: str, *, integral: bool = True) -> np.ndarray:
    """A flat list of integers (``integral``) or finite numbers, as an array; ScheduleFileError otherwise."""
    values = _field(data, key, where)
    if not isinstance(values, list):
        raise ScheduleFileError(f"{where}.{key}: must be a list of {'integers' if integral else 'numbers'}")
    array = np.asarray(values) if values else np.zeros(0, dtype=np.int64 if integral else np.float64)
    if array.ndim != 1 or array.dtype.kind not in ("iu" if integral else "iuf"):
        raise ScheduleFileError(f"{where}.{key}: must be a flat list of {'integers' if integral else 'numbers'}"
                                f" (found {'nested lists' if array.ndim != 1 else 'a ' + _kind_name(array)})")
    if integral and array.size and (array.min() < -2**31 or array.max() >= 2**31):
        raise ScheduleFileError(f"{where}.{key}: values must fit in 32 bits")
    return array


def _kind_name(array: np.ndarray) -> str:
    return {"f": "fractional number", "b": "boolean", "U": "string", "O": "mixed value or an integer beyond 64 bits"}.get(array.dtype.kind,
                                                                                              str(array.dtype))


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
        chunks = Chunks(*(_column(chunk_data, key, f"{source}: chunks", integral=key != "fraction")
                          for key in ("source", "destination", "fraction")))
        columns = [_column(transfer_data, key, f"{source}: transfers")
                   for key in ("chunk", "sender", "receiver", "step", "op", "route_offsets", "route_links")]
        columns[3] = compact_steps(columns[3])
        transfers = Transfers(*columns)
        meta = schedule_meta_from_dict(meta_data, source)
    except ScheduleFileError:
        raise
    except (TypeError, ValueError, OverflowError) as error:
        raise ScheduleFileError(f"{source}: malformed schedule: {error}") from None
    return Schedule(collective, tuple(ranks), chunks, transfers, meta)


def dumps_schedule(schedule: Schedule) -> str:
    """The schedule file's text. Large columns are encoded slice by slice (see module docstring);
    the text is the same as one ``json.dumps`` of :func:`schedule_to_dict`."""
    marks: dict[str, np.ndarray] = {}

    def column(group: str, key: str, array: np.ndarray) -> Any:
        if len(array) <= _SLICE:
            return array.tolist()
        mark = f"@@mccl-column-{group}-{key}@@"
        marks[f'"{mark}"'] = array
        return mark

    text = json.dumps(_to_dict(schedule, column), separators=(",", ":")) + "\n"
    for mark, array in marks.items():
        pieces = [json.dumps(array[start:start + _SLICE].tolist(), separators=(",", ":"))[1:-1]
                  for start in range(0, len(array), _SLICE)]
        text = text.replace(mark, "[" + ",".join(pieces) + "]", 1)
    return text


def _no_constant(text: str) -> Any:
    raise ScheduleFileError(f"{text} is not a finite number")


def loads_schedule(text: str | bytes, source: str = "<schedule>") -> Schedule:
    """A schedule file read back: JSON text, or the binary format (:mod:`.binary`) as bytes or in its
    text form — recognized by their first bytes, so a reader needs no flag."""
    if is_binary(text):
        return loads_schedule_binary(decode_text(text, source) if isinstance(text, str) else text, source)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ScheduleFileError(f"{source}: not UTF-8 text (byte {error.start})") from None
    try:
        # No parse_int / parse_float hooks: a Python call per number made reading 3.5x slower. A number
        # out of range is refused where it is used: columns by _column (flat, integral, 32-bit; a
        # 400-digit integer makes an object array), fractions by validate() (finite, positive).
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise ScheduleFileError(f"{source}:{error.lineno}: not valid JSON: {error.msg}") from None
    except ValueError as error:  # an integer beyond Python's 4300-digit limit
        raise ScheduleFileError(f"{source}: not a valid schedule file: {str(error)[:120]}") from None
    except RecursionError:
        raise ScheduleFileError(f"{source}: nested too deeply for a schedule file") from None
    except ScheduleFileError as error:
        raise ScheduleFileError(f"{source}: {error}") from None
    return schedule_from_dict(data, source)


def schedule_digest(schedule: Schedule) -> str:
    """A hash of what a schedule makes ranks do: collective, ranks, chunks and transfers (not its
    metadata, so not its version). Ranks agreeing on a hot swap compare it, not only the version:
    two different schedules under one version must never both be adopted. BLAKE2b over the arrays'
    bytes (fixed dtypes): ~1 GB/s, and hashlib releases the GIL while it hashes."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{FORMAT}\0{schedule.collective.value}\0".encode())
    digest.update("\0".join(schedule.ranks).encode() + b"\0")
    chunks, transfers = schedule.chunks, schedule.transfers
    for array in (chunks.source, chunks.destination, chunks.fraction, transfers.chunk, transfers.sender,
                  transfers.receiver, transfers.step, transfers.op, transfers.route_offsets, transfers.route_links):
        digest.update(len(array).to_bytes(8, "little"))
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def dump_schedule(schedule: Schedule, path: str | Path, *, binary: bool = False) -> None:
    """Write a schedule file: JSON text, or with ``binary`` the binary format (:mod:`.binary`);
    :func:`load_schedule` reads either."""
    if binary:
        write_atomic(path, dumps_schedule_binary(schedule))
    else:
        write_atomic(path, dumps_schedule(schedule))


def load_schedule(path: str | Path) -> Schedule:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ScheduleFileError(f"{path}: cannot read schedule file: {error.strerror or error}") from None
    return loads_schedule(data, str(path))
