"""The controller's parser process: a large message's GIL-holding work, away from the service's threads.

Why a process (issue 13, "polls are answered within 100 ms whatever else arrives"): the
service's socket thread answers polls, and any thread of the service's process that runs a
long C call holds the GIL and stalls it. For a 38 MiB ``register`` (1.2 M transfers) the
work is, measured 2026-12-01 on an idle core: ``json.loads`` ~2 s (one C call),
``loads_schedule``'s columns, re-encoding the canonical text the ranks fetch ~1.7 s,
``validate`` ~0.3 s, ``overlay_map`` ~0.45 s (numpy calls of 20–100 ms each), the poll
reply that serves the text ~0.16 s (``json.dumps`` of a 38 MiB string: one C call). All of
it happens here, in one spawned helper process that holds the manager's topology (sent once,
when it starts). What comes back: the schedule's and the prepared arrays, pickled (~10 ms to
unpickle for 38 MiB), and the encoded reply through a temporary file, read with the GIL
released (unpickled, the 38 MiB reply alone held the GIL ~30 ms, and a text for the manager
another ~35: the manager does not get one, the service serves the reply, and the manager would
encode its text only if someone asked ``latest()``).

A message that fails here (not JSON, an invalid schedule) raises in the helper and the
exception is re-raised in the caller, as if parsed in place. A helper that dies (out of
memory) is replaced for the next message.

The temporary files live in one directory per parser, named after the service's pid
(``mccl-parser-<pid>-*``): :meth:`ParserProcess.close` removes it, and a parser that starts
removes the directories of services that no longer run (a service killed mid-parse left
its 38 MiB frame behind, until now for good).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mccl.control.prepared import PreparedSchedule, prepare
from mccl.control.protocol import decode, encode
from mccl.errors import ControllerError
from mccl.schedule import Schedule, dumps_schedule, loads_schedule
from mccl.topology import Topology

__all__ = ["ParsedRegistration", "ParserProcess", "parse_message"]


@dataclass(frozen=True)
class ParsedRegistration:
    """A ``register`` message's schedule, parsed and prepared by the helper process."""

    schedule: Schedule
    reply: bytes  # the ``schedule`` poll reply serving the schedule's canonical text at its own version
    prepared: PreparedSchedule  # validated; overlay map and profile on the manager's topology


class ParserProcess:
    """One helper process (spawned on the first message it is given) that parses with ``topology``."""

    def __init__(self, topology: Topology, max_message_bytes: int) -> None:
        self.topology = topology
        self.max_message_bytes = max_message_bytes
        self._executor: ProcessPoolExecutor | None = None
        self._directory: str | None = None

    def _scratch(self) -> str:
        """This parser's directory for frames and replies (made on first use, after sweeping dead services')."""
        if self._directory is None or not os.path.isdir(self._directory):
            sweep_stale_directories()
            self._directory = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
        return self._directory

    def parse(self, frame: bytes | memoryview) -> tuple[dict[str, Any], ParsedRegistration | None]:
        """:func:`parse_message` of ``frame`` in the helper process (blocks the calling thread only). The frame
        goes through a temporary file, written with the GIL released (pickled to the helper, 38 MiB held the
        GIL ~30 ms; the service hands over libzmq's buffer without copying it)."""
        if self._executor is None:
            self._executor = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start, initargs=(self.topology,))
        scratch = self._scratch()
        descriptor, frame_path = tempfile.mkstemp(prefix="mccl-message-", dir=scratch)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(frame)
            message, parsed = self._executor.submit(_parse_in_helper, frame_path, self.max_message_bytes,
                                                    scratch).result()
        except BrokenProcessPool:  # the helper died (memory?): a fresh one for the next message
            self._executor = None
            raise ControllerError("the controller could not parse that message (its parser process died)") from None
        except OSError as error:
            raise ControllerError(f"the controller could not hand that message to its parser: {error}") from None
        finally:
            Path(frame_path).unlink(missing_ok=True)
        if parsed is None:
            return message, None
        schedule, prepared, reply_path = parsed
        try:
            reply = Path(reply_path).read_bytes()  # the read releases the GIL
        except OSError as error:
            raise ControllerError(f"the controller could not read its parser's reply: {error}") from None
        finally:
            Path(reply_path).unlink(missing_ok=True)
        return message, ParsedRegistration(schedule, reply, prepared)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


SCRATCH_PREFIX = "mccl-parser-"
_SCRATCH_NAME = re.compile(re.escape(SCRATCH_PREFIX) + r"(\d+)-")


def sweep_stale_directories(parent: str | None = None) -> list[str]:
    """Remove the scratch directories of parsers whose service process no longer exists; the removed paths."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        match = _SCRATCH_NAME.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        path = os.path.join(parent, name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def parse_message(frame: bytes, max_bytes: int, topology: Topology) -> tuple[dict[str, Any], ParsedRegistration | None]:
    """The decoded message (bounded, :func:`.protocol.decode`) and, for a ``register`` whose schedule is a
    file's text, that schedule parsed, validated on ``topology`` and prepared for the manager."""
    message = decode(frame, max_bytes=max_bytes)
    text = message.get("schedule")
    if message["op"] != "register" or not isinstance(text, str):
        return message, None
    schedule = loads_schedule(text)
    message["schedule"] = None  # the 38 MiB text is not sent back: the registration holds the schedule
    prepared = prepare(schedule, topology)
    reply = encode("schedule", collective=schedule.collective.value, version=int(schedule.meta.version),
                   schedule=dumps_schedule(schedule))
    return message, ParsedRegistration(schedule, reply, prepared)


_TOPOLOGY: Topology | None = None  # in the helper process: the manager's topology


HELPER_NICENESS = 10
"""How much lower the helper's CPU priority is than the service's: on a loaded host its seconds of parsing
must not take the CPU from the socket thread's polls (a registration may take longer instead)."""


def _start(topology: Topology) -> None:
    global _TOPOLOGY
    _TOPOLOGY = topology
    with contextlib.suppress(OSError):
        os.nice(HELPER_NICENESS)


def _parse_in_helper(frame_path: str, max_bytes: int, scratch: str) -> tuple[dict[str, Any], tuple[Schedule, PreparedSchedule, str] | None]:
    """In the helper: the message, and a registration's (schedule, prepared, path of a file holding the reply)."""
    assert _TOPOLOGY is not None, "the parser process was started without a topology"
    message, parsed = parse_message(Path(frame_path).read_bytes(), max_bytes, _TOPOLOGY)
    if parsed is None:
        return message, None
    descriptor, path = tempfile.mkstemp(prefix="mccl-reply-", dir=scratch)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(parsed.reply)
    return message, (parsed.schedule, parsed.prepared, path)
