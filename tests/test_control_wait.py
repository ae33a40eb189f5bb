"""``wait_for_controller``: what a launcher sees while the controller it started is not answering (a real ZeroMQ
client against a port nobody serves)."""

from __future__ import annotations

import time

import pytest

from mccl.control.client import wait_for_controller
from mccl.errors import ControllerError
from mccl.runtime.launch import free_port


def test_a_controller_that_never_answers_is_named_with_the_whole_wait():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(ControllerError, match=r"did not answer within 1\.5 s \(last attempt: .*'status'"):
        wait_for_controller(endpoint, timeout_s=1.5)


def test_a_controller_process_that_died_fails_at_once_not_after_the_timeout():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ControllerError, match="exited before it answered"):
        wait_for_controller(endpoint, timeout_s=60.0, alive=lambda: False)
    assert time.monotonic() - start < 10.0
