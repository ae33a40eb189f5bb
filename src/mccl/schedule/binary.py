"""Binary schedule files (``mccl-schedule-bin/1``): the IR's columns as raw little-endian arrays.

Why: the controller hands every new schedule version to the ranks, and the JSON text of a
512-GPU schedule (1.7–2.1 M transfers) cost 2.3–3.5 s CPU to encode (BENCHMARKS.md,
"controller CPU per flagged collective at 512 GPUs") — more than the decision itself. Here a
column is written with ``ndarray.tobytes`` in the narrowest integer type that holds it
(``route_offsets`` as per-route lengths, which fit a byte), so encoding is a few memory copies
and a CRC; JSON (:mod:`.serialize`) stays the readable format for files people look at.

Layout::

    b"MCCLSCHB"  u32 format version  u32 header bytes  header (UTF-8 JSON)  payload
                                                                             (the columns, back to back)

The header holds the collective, the ranks, the metadata (as in the JSON file), the payload's
length and CRC-32, and per column its name, dtype and count. Reading checks everything before
it trusts a byte: the magic and version, that the header is bounded JSON of the right shape,
that every dtype is one of the few allowed, that the columns' sizes add up to the payload's,
that the payload is all there (a truncated file names how many bytes are missing) and that its
CRC matches (a corrupt one says so), then the same column rules as the JSON reader (32-bit
integers, steps renumbered compactly). Errors are :class:`~mccl.errors.ScheduleFileError`.

On a text channel (the controller's JSON messages) the file travels as :data:`TEXT_PREFIX` +
base64; :func:`mccl.schedule.loads_schedule` recognizes both forms, so a reader needs no flag.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import zlib
from typing import Any

import numpy as np

from mccl.errors import InvalidSchedule, ScheduleFileError
from mccl.schedule.filemeta import compact_steps, schedule_meta_from_dict, schedule_meta_to_dict
from mccl.schedule.ir import Chunks, Collective, Schedule, Transfers

__all__ = ["BINARY_FORMAT", "MAGIC", "TEXT_PREFIX", "dumps_schedule_binary", "loads_schedule_binary",
           "schedule_binary_text", "is_binary"]

BINARY_FORMAT = "mccl-schedule-bin/1"
MAGIC = b"MCCLSCHB"
_VERSION = 1
TEXT_PREFIX = "mccl-schedule-bin/1;base64,"
_FIXED = struct.Struct("<8sII")  # magic, format version, header length
_MAX_HEADER = 64 << 20  # ranks and metadata only; a 2048-rank header is ~100 KiB
# no u4: the IR's integer columns are int32 (op int8), and a wider value must be refused, not wrapped
_DTYPES = {"u1": np.uint8, "u2": np.uint16, "i1": np.int8, "i2": np.int16, "i4": np.int32, "f8": np.float64}
_TARGET = {"fraction": np.float64, "op": np.int8, "route_lengths": np.int64}  # others: int32
_COLUMNS = (("chunks", "source"), ("chunks", "destination"), ("chunks", "fraction"), ("transfers", "chunk"),
            ("transfers", "sender"), ("transfers", "receiver"), ("transfers", "step"), ("transfers", "op"),
            ("transfers", "route_lengths"), ("transfers", "route_links"))


def _narrowest(array: np.ndarray) -> str:
    """The smallest allowed integer dtype code that holds every value of ``array``."""
    if array.size == 0:
        return "u1"
    low, high = int(array.min()), int(array.max())
    for code in ("u1", "i1", "u2", "i2", "i4"):
        info = np.iinfo(_DTYPES[code])
        if info.min <= low and high <= info.max:
            return code
    raise ScheduleFileError(f"a column holds {low}..{high}, beyond 32 bits")


def dumps_schedule_binary(schedule: Schedule) -> bytes:
    """The binary file of ``schedule`` (module docstring)."""
    transfers = schedule.transfers
    arrays = {("chunks", "source"): schedule.chunks.source, ("chunks", "destination"): schedule.chunks.destination,
              ("chunks", "fraction"): schedule.chunks.fraction}
    for key in ("chunk", "sender", "receiver", "step", "op", "route_links"):
        arrays[("transfers", key)] = getattr(transfers, key)
    arrays[("transfers", "route_lengths")] = np.diff(transfers.route_offsets)
    columns, pieces = [], []
    for group, key in _COLUMNS:
        array = np.asarray(arrays[(group, key)])
        code = "f8" if key == "fraction" else _narrowest(array)
        data = np.ascontiguousarray(array, dtype=np.dtype(_DTYPES[code]).newbyteorder("<")).tobytes()
        columns.append([group, key, code, int(array.size)])
        pieces.append(data)
    payload = b"".join(pieces)
    header = {"format": BINARY_FORMAT, "collective": schedule.collective.value, "ranks": list(schedule.ranks),
              "meta": schedule_meta_to_dict(schedule.meta), "columns": columns, "payload_bytes": len(payload),
              "crc32": zlib.crc32(payload)}
    head = json.dumps(header, separators=(",", ":")).encode()
    return _FIXED.pack(MAGIC, _VERSION, len(head)) + head + payload


def schedule_binary_text(schedule: Schedule) -> str:
    """The binary file as text for a JSON channel: :data:`TEXT_PREFIX` + base64."""
    return TEXT_PREFIX + base64.b64encode(dumps_schedule_binary(schedule)).decode("ascii")


def is_binary(data: str | bytes) -> bool:
    """Whether ``data`` is a binary schedule file, or its text form."""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data[:len(MAGIC)]) == MAGIC
    return data.startswith(TEXT_PREFIX)


def _header(data: bytes | memoryview, source: str) -> tuple[dict[str, Any], int]:
    if len(data) < _FIXED.size:
        raise ScheduleFileError(f"{source}: truncated binary schedule file: {len(data)} bytes, the fixed header "
                                f"alone is {_FIXED.size}")
    magic, version, length = _FIXED.unpack_from(data, 0)
    if magic != MAGIC:
        raise ScheduleFileError(f"{source}: not a binary schedule file (magic {bytes(magic)!r})")
    if version != _VERSION:
        raise ScheduleFileError(f"{source}: binary schedule format version {version}; this reader knows {_VERSION}")
    if length > _MAX_HEADER:
        raise ScheduleFileError(f"{source}: binary schedule header of {length} bytes exceeds {_MAX_HEADER}")
    end = _FIXED.size + length
    if len(data) < end:
        raise ScheduleFileError(f"{source}: truncated binary schedule file: the header needs {end} bytes, "
                                f"the file has {len(data)}")
    try:
        header = json.loads(bytes(data[_FIXED.size:end]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ScheduleFileError(f"{source}: corrupt binary schedule header: {str(error)[:120]}") from None
    if not isinstance(header, dict) or header.get("format") != BINARY_FORMAT:
        raise ScheduleFileError(f"{source}: corrupt binary schedule header (format "
                                f"{header.get('format') if isinstance(header, dict) else None!r})")
    return header, end


def _int(value: Any, what: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
        raise ScheduleFileError(f"{source}: corrupt binary schedule header: {what} must be a non-negative "
                                f"integer, got {str(value)[:40]}")
    return value


def loads_schedule_binary(data: bytes | bytearray | memoryview, source: str = "<schedule>") -> Schedule:
    """Read a binary schedule file (module docstring); ScheduleFileError on anything malformed."""
    header, start = _header(data, source)
    layout = header.get("columns")
    names = [tuple(c[:2]) if isinstance(c, list) and len(c) == 4 else None for c in layout] \
        if isinstance(layout, list) else None
    if names != list(_COLUMNS):
        raise ScheduleFileError(f"{source}: corrupt binary schedule header: columns must be "
                                f"{', '.join('.'.join(pair) for pair in _COLUMNS)} in order")
    expected = _int(header.get("payload_bytes"), "payload_bytes", source)
    have = len(data) - start
    if have < expected:
        raise ScheduleFileError(f"{source}: truncated binary schedule file: {expected - have} of its "
                                f"{expected} payload bytes are missing")
    if have > expected:
        raise ScheduleFileError(f"{source}: {have - expected} unexpected bytes after the binary schedule's payload")
    payload = memoryview(data)[start:]
    if zlib.crc32(payload) != header.get("crc32"):
        raise ScheduleFileError(f"{source}: corrupt binary schedule file: the payload's CRC-32 does not match")
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for group, key, code, count in layout:
        if code not in _DTYPES or (code == "f8") != (key == "fraction") or (key == "op" and code not in ("u1", "i1")):
            raise ScheduleFileError(f"{source}: {group}.{key}: dtype {str(code)[:10]!r} not allowed")
        dtype = np.dtype(_DTYPES[code]).newbyteorder("<")
        size = _int(count, f"{group}.{key} count", source) * dtype.itemsize
        if offset + size > expected:
            raise ScheduleFileError(f"{source}: corrupt binary schedule header: the columns need more than the "
                                    f"{expected} payload bytes")
        arrays[key] = np.frombuffer(payload[offset:offset + size], dtype=dtype).astype(_TARGET.get(key, np.int32))
        offset += size
    if offset != expected:
        raise ScheduleFileError(f"{source}: corrupt binary schedule header: the columns take {offset} of the "
                                f"{expected} payload bytes")
    try:
        collective = Collective(header.get("collective"))
    except ValueError:
        raise ScheduleFileError(f"{source}: collective: unknown collective {str(header.get('collective'))[:40]!r}") \
            from None
    ranks = header.get("ranks")
    if not isinstance(ranks, list) or not all(isinstance(gpu, str) for gpu in ranks):
        raise ScheduleFileError(f"{source}: ranks: must be a list of GPU ids")
    lengths = arrays.pop("route_lengths")
    route_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=route_offsets[1:])
    try:
        chunks = Chunks(arrays["source"], arrays["destination"], arrays["fraction"])
        transfers = Transfers(arrays["chunk"], arrays["sender"], arrays["receiver"], compact_steps(arrays["step"]),
                              arrays["op"], route_offsets, arrays["route_links"])
    except InvalidSchedule as error:
        raise ScheduleFileError(f"{source}: malformed schedule: {error}") from None
    meta = schedule_meta_from_dict(header.get("meta", {}), source)
    return Schedule(collective, tuple(ranks), chunks, transfers, meta)


def decode_text(text: str, source: str) -> bytes:
    """The bytes of :func:`schedule_binary_text`'s form."""
    try:
        return base64.b64decode(text[len(TEXT_PREFIX):], validate=True)
    except (binascii.Error, ValueError) as error:
        raise ScheduleFileError(f"{source}: corrupt base64 in a binary schedule's text form: {error}") from None
