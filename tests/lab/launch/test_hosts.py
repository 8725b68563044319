"""hosts: spec parsing, local/netns run and background handles, process-group cleanup."""
from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from peercache.lab.launch import netns
from peercache.lab.launch.hosts import (CommandTimeout, HostError, LocalHost, NetnsHost, ProcessExited,
                                 ReadyTimeout, SshHost, listening_on, parse_host)


def marker() -> str:
    return f"pclab-test-{uuid.uuid4().hex[:12]}"


def procs_with(mark: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose argv contains ``mark``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark in cmd and state != "Z":
            found.append((int(d.name), cmd))
    return found


def assert_none_left(mark: str, within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while procs_with(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs_with(mark) == [], f"processes left running: {procs_with(mark)}"


def py(code: str, mark: str) -> list[str]:
    """A Python one-liner whose argv carries ``mark`` (found later via /proc)."""
    return [sys.executable, "-c", code, mark]


# --- parsing --------------------------------------------------------------

def test_parse_kinds():
    assert isinstance(parse_host("local"), LocalHost)
    h = parse_host("netns:pc0a")
    assert isinstance(h, NetnsHost) and h.name == "pc0a" and h.spec == "netns:pc0a"
    assert h.wrap(["true"]) == ["ip", "netns", "exec", "pc0a", "true"]
    s = parse_host("ssh:alice@node1:2222", identity="/k", strict_host_key_checking="yes")
    try:
        assert isinstance(s, SshHost) and s.target == "alice@node1" and s.port == 2222
        argv = s.wrap(["echo", "a b"])
        for opt in ("BatchMode=yes", "StrictHostKeyChecking=yes", "ControlMaster=no"):
            assert opt in argv
        assert any(a.startswith("ControlPath=") for a in argv)
        assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/k"
        assert "'a b'" in argv[-1] and argv[-1].startswith("exec sh -c")
    finally:
        s.close()


@pytest.mark.parametrize("slow, seconds", [(None, 10), ("1", 10), ("17.6", 176)])
def test_ssh_connect_timeout_stretches_with_the_hosts_slowness(monkeypatch, slow, seconds):
    """ConnectTimeout (which also bounds sshd's banner) is 10 s, times PEERCACHE_SLOWNESS on emulated hosts."""
    if slow is None:
        monkeypatch.delenv("PEERCACHE_SLOWNESS", raising=False)
    else:
        monkeypatch.setenv("PEERCACHE_SLOWNESS", slow)
    s = parse_host("ssh:alice@node1")
    try:
        assert f"ConnectTimeout={seconds}" in s.wrap(["true"])
    finally:
        s.close()


@pytest.mark.parametrize("spec", ["", "  ", "remote", "netns:", "netns:a b", "ssh:",
                                  "ssh:user@", "ssh:u@h:99999", "ssh:u@h;rm", "docker:x"])
def test_bad_specs_say_what_to_use(spec):
    with pytest.raises(HostError) as e:
        parse_host(spec)
    assert "ssh" in str(e.value) or "port" in str(e.value) or "namespace" in str(e.value)


@pytest.mark.parametrize("spec", ["ssh:-oProxyCommand", "ssh:-Evil", "ssh:-E:22", "ssh:root@-oProxyCommand"])
def test_an_ssh_host_ssh_would_read_as_an_option_is_refused(spec):
    with pytest.raises(HostError) as e:
        parse_host(spec)
    msg = str(e.value)
    assert "starts with '-'" in msg and "not starting with '-'" in msg and "ssh:user@host" in msg, msg
    with pytest.raises(HostError, match="starts with '-'"):
        SshHost(spec.removeprefix("ssh:").removesuffix(":22"))     # built directly: the same rule


def test_every_ssh_argv_ends_its_options_before_the_destination(tmp_path):
    """`--` precedes the destination in every ssh the host runs (master, check, command, stop,
    exit) and in the argvs it hands out: a destination is never read as an option."""
    calls = tmp_path / "calls"
    fake = tmp_path / "ssh"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    fake.chmod(0o755)
    h = SshHost("alice@box", port=2222, identity="/k", extra_options=["ServerAliveInterval=5"], ssh=str(fake))
    try:
        assert h.run(["echo", "a b"], timeout=20).rc == 0
        h._master_alive()
    finally:
        h.close()
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    argvs += [h.ssh_argv(["true"])[1:], h.wrap(["true"])[1:]]
    kinds = {"-M" in a or "-O" in a for a in argvs}
    assert len(argvs) >= 5 and kinds == {True, False}, argvs          # master/control and commands
    for a in argvs:
        assert "--" in a and a[a.index("--") + 1] == "alice@box" and a.count("alice@box") == 1, a


def test_ssh_refuses_prompting_host_key_mode():
    with pytest.raises(HostError, match="prompt"):
        SshHost("u@h", strict_host_key_checking="ask")


def test_listening_on_parses_ss_output():
    out = ("LISTEN 0 4096 127.0.0.1:5399 0.0.0.0:*\n"
           "LISTEN 0 128 0.0.0.0:22 0.0.0.0:*\n"
           "LISTEN 0 128 [::]:8080 [::]:*\n"
           "LISTEN 0 10 127.0.0.53%lo:53 0.0.0.0:*\n")
    assert listening_on(out, "127.0.0.1", 5399)
    assert not listening_on(out, "198.18.0.1", 5399)
    assert listening_on(out, "198.18.0.1", 22)          # wildcard
    assert listening_on(out, None, 8080)
    assert listening_on(out, "127.0.0.53", 53)
    assert not listening_on(out, None, 539)


# --- local ------------------------------------------------------------------

def test_local_run_captures_everything():
    c = LocalHost().run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (c.rc, c.stdout, c.stderr) == (3, "out\n", "err\n")
    assert c.argv == c.command and c.end >= c.start and c.start_iso.endswith("+00:00")


def test_local_run_timeout_kills_the_group():
    m = marker()
    # The shell forks a child that would outlive a kill of the leader alone.
    with pytest.raises(CommandTimeout) as e:
        LocalHost().run(["sh", "-c", f"sleep 30 & {sys.executable} -c 'import time; time.sleep(30)' {m}; wait"],
                        timeout=0.5)
    assert e.value.completed.timed_out
    assert_none_left(m)
    assert_none_left("sleep 30 & ")


def test_handle_wait_for_and_log(tmp_path):
    m = marker()
    log = tmp_path / "srv.log"
    h = LocalHost().start(py("import sys,time; print('partial', end='', flush=True); time.sleep(0.3);"
                             "print(' ready', flush=True); time.sleep(30)", m), log_path=log)
    try:
        match = h.wait_for(r"partial ready", timeout=5)
        assert match and h.running and h.returncode is None
    finally:
        rc = h.stop(grace=1)
    assert rc == -15 and h.stopped
    assert "partial ready" in log.read_text()
    assert_none_left(m)


def test_a_line_buffered_process_lines_arrive_when_printed():
    from peercache.lab.launch.runners import SideResult, arrival
    h = LocalHost().start(py("import time; print('first', flush=True); time.sleep(0.5); print('second', flush=True)",
                             marker()))
    h.wait(10)
    side = SideResult(role="client", host="local", command=[], argv=[], numa_binding={}, stdout=h.stdout,
                      stdout_arrivals=h.arrivals("stdout"))
    first, second = side.stdout_line_at(1), side.stdout_line_at(2)
    assert h.start_time <= first and second - first == pytest.approx(0.5, abs=0.25)
    assert side.stdout_line_at(3) is None and arrival([(1.0, 6), (2.0, 13)], 7) == 2.0


def test_wait_for_reports_early_exit_and_timeout():
    h = LocalHost().start(["sh", "-c", "echo boom >&2; exit 4"])
    with pytest.raises(ProcessExited, match="rc 4.*boom"):
        h.wait_for("never", timeout=5)
    m = marker()
    h = LocalHost().start(py("import time; time.sleep(30)", m))
    t = time.monotonic()
    with pytest.raises(ReadyTimeout, match="within 0.3s"):
        h.wait_for("never", timeout=0.3)
    assert time.monotonic() - t < 2
    h.stop(grace=0.5)
    assert_none_left(m)


def test_stop_escalates_to_sigkill():
    m = marker()
    h = LocalHost().start(py("import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                             "print('armed', flush=True); time.sleep(30)", m))
    h.wait_for("armed", 5)
    assert h.stop(grace=0.3) == -9
    assert_none_left(m)


def test_missing_program_is_a_clear_error():
    with pytest.raises(HostError, match="install it"):
        LocalHost().start(["pclab-no-such-tool"])


def test_local_is_port_open(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert not LocalHost().is_port_open("127.0.0.1", port)
        s.listen()
        assert LocalHost().is_port_open("127.0.0.1", port)
        assert LocalHost().is_port_open(None, port)


# --- netns ------------------------------------------------------------------

def test_netns_host_runs_inside_namespace():
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    with netns.NetnsPair(tag=f"pch{os.getpid() % 10000}", index=231) as pair:
        h = parse_host(f"netns:{pair.ns_a}")
        c = h.run(["ip", "-o", "-4", "addr", "show"], timeout=10)
        assert c.rc == 0 and pair.addr_a in c.stdout and pair.addr_b not in c.stdout
        assert c.argv[:4] == ["ip", "netns", "exec", pair.ns_a]
    with pytest.raises(HostError, match="does not exist"):
        h.run(["true"], timeout=5)


def test_a_pair_in_use_is_refused_not_removed_under_its_holder():
    """Two runs asking for one pair (two `make bench` at once): the second is refused, naming the first."""
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    tag = f"pck{os.getpid() % 10000}"
    with netns.NetnsPair(tag=tag, index=229) as first:
        other = netns.NetnsPair(tag=tag, index=229)
        with pytest.raises(netns.NetnsError, match=rf"in use by process {os.getpid()}.*wait for it"):
            other.create()
        with pytest.raises(netns.NetnsError, match="in use"):
            other.remove()
        c = parse_host(f"netns:{first.ns_a}").run(["ip", "-o", "-4", "addr", "show"], timeout=10)
        assert c.rc == 0 and first.addr_a in c.stdout       # still there for its holder
    with netns.NetnsPair(tag=tag, index=229) as again:     # released with the first: usable again
        assert again.ns_a == first.ns_a


# ssh's failures told apart by OpenSSH's own words on stderr (issue 41, item 6): each names what happened and
# what to do, never a Python argument
SSH_SAID = {
    "refused": "ssh: connect to host 10.0.0.9 port 2222: Connection refused",
    "timeout": "ssh: connect to host 10.0.0.9 port 2222: Connection timed out",
    "timeout-bsd": "ssh: connect to host 10.0.0.9 port 2222: Operation timed out",
    "banner": "Connection timed out during banner exchange\nConnection to 10.0.0.9 port 2222 timed out",
    "host key": "No ED25519 host key is known for [10.0.0.9]:2222 and you have requested strict checking.\n"
                "Host key verification failed.",
    "changed": "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
               "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
               "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\nHost key verification failed.",
    "auth": "alice@10.0.0.9: Permission denied (publickey).",
    "auth-pw": "alice@10.0.0.9: Permission denied (publickey,password).",
    "resolve": "ssh: Could not resolve hostname nohost: Name or service not known",
    "route": "ssh: connect to host 10.0.0.9 port 2222: No route to host",
    "closed": "kex_exchange_identification: read: Connection reset by peer\n"
              "Connection reset by 10.0.0.9 port 2222",
}
SSH_TOLD = {   # (what it says happened, what it says to do)
    "refused": ("connection refused: nothing listens for ssh on 10.0.0.9 port 2222",
                "start sshd on that host (e.g. `sudo systemctl start ssh`), or give the port it listens on"),
    "timeout": ("connection timed out: 10.0.0.9 did not answer on port 2222 within 7 s",
                "check that the host is up and that no firewall drops"),
    "host key": ("host key verification failed: 10.0.0.9's key is not the one known_hosts holds",
                 "remove its old key (`ssh-keygen -f /kh -R '[10.0.0.9]:2222'`) and log in once by hand"),
    "auth": ("authentication failed (permission denied): 10.0.0.9 accepted no key of this machine, and batch "
             "mode asks for no password", "install this machine's public key for that user on the host "
             "(`ssh-copy-id user@10.0.0.9`), or name the key to use in ~/.ssh/config (IdentityFile)"),
    "resolve": ("the host name 10.0.0.9 does not resolve", "give its IP address"),
    "route": ("no route from this machine to 10.0.0.9", "check the address and this machine's network"),
    "closed": ("10.0.0.9 closed the connection before the login", "check sshd's log on that host"),
}
SSH_KIND = {"timeout-bsd": "timeout", "banner": "timeout", "changed": "host key", "auth-pw": "auth"}


@pytest.mark.parametrize("said", sorted(SSH_SAID))
def test_each_ssh_failure_is_told_apart_with_its_fix(said):
    from peercache.lab.launch.hosts import ssh_failure
    what, fix = ssh_failure(SSH_SAID[said], "10.0.0.9", 2222, 7, "/kh")
    want_what, want_fix = SSH_TOLD[SSH_KIND.get(said, said)]
    assert what.startswith(want_what) and want_fix in fix, (what, fix)
    for other, (w, _) in SSH_TOLD.items():          # and it is none of the others
        if other != SSH_KIND.get(said, said):
            assert not what.startswith(w), (said, other)
    assert "identity=" not in what + fix


def test_an_unknown_ssh_failure_is_not_guessed():
    from peercache.lab.launch.hosts import ssh_failure
    assert ssh_failure("ssh: some new message", "h") is None


def _failing_ssh(tmp_path, stderr: str, rc: int = 255) -> str:
    fake = tmp_path / "ssh"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write({stderr!r} + '\\n')\nsys.exit({rc})\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.parametrize("said", ["refused", "timeout", "host key", "auth"])
def test_an_ssh_host_that_cannot_connect_says_which_failure_and_its_fix(tmp_path, said):
    h = SshHost("alice@10.0.0.9", port=2222, connect_timeout=7, known_hosts="/kh",
                ssh=_failing_ssh(tmp_path, SSH_SAID[said]))
    try:
        with pytest.raises(HostError) as e:
            h.run(["true"], timeout=20)
    finally:
        h.close()
    msg = str(e.value)
    what, fix = SSH_TOLD[said]
    assert msg.startswith(f"ssh:alice@10.0.0.9:2222: {what}"), msg
    assert f"(ssh said: {' '.join(SSH_SAID[said].split())})" in msg and fix in msg, msg
    assert "identity=" not in msg and "install a key" not in msg


def test_an_unknown_ssh_failure_says_how_to_see_why(tmp_path):
    h = SshHost("alice@box", ssh=_failing_ssh(tmp_path, "ssh: something new"))
    try:
        with pytest.raises(HostError) as e:
            h.run(["true"], timeout=20)
    finally:
        h.close()
    assert str(e.value) == ("ssh:alice@box: ssh failed (exit 255): ssh: something new; run "
                            "`ssh -o BatchMode=yes alice@box true` by hand to see why (batch mode asks for no "
                            "password)")


def test_a_real_refused_connection_is_told_as_one():
    """OpenSSH itself, against a port nothing listens on."""
    h = SshHost("root@127.0.0.1", port=1)
    try:
        with pytest.raises(HostError) as e:
            h.run(["true"], timeout=20)
    finally:
        h.close()
    assert "connection refused: nothing listens for ssh on 127.0.0.1 port 1" in str(e.value)
    assert "start sshd on that host" in str(e.value)
