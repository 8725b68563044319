"""The `sshd` fixture shared by the lab tests (import it: `from lab.sshd_helper import sshd`): a real OpenSSH
server on 127.0.0.1 with throw-away keys. Not a conftest.py: tests import `free_port` from tests/conftest.py
as `conftest`, which a second conftest module would shadow."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from peercache.lab.launch.hosts import LocalHost

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """(port, client key, known_hosts) of an sshd on 127.0.0.1, stopped at teardown."""
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip(f"{SSHD} or ssh-keygen missing (apt-get install openssh-server openssh-client)")
    if os.geteuid() != 0:
        pytest.skip("the test sshd logs in as the current user only when run as root here")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("hostkey", "clientkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "clientkey.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    (d / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nHostKey {d}/hostkey\nAuthorizedKeysFile {d}/authorized_keys\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile none\n")
    os.makedirs("/run/sshd", exist_ok=True)  # privilege-separation dir sshd insists on
    port = _free_port()
    with open(d / "sshd.log", "wb") as log:  # the child keeps its own copy of the fd
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config"), "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 10
    while not LocalHost().is_port_open("127.0.0.1", port) and time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"sshd cannot run here: {(d / 'sshd.log').read_text()[-400:]}")
        time.sleep(0.05)
    if proc.poll() is not None or not LocalHost().is_port_open("127.0.0.1", port):
        proc.kill()
        pytest.skip(f"sshd did not listen: {(d / 'sshd.log').read_text()[-400:]}")
    try:
        yield port, str(d / "clientkey"), str(d / "known_hosts")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)
