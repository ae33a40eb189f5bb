"""A client whose secret is not the controller's is told so at once, instead of waiting out its
timeout for "did not answer" (sixth session, by hand: `mccl controller-status --secret-file` of
another job's key). libzmq reports the refused CURVE handshake on the client's socket monitor."""

from __future__ import annotations

import time

import pytest

from mccl.control import ControllerClient, ControllerService, ScheduleManager
from mccl.control.auth import new_secret
from mccl.errors import ControllerError
from mccl.topology import single_switch

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("secret", ["another job's", "none"])
def test_a_refused_handshake_is_named_before_the_timeout(secret, monkeypatch):
    monkeypatch.delenv("MCCL_CONTROL_SECRET_FILE", raising=False)
    monkeypatch.delenv("MCCL_CONTROL_SECRET", raising=False)
    service = ControllerService(ScheduleManager(single_switch(4, 100)), "tcp://127.0.0.1:*").start()
    client = ControllerClient(service.address, "status", -1, secret=new_secret() if secret != "none" else None)
    try:
        start = time.monotonic()
        with pytest.raises(ControllerError, match="refused this client's handshake"):
            client.request("status", timeout_s=20)
        assert time.monotonic() - start < 10  # not the 20 s timeout
        right = ControllerClient(service.address, "status", -1, secret=service.secret)
        try:
            assert right.request("status")["stats"]["auth_failures"] >= 1  # the service kept serving
        finally:
            right.close()
    finally:
        client.close()
        service.stop()
