"""The controller's wire messages: small versioned JSON documents over ZeroMQ.

One endpoint (a ROUTER socket in the service); every client connects two DEALER
sockets to it, one for telemetry (send only) and one for requests (see
:mod:`.service` for why). Every message is one frame of UTF-8 JSON with ``"v"``
(protocol version) and ``"op"``:

* ``telemetry`` — ``samples``: rows ``[kind, communicator, rank, peer, bytes, seconds,
  end_time, seq]`` (the fields of ``mccl.telemetry.Sample``); no reply.
* ``poll`` — ``communicator``, ``rank``, ``have`` ({collective: version}); reply
  ``schedule`` (``collective``, ``version``, ``schedule``: a schedule file's JSON
  text, :func:`mccl.schedule.dumps_schedule`) when a newer version is active, else
  ``idle`` (``versions``).
* ``register`` — ``communicator``, ``schedule`` (file text); reply ``ok`` (``version``).
* ``status`` — reply ``status`` (``events``, ``stats``).
* ``stop`` — reply ``ok``; the service ends.
* any failure — reply ``error`` (``message``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mccl.errors import ControllerError
from mccl.telemetry import Sample

__all__ = ["PROTOCOL_VERSION", "encode", "decode", "telemetry_message", "samples_of"]

PROTOCOL_VERSION = 1


def encode(op: str, **fields: Any) -> bytes:
    return json.dumps({"v": PROTOCOL_VERSION, "op": op, **fields}, separators=(",", ":")).encode()


def decode(frame: bytes) -> dict[str, Any]:
    """A message as a dict; ControllerError naming what is wrong with it."""
    try:
        message = json.loads(frame)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ControllerError(f"a controller message is not JSON: {error}") from None
    if not isinstance(message, dict) or "op" not in message:
        raise ControllerError("a controller message must be a JSON object with an 'op'")
    if message.get("v") != PROTOCOL_VERSION:
        raise ControllerError(f"controller protocol version {message.get('v')!r}, this side speaks {PROTOCOL_VERSION}")
    return message


def telemetry_message(samples: Sequence[Any]) -> bytes:
    """Encode samples (anything with the fields of ``mccl.telemetry.Sample``)."""
    rows = [[s.kind, s.communicator, int(s.rank), int(s.peer), int(s.bytes), float(s.seconds), float(s.end_time),
             int(s.seq)] for s in samples]
    return encode("telemetry", samples=rows)


def samples_of(message: dict[str, Any]) -> list[Sample]:
    rows = message.get("samples")
    if not isinstance(rows, list):
        raise ControllerError("a telemetry message needs a 'samples' list")
    try:
        return [Sample(str(kind), str(comm), int(rank), int(peer), int(nbytes), float(seconds), float(end), int(seq))
                for kind, comm, rank, peer, nbytes, seconds, end, seq in rows]
    except (TypeError, ValueError) as error:
        raise ControllerError(f"a telemetry row is malformed: {error}") from None
