"""The controller's wire messages: small versioned JSON documents over ZeroMQ.

One endpoint (a ROUTER socket in the service); every client connects two DEALER
sockets to it, one for telemetry (send only) and one for requests (see
:mod:`.service` for why). Every message is one frame of UTF-8 JSON with ``"v"``
(protocol version) and ``"op"``:

* ``telemetry`` — ``samples``: rows ``[kind, communicator, rank, peer, bytes, seconds,
  end_time, seq]`` or, for a sample that names its schedule, ``[..., seq, collective, version]``
  (the fields of ``mccl.telemetry.Sample``; ``kind`` ``"inter"``, ``"intra"`` or ``"collective"``:
  one rank's whole collective, with ``peer`` -1 and ``bytes`` its size S > 0); optional ``calls``: which path
  ran one rank's calls, ``{"communicator", "rank", "counts": [[op, path, version, count], ...]}``
  (totals since the communicator was created; ``path`` ``"schedule"`` with the schedule's
  version, or ``"delegated"`` with ``null``; at most ``MAX_CALL_ROWS`` rows); no reply.
* ``poll`` — ``communicator``, ``rank``, ``have`` ({collective: version}); reply
  ``schedule`` (``collective``, ``version``, ``schedule``: a schedule file's JSON
  text, :func:`mccl.schedule.dumps_schedule`) when a newer version is active, else
  ``idle`` (``versions``).
* pushed to a polling socket (no request): ``schedule`` as above when a version is issued; ``candidate``
  (``collective``, ``version``, ``schedule``, ``digest``), a schedule the controller may issue next
  (:mod:`.candidates`); ``activate`` (``collective``, ``version``, ``digest``), the version issued has the
  content of the candidate with that digest sent to this socket (:mod:`.candidates`, "Activation by digest").
* ``register`` — ``communicator``, ``schedule`` (file text); reply ``ok`` (``version``).
* ``windows`` — ``communicator``; reply ``windows`` (``version``, ``windows``): a time-shared tenant's
  send windows (:mod:`mccl.control.tenancy.live`, issue 16).
* ``status`` — reply ``status`` (``events``, ``stats``, ``calls``: {communicator: {rank:
  [[op, path, version, count], ...]}}, the latest call totals each rank reported).
* ``stop`` — reply ``ok``; the service ends.
* any failure — reply ``error`` (``message``).

Bounded parsing: a message is refused (a :class:`~mccl.errors.ControllerError`, never
another exception) when it is larger than ``MAX_MESSAGE_BYTES``, nested deeper than
Python's recursion limit allows, holds ``NaN`` or ``Infinity``, or a field of the wrong
type or out of its range (``1e400`` parses as inf and ``10**400`` as a big integer, and
the range checks refuse both). Every field a handler uses is checked here, so a handler
sees plain values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from mccl.errors import ControllerError
from mccl.telemetry import COLLECTIVE, INTER, INTRA, Sample

__all__ = ["PROTOCOL_VERSION", "MAX_MESSAGE_BYTES", "encode", "decode", "telemetry_message", "samples_of",
           "text_field", "int_field", "versions_field", "finite_or_none",
           "finite_samples", "calls_field", "calls_of", "CallReport", "MAX_CALL_ROWS"]

PROTOCOL_VERSION = 1
# The largest frame the service takes (ZMQ_MAXMSGSIZE: libzmq drops the connection of a peer that
# sends more, before the frame is buffered). A 512-rank ring schedule file is ~40 MiB.
MAX_MESSAGE_BYTES = 64 << 20
MAX_NAME_CHARS = 256
MAX_RANKS = 1 << 20
MAX_SAMPLES_PER_MESSAGE = 1 << 16
_INT64 = 2**63 - 1
_KINDS = frozenset((INTER, INTRA, COLLECTIVE))
# Rows of one rank's call report: (operation, path, version) triples. torch has ~25 operation names and
# a communicator runs a few schedule versions per kind; 1024 leaves room and bounds what the service keeps.
MAX_CALL_ROWS = 1024
_SCHEDULE, _DELEGATED = "schedule", "delegated"  # the paths of mccl.runtime.calls (control imports no runtime)

CallReport = tuple[str, int, list[tuple[str, str, "int | None", int]]]
"""A checked call report: (communicator, rank, [(op, path, version or None, count), ...])."""


def encode(op: str, **fields: Any) -> bytes:
    return json.dumps({"v": PROTOCOL_VERSION, "op": op, **fields}, separators=(",", ":"), allow_nan=False).encode()


def _no_constant(text: str) -> Any:
    raise ControllerError(f"a controller message holds {text}, which is not a finite number")


def decode(frame: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> dict[str, Any]:
    """A message as a dict; ControllerError naming what is wrong with it (and nothing else)."""
    if len(frame) > max_bytes:
        raise ControllerError(f"a controller message of {len(frame)} bytes is larger than the limit {max_bytes}")
    try:
        # No parse_int / parse_float hooks (a Python call per number halved the ingest rate): a number
        # out of range (1e400 is inf, 10**400 a big int) is refused by the field checks below.
        message = json.loads(frame, parse_constant=_no_constant)
    except ValueError as error:  # not JSON, not UTF-8, an integer beyond Python's 4300-digit limit
        raise ControllerError(f"a controller message is not JSON: {str(error)[:200]}") from None
    except RecursionError:
        raise ControllerError("a controller message is nested too deeply") from None
    if not isinstance(message, dict) or "op" not in message:
        raise ControllerError("a controller message must be a JSON object with an 'op'")
    if message.get("v") != PROTOCOL_VERSION:
        raise ControllerError(f"controller protocol version {str(message.get('v'))[:20]!r}, this side speaks "
                              f"{PROTOCOL_VERSION}")
    if not isinstance(message["op"], str):
        raise ControllerError("a controller message's 'op' must be a string")
    return message


def text_field(message: dict[str, Any], key: str, *, max_chars: int = MAX_NAME_CHARS) -> str:
    value = message.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= max_chars:
        raise ControllerError(f"{message['op']}: {key!r} must be a string of 1..{max_chars} characters")
    return value


def int_field(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ControllerError(f"{what} must be an integer in {low}..{high}, got {str(value)[:40]}")
    return value


def versions_field(message: dict[str, Any], key: str = "have") -> dict[str, int]:
    """A ``{collective: version}`` mapping (at most 16 entries, versions 0..2**63-1)."""
    value = message.get(key, {})
    if not isinstance(value, dict) or len(value) > 16:
        raise ControllerError(f"{message['op']}: {key!r} must be a mapping of at most 16 collectives to versions")
    return {str(kind)[:MAX_NAME_CHARS]: int_field(version, f"{key}[{str(kind)[:20]!r}]", 0, _INT64)
            for kind, version in value.items()}


def telemetry_message(samples: Sequence[Any], calls: Any = None) -> bytes:
    """Encode samples (anything with the fields of ``mccl.telemetry.Sample``); a sample whose seconds or
    end time is not finite is left out (the service would refuse the whole message for it). ``calls``:
    a rank's call totals (anything with the fields of ``mccl.runtime.calls.CallTotals``), or None."""
    rows = [_row(s) for s in finite_samples(samples)]
    if calls is None:
        return encode("telemetry", samples=rows)
    return encode("telemetry", samples=rows, calls=calls_field(calls))


