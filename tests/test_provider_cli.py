"""``mccl provider serve`` and ``mccl provider credential``."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mccl.cli.main import main
from mccl.control.auth import new_secret, write_secret_file
from mccl.provider.keys import read_credential, tenant_credential
from mccl.runtime.launch import free_port


def test_credential_needs_the_provider_secret_and_writes_a_private_file(tmp_path, capsys):
    assert main(["provider", "credential", "--secret-file", str(tmp_path / "none.key"), "--tenant", "a",
                 "--out", str(tmp_path / "a.key")]) == 2
    assert "no provider secret there" in capsys.readouterr().err
    secret = new_secret()
    write_secret_file(tmp_path / "provider.key", secret)
    assert main(["provider", "credential", "--secret-file", str(tmp_path / "provider.key"), "--tenant", "a",
                 "--out", str(tmp_path / "a.key")]) == 0
    assert stat.S_IMODE(os.stat(tmp_path / "a.key").st_mode) == 0o600
    assert read_credential(tmp_path / "a.key") == tenant_credential(secret, "a")
    assert main(["provider", "credential", "--secret-file", str(tmp_path / "provider.key"), "--tenant", "a",
                 "--out", str(tmp_path / "a.key")]) == 2  # never over an existing file


def test_serve_refuses_a_host_rank_outside_the_hosts(tmp_path, capsys):
    assert main(["provider", "serve", "--secret-file", str(tmp_path / "p.key"), "--tenant", "a", "--host", "1",
                 "--hosts", "1"]) == 2
    assert "--host 1 is not below --hosts 1" in capsys.readouterr().err


def test_serve_refuses_a_poll_window_out_of_range(tmp_path, capsys):
    from mccl.provider.service import ServiceConfig

    for bad in ("-1", "1000001", "2.5"):
        assert main(["provider", "serve", "--secret-file", str(tmp_path / "p.key"), "--tenant", "a",
                     "--poll-us", bad]) == 2
        assert "--poll-us" in capsys.readouterr().err
    assert not (tmp_path / "p.key").exists()
    for bad in (-1, 1_000_001, 2.5, True):
        with pytest.raises(ValueError, match="poll_us must be an integer of 0 to 1000000"):
            ServiceConfig(poll_us=bad)


def test_serve_refuses_a_bad_tenant_name_before_it_writes_the_secret(tmp_path, capsys):
    assert main(["provider", "serve", "--secret-file", str(tmp_path / "p.key"), "--tenant", "a", "--tenant", ""]) != 0
    assert "a tenant name is 1..128 printable characters, not ''" in capsys.readouterr().err
    assert not (tmp_path / "p.key").exists()


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_serve_runs_a_tenants_collective_and_cleans_up_on_sigterm(tmp_path):
    from mccl.provider.shim import Shim

    command = [sys.executable, "-m", "mccl.cli.main", "provider", "serve", "--secret-file", str(tmp_path / "p.key"),
               "--tenant", "alice", "--credentials-dir", str(tmp_path / "creds"), "--store",
               f"127.0.0.1:{free_port()}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = process.stdout.readline()
        found = re.search(r"at (ipc://\S+?);", line)
        assert found, line
        shim = Shim(found.group(1), read_credential(tmp_path / "creds" / "alice.key"), timeout_s=30)
        comm = shim.join("job", [0])
        x = shim.empty(8)
        x.fill_(3.0)
        comm.all_reduce(x, "max")
        assert x.tolist() == [3.0] * 8
        shim.close()
        run_dir = Path(found.group(1)[len("ipc://"):]).parent
        assert run_dir.is_dir()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert not run_dir.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
