"""The wire protocol between a tenant's shim and the provider service: one JSON object per ZeroMQ frame.

Two sockets per tenant process. The service's main endpoint (a ROUTER) takes ``hello`` and
``status``; ``hello`` opens a *session* and answers with the session's own endpoint (a ROUTER
that one service thread owns, bound in the service's private run directory), where every other
request of that tenant process goes: the thread that answers is the thread that runs the
collective, so a collective costs one round trip and no hand-off between threads.

Requests (every one carries ``"v"``, ``"op"`` and an integer ``"id"`` that the reply echoes):

* ``hello`` — reply ``session`` (``endpoint``, ``host``, ``hosts``, ``tenant``).
* ``status`` — reply ``status`` (``stats``: the service's counters).
* ``alloc`` (``nbytes``) — reply ``allocation`` (``alloc``, ``path``, ``nbytes``); the tenant maps
  ``path`` and sends ``attached`` (``alloc``), after which the service unlinks the name.
* ``free`` (``alloc``) — reply ``ok``.
* ``join`` (``job``: a name, ``hosts``: the service ranks the job spans, in its rank order) —
  reply ``joined`` (``comm``, ``rank``, ``size``); every host's tenant of the job must join.
* ``collective`` (``comm``, ``kind``, ``dtype``, ``refs``: buffer references, ``reduce``) —
  reply ``ok``. ``kind`` and its references: ``all_gather`` [output, input], ``reduce_scatter``
  [output, input], ``all_reduce`` [tensor], ``all_to_all`` [output, input] (even blocks).
* ``channel`` (optional ``warm``: a bool, default false) — reply ``channel`` (``request``, ``reply``: the paths
  of the tenant's ends of the session's pipe pair, :mod:`.channel`); the tenant opens them and sends
  ``channel_attached``, after which collectives may go as binary frames on the pipes (the fast path: same
  checks, no ZeroMQ per call).
* ``warm`` (``on``: a bool) — reply ``ok``; whether the session's fast-path requests keep the service's CPUs
  out of deep idle (:mod:`.keepwarm`).
* ``direct`` (``on``: a bool) — reply ``ok``; whether the session's one-host (world-1) jobs run their collectives
  as copies in the service's thread (:mod:`.direct`; the default) or all on gloo.
* ``bye`` — reply ``ok``; the session ends (so does a dropped connection).
* any failure — reply ``error`` (``error``: the class name of :mod:`.errors`, ``message``).
"""

from __future__ import annotations

import json
from typing import Any

from mccl.provider.errors import BadRequest, ProviderError

__all__ = ["PROTOCOL_VERSION", "MAX_MESSAGE_BYTES", "DTYPES", "REDUCTIONS", "KINDS", "encode", "decode", "decode_reply",
           "error_reply", "name_field", "int_field", "hosts_field"]

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 64 << 10  # a request is a few references; libzmq drops a peer that sends more (ZMQ_MAXMSGSIZE)
MAX_NAME_CHARS = 128
MAX_HOSTS = 4096
# element types a tenant may name, with their sizes (torch's names; the service maps them to torch dtypes)
DTYPES: dict[str, int] = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
                          "int16": 2, "int8": 1, "uint8": 1}
REDUCTIONS = ("sum", "prod", "min", "max", "avg")
# collective kind -> the names of its buffer references, in order
KINDS: dict[str, tuple[str, ...]] = {"all_gather": ("output", "input"), "reduce_scatter": ("output", "input"),
                                     "all_reduce": ("tensor",), "all_to_all": ("output", "input")}


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps({"v": PROTOCOL_VERSION, **message}, separators=(",", ":")).encode()


def decode(frame: bytes) -> dict[str, Any]:
    """A request as a dict with ``op`` (str) and ``id`` (int), or :class:`BadRequest` (never another error)."""
    if len(frame) > MAX_MESSAGE_BYTES:
        raise BadRequest(f"a message is at most {MAX_MESSAGE_BYTES} bytes, this one {len(frame)}")
    try:
        message = json.loads(frame, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise BadRequest(f"not a JSON message: {str(error)[:120]}") from None
    if not isinstance(message, dict):
        raise BadRequest("a message is a JSON object")
    if message.get("v") != PROTOCOL_VERSION:
        raise BadRequest(f"protocol version {message.get('v')!r} is not {PROTOCOL_VERSION}")
    if not isinstance(message.get("op"), str):
        raise BadRequest("a message names its operation in 'op'")
    message["id"] = int_field(message, "id", default=0)
    return message


def decode_reply(frame: bytes) -> dict[str, Any]:
    """A reply as the shim reads it (the service is trusted; only its shape is checked)."""
    try:
        reply = json.loads(frame)
    except ValueError:
        raise ProviderError("the provider service sent a reply that is not JSON") from None
    if not isinstance(reply, dict):
        raise ProviderError("the provider service sent a reply that is not a JSON object")
    return reply


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number this protocol accepts")


def int_field(message: dict[str, Any], key: str, *, low: int = 0, high: int = 2**63 - 1,
              default: int | None = None) -> int:
    value = message.get(key, default)
    if type(value) is not int or not low <= value <= high:
        raise BadRequest(f"'{key}' must be an integer in {low}..{high}, got {str(value)[:40]!r}")
    return value


def name_field(message: dict[str, Any], key: str) -> str:
    value = message.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS or not value.isprintable():
        raise BadRequest(f"'{key}' must be a printable name of 1..{MAX_NAME_CHARS} characters")
    return value


def hosts_field(message: dict[str, Any], hosts: int) -> tuple[int, ...]:
    value = message.get("hosts")
    if (not isinstance(value, list) or not 0 < len(value) <= min(hosts, MAX_HOSTS)
            or any(type(item) is not int or not 0 <= item < hosts for item in value) or len(set(value)) != len(value)):
        raise BadRequest(f"'hosts' must list distinct service ranks of 0..{hosts - 1}")
    return tuple(value)


def error_reply(request_id: int, error: ProviderError) -> dict[str, Any]:
    return {"op": "error", "id": request_id, "error": type(error).__name__, "message": str(error)}