def _row(sample: Any) -> list[Any]:
    """One sample as a wire row: 8 fields, or 10 when it names its schedule (collective, version)."""
    row = [sample.kind, sample.communicator, int(sample.rank), int(sample.peer), int(sample.bytes),
           float(sample.seconds), float(sample.end_time), int(sample.seq)]
    collective, version = getattr(sample, "collective", ""), int(getattr(sample, "version", -1))
    if collective or version != -1:
        row += [collective, version]
    return row


def calls_field(totals: Any) -> dict[str, Any]:
    """The ``calls`` field of a telemetry message; when a rank has more than ``MAX_CALL_ROWS`` (operation,
    path, version) rows, the rows of its newest schedule versions and its delegated rows are kept."""
    rows = sorted(([op, path, version, int(count)] for (op, path, version), count in totals.counts.items()),
                  key=lambda row: (row[2] is not None, -(row[2] or 0)))
    return {"communicator": totals.communicator, "rank": int(totals.rank), "counts": rows[:MAX_CALL_ROWS]}


def calls_of(message: dict[str, Any]) -> CallReport | None:
    """The checked ``calls`` field of a telemetry message, or None when it has none; ControllerError naming
    what is wrong (every field type- and range-checked, as for samples)."""
    if "calls" not in message:
        return None
    field = message["calls"]
    if not isinstance(field, dict):
        raise ControllerError("a telemetry message's 'calls' must be an object {communicator, rank, counts}")
    communicator = field.get("communicator")
    if not isinstance(communicator, str) or not 0 < len(communicator) <= MAX_NAME_CHARS:
        raise ControllerError(f"calls: 'communicator' must be a string of 1..{MAX_NAME_CHARS} characters")
    rank = int_field(field.get("rank"), "calls: 'rank'", 0, MAX_RANKS)
    rows = field.get("counts")
    if not isinstance(rows, list) or len(rows) > MAX_CALL_ROWS:
        raise ControllerError(f"calls: 'counts' must be a list of at most {MAX_CALL_ROWS} rows")
    counts = []
    seen = set()
    for row in rows:
        if not isinstance(row, list) or len(row) != 4:
            raise ControllerError("calls: a row is a list of 4 fields [op, path, version, count]")
        op, path, version, count = row
        if not isinstance(op, str) or not 0 < len(op) <= MAX_NAME_CHARS:
            raise ControllerError(f"calls: a row's op must be a string of 1..{MAX_NAME_CHARS} characters")
        if path == _SCHEDULE:
            int_field(version, f"calls: the schedule version of {op[:40]!r}", 0, _INT64)
        elif path == _DELEGATED:
            if version is not None:
                raise ControllerError(f"calls: a delegated row of {op[:40]!r} has no version (null), got "
                                      f"{str(version)[:40]}")
        else:
            raise ControllerError(f"calls: a row's path must be {_SCHEDULE!r} or {_DELEGATED!r}, got "
                                  f"{str(path)[:40]!r}")
        int_field(count, f"calls: the count of {op[:40]!r}", 1, _INT64)
        if (op, path, version) in seen:
            raise ControllerError(f"calls: {op[:40]!r} {path} {version} appears twice")
        seen.add((op, path, version))
        counts.append((op, path, version, count))
    return communicator, rank, counts


