"""ssh hosts against a real OpenSSH server started on 127.0.0.1 with throw-away keys:
commands, readiness, remote process-group cleanup on stop, timeout, lost session
and Ctrl-C, and a pair run across the ssh host."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
import socket
import subprocess
import threading
import _thread
import time

import pytest

from peercache.lab.launch.hosts import CommandTimeout, HostError, LocalHost, SshHost, parse_host
from peercache.lab.launch.runners import PairFailed, PairRunner, Readiness, SideSpec

from lab.launch.test_hosts import assert_none_left, marker, procs_with, py
from lab.sshd_helper import sshd  # noqa: F401 (the fixture)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The `sshd` fixture (a real OpenSSH server on 127.0.0.1 with throw-away keys) is in tests/lab/sshd_helper.py.


@pytest.fixture
def host(sshd):
    port, key, kh = sshd
    h = parse_host(f"ssh:root@127.0.0.1:{port}", identity=key, known_hosts=kh)
    try:
        yield h
    finally:
        h.close()


def test_ssh_run_reuses_one_master(host):
    c = host.run(["sh", "-c", "echo 'a b'; echo err >&2; exit 3"], timeout=20)
    assert (c.rc, c.stdout, c.stderr) == (3, "a b\n", "err\n")  # wrapper line not shown
    sock = os.listdir(os.path.dirname(host.control_path))
    assert any(len(n) == 40 for n in sock), f"no control socket in {sock}"
    t = time.monotonic()
    assert host.run(["true"], timeout=20).rc == 0
    assert time.monotonic() - t < 2  # multiplexed: no new handshake
    assert host.which("sh") and not host.which("pclab-no-such-tool")


def test_ssh_wrong_key_is_a_clear_error(sshd, tmp_path):
    port, _key, kh = sshd
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    h = SshHost("root@127.0.0.1", port=port, identity=str(tmp_path / "other"), known_hosts=kh)
    try:
        with pytest.raises(HostError) as e:
            h.run(["true"], timeout=20)
    finally:
        h.close()
    msg = str(e.value)
    assert "authentication failed (permission denied): 127.0.0.1 accepted no key of this machine" in msg, msg
    assert "Permission denied (publickey" in msg and "ssh-copy-id user@127.0.0.1" in msg, msg


def test_ssh_changed_host_key_is_told_apart_from_a_refused_login(sshd, tmp_path):
    """A known_hosts that holds another key for the server: host key verification fails, and the message
    says how to drop the old key."""
    port, key, _kh = sshd
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")], check=True)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{port} " + " ".join((tmp_path / "impostor.pub").read_text().split()[:2]) + "\n")
    h = SshHost("root@127.0.0.1", port=port, identity=key, known_hosts=str(kh), strict_host_key_checking="yes")
    try:
        with pytest.raises(HostError) as e:
            h.run(["true"], timeout=20)
    finally:
        h.close()
    msg = str(e.value)
    assert "host key verification failed: 127.0.0.1's key is not the one known_hosts holds" in msg, msg
    assert f"ssh-keygen -f {kh} -R '[127.0.0.1]:{port}'" in msg and "permission denied" not in msg, msg


def test_ssh_stop_kills_the_remote_group(host):
    m = marker()
    h = host.start(["sh", "-c", f"sleep 60 & python3 -c 'import time; print(\"up\", flush=True); time.sleep(60)' {m}; wait"])
    h.wait_for("^up$", 15)
    pgid = h.remote_pgid()
    assert pgid in [pid for pid, _ in procs_with(m)]  # the remote group leader is the wrapped sh
    t = time.monotonic()
    h.stop(grace=1)
    assert time.monotonic() - t < 5
    assert_none_left(m)


def test_ssh_remote_group_dies_when_local_ssh_is_killed(host):
    m = marker()
    h = host.start(["python3", "-c", "import time; print('up', flush=True); time.sleep(60)", m])
    h.wait_for("^up$", 15)
    os.killpg(h.pgid, 9)  # the local client vanishes without any cleanup
    assert_none_left(m, within=8)  # the remote watchdog saw the session end
    h.stop(grace=0.5)


def test_ssh_timeout_leaves_nothing(host):
    m = marker()
    with pytest.raises(CommandTimeout):
        host.run(["python3", "-c", "import time; time.sleep(60)", m], timeout=1)
    assert_none_left(m)


def test_ssh_pair_run_and_ctrl_c(host):
    m = marker()
    local = LocalHost()
    port = _free_port()
    # server on the ssh host, readiness by its listening port seen over ssh
    srv = ["python3", "-c", "import socket,sys,time; s=socket.socket(); "
           "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
           f"s.bind(('127.0.0.1', {port})); s.listen(); c,_=s.accept(); "
           "print(len(c.recv(100))); time.sleep(0.1)", m]
    cli = py(f"import socket; s=socket.create_connection(('127.0.0.1', {port})); s.sendall(b'x'*10)", m)
    r = PairRunner(SideSpec(host, srv), SideSpec(local, cli),
                   Readiness(port=port, addr="127.0.0.1", timeout=15), client_timeout=20).run()
    assert r.ok and r.server.stdout == "10\n" and r.server.host == host.spec
    assert_none_left(m)
    # Ctrl-C while the remote server and the client run: both sides end
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            PairRunner(SideSpec(host, ["python3", "-c", "import time; print('ready', flush=True); time.sleep(60)", m]),
                       SideSpec(host, ["python3", "-c", "import time; time.sleep(60)", m]),
                       Readiness(pattern="^ready$", timeout=15), client_timeout=30, grace=1).run()
    finally:
        timer.cancel()
    assert_none_left(m, within=5)


def test_ssh_server_crash_fails_pair_and_cleans_up(host):
    m = marker()
    with pytest.raises(PairFailed, match="rc 9"):
        PairRunner(SideSpec(host, ["python3", "-c", "import sys; print('ready', flush=True); "
                                   "import time; time.sleep(0.3); sys.exit(9)", m]),
                   SideSpec(host, ["python3", "-c", "import time; time.sleep(60)", m]),
                   Readiness(pattern="^ready$", timeout=15), client_timeout=30, grace=1).run()
    assert_none_left(m)


def test_ssh_control_dir_shares_one_master_among_processes(sshd, tmp_path, monkeypatch):
    """$PEERCACHE_SSH_CONTROL_DIR: the first process starts the master, the next joins it, and a
    process's close() leaves it for the run's next one; a stopped command's group still dies."""
    port, key, kh = sshd
    mux = Path(tempfile.mkdtemp(prefix="pcmux-"))          # short: the socket path must fit sun_path
    monkeypatch.setenv("PEERCACHE_SSH_CONTROL_DIR", str(mux))
    with pytest.raises(HostError, match="would not fit a Unix socket path"):
        parse_host(f"ssh:root@127.0.0.1:{port}", control_dir=tmp_path / ("x" * 60))
    spec = f"ssh:root@127.0.0.1:{port}"
    first = parse_host(spec, identity=key, known_hosts=kh)
    assert first.run(["true"], timeout=20).rc == 0
    first.close()
    sockets = [n for n in os.listdir(mux) if len(n) == 40]
    assert len(sockets) == 1, os.listdir(mux)
    masters = procs_with(f"{mux}/")
    assert len(masters) == 1, masters                      # the master outlived close()
    # Another process, as a pipeline's next job would be.
    code = ("import sys, time; from peercache.lab.launch.hosts import parse_host; "
            f"h = parse_host({spec!r}, identity={key!r}, known_hosts={kh!r}); "
            "t = time.monotonic(); c = h.run(['echo', 'hi'], timeout=20); h.close(); "
            "print(c.rc, c.stdout.strip(), round(time.monotonic() - t, 2))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("0 hi "), out
    assert procs_with(f"{mux}/") == masters                # joined the master, started none
    m = marker()
    second = parse_host(spec, identity=key, known_hosts=kh)
    h = second.start(["python3", "-c", "import time; print('up', flush=True); time.sleep(60)", m])
    h.wait_for("^up$", 15)
    h.stop(grace=1)
    assert_none_left(m)
    subprocess.run(["ssh", "-o", f"ControlPath={mux}/%C", "-p", str(port), "-O", "exit", "root@127.0.0.1"],
                   capture_output=True, timeout=15)
    shutil.rmtree(mux, ignore_errors=True)