def finite_samples(samples: Sequence[Any]) -> list[Any]:
    """The samples whose seconds and end time are finite (JSON cannot carry the others)."""
    return [s for s in samples if math.isfinite(s.seconds) and math.isfinite(s.end_time)]


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN; decode() refuses it)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    return value


def _number(value: Any, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ControllerError(f"a telemetry row's {what} must be a number in [{low:g}, {high:g}], got "
                              f"{str(value)[:40]}")
    return float(value)


def _row_ok(row: Any) -> bool:
    """The fast check of one telemetry row (exact types: a bool is not a rank); see _explain."""
    if type(row) is not list or len(row) not in (8, 10):
        return False
    kind, comm, rank, peer, nbytes, seconds, end, seq = row[:8]
    return (kind in _KINDS and type(comm) is str and 0 < len(comm) <= MAX_NAME_CHARS
            and type(rank) is int and 0 <= rank <= MAX_RANKS and type(peer) is int and -1 <= peer <= MAX_RANKS
            and type(nbytes) is int and 0 <= nbytes <= 1 << 50 and type(seq) is int and 0 <= seq <= _INT64
            and type(seconds) in (int, float) and 1e-9 <= seconds <= 1e6
            and type(end) in (int, float) and 0.0 <= end <= 1e12
            and (kind != COLLECTIVE or (peer == -1 and nbytes > 0))
            and (len(row) == 8 or (type(row[8]) is str and len(row[8]) <= MAX_NAME_CHARS
                                   and type(row[9]) is int and -1 <= row[9] <= _INT64)))


def _explain(row: Any) -> ControllerError:
    """What is wrong with a row _row_ok refused (the slow path, for the error message)."""
    if not isinstance(row, list) or len(row) not in (8, 10):
        return ControllerError("a telemetry row is a list of 8 fields [kind, communicator, rank, peer, bytes, "
                               "seconds, end_time, seq], or 10 with [..., collective, version]")
    kind, comm, rank, peer, nbytes, seconds, end, seq = row[:8]
    try:
        if kind not in _KINDS:
            raise ControllerError(f"a telemetry row's kind must be {INTER!r}, {INTRA!r} or {COLLECTIVE!r}, got "
                                  f"{str(kind)[:40]!r}")
        if not isinstance(comm, str) or not 0 < len(comm) <= MAX_NAME_CHARS:
            raise ControllerError(f"a telemetry row's communicator must be a string of 1..{MAX_NAME_CHARS} "
                                  "characters")
        int_field(rank, "a telemetry row's rank", 0, MAX_RANKS)
        int_field(peer, "a telemetry row's peer", -1, MAX_RANKS)
        int_field(nbytes, "a telemetry row's bytes", 0, 1 << 50)
        _number(seconds, "seconds", 1e-9, 1e6)
        _number(end, "end_time", 0.0, 1e12)
        int_field(seq, "a telemetry row's seq", 0, _INT64)
        if kind == COLLECTIVE and peer != -1:
            raise ControllerError(f"a {COLLECTIVE!r} telemetry row is one rank's whole collective: its peer must "
                                  f"be -1, got {peer}")
        if kind == COLLECTIVE and nbytes <= 0:
            raise ControllerError(f"a {COLLECTIVE!r} telemetry row's bytes (the collective's size S) must be "
                                  f"positive, got {nbytes}")
        if len(row) == 10:
            if not isinstance(row[8], str) or len(row[8]) > MAX_NAME_CHARS:
                raise ControllerError(f"a telemetry row's collective must be a string of at most {MAX_NAME_CHARS} "
                                      "characters")
            int_field(row[9], "a telemetry row's version", -1, _INT64)
    except ControllerError as error:
        return error
    return ControllerError("a telemetry row is malformed")


def samples_of(message: dict[str, Any]) -> list[Sample]:
    """The samples of a telemetry message, every field type- and range-checked (the EWMAs take them)."""
    rows = message.get("samples")
    if not isinstance(rows, list):
        raise ControllerError("a telemetry message needs a 'samples' list")
    if len(rows) > MAX_SAMPLES_PER_MESSAGE:
        raise ControllerError(f"a telemetry message of {len(rows)} samples (at most {MAX_SAMPLES_PER_MESSAGE})")
    samples = []
    append = samples.append
    for row in rows:
        if not _row_ok(row):
            raise _explain(row)
        if len(row) == 8:
            kind, comm, rank, peer, nbytes, seconds, end, seq = row
            append(Sample(kind, comm, rank, peer, nbytes, float(seconds), float(end), seq))
        else:
            kind, comm, rank, peer, nbytes, seconds, end, seq, collective, version = row
            append(Sample(kind, comm, rank, peer, nbytes, float(seconds), float(end), seq, collective, version))
    return samples
