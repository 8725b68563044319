"""launch.redis: a real redis-server and a real three-master Redis Cluster on loopback —
started, answering, killed, restarted empty, stopped with no process left."""
from __future__ import annotations

import os
import socket
import subprocess

import pytest

from peercache.lab.launch import redis as rl

needs_redis = pytest.mark.skipif(not rl.available()[0], reason=rl.available()[1] or "redis ok")


def cli(port: int, *args: str) -> str:
    r = subprocess.run(rl.cli_command(port, *args), capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def gone(pid: int) -> bool:
    """True when no process ``pid`` exists (reaped), or it is a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- pure builders -------------------------------------------------------------

def test_server_command_no_persistence_loopback():
    argv = rl.server_command(7001, "/tmp/x")
    assert argv[0] == "redis-server"
    pairs = dict(zip(argv[1::2], argv[2::2]))
    assert pairs["--port"] == "7001" and pairs["--bind"] == "127.0.0.1" and pairs["--dir"] == "/tmp/x"
    assert pairs["--save"] == "" and pairs["--appendonly"] == "no" and pairs["--daemonize"] == "no"
    assert "--cluster-enabled" not in argv
    c = rl.server_command(7001, "/tmp/x", cluster=True, cluster_port=17555)
    cp = dict(zip(c[1::2], c[2::2]))
    assert cp["--cluster-enabled"] == "yes" and cp["--cluster-port"] == "17555"
    assert cp["--cluster-config-file"] == "nodes.conf"


def test_cluster_create_command():
    assert rl.cluster_create_command([1, 2, 3]) == [
        "redis-cli", "--cluster", "create", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3",
        "--cluster-replicas", "0", "--cluster-yes"]


def test_parse_info_and_url():
    info = rl.parse_info("# Cluster\r\ncluster_state:ok\r\ncluster_slots_assigned:16384\r\n\r\n")
    assert info == {"cluster_state": "ok", "cluster_slots_assigned": "16384"}
    assert rl.url_for(6380) == "redis://127.0.0.1:6380/0"


def test_missing_binary_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    ok, why = rl.available()
    assert not ok and "apt-get install redis-server redis-tools" in why
    with pytest.raises(rl.RedisUnavailable, match="apt-get install redis-server"):
        rl.RedisServer().start()


# --- one real server -------------------------------------------------------------

@needs_redis
def test_server_starts_answers_and_stop_leaves_nothing():
    s = rl.RedisServer().start()
    try:
        assert s.url == f"redis://127.0.0.1:{s.port}/0"
        assert s.ping()
        assert cli(s.port, "set", "k", "v") == "OK" and cli(s.port, "get", "k") == "v"
        cfg = cli(s.port, "config", "get", "save").splitlines()
        assert cfg[0] == "save" and (cfg + [""])[1] == "", cfg   # no RDB snapshots
        assert cli(s.port, "config", "get", "appendonly").splitlines() == ["appendonly", "no"]
        assert cli(s.port, "config", "get", "bind").splitlines()[1] == "127.0.0.1"
        pid, workdir = s.pid, s.workdir
        assert workdir.is_dir()
    finally:
        s.stop()
    assert gone(pid) and not listening(s.port) and not workdir.exists()


@needs_redis
def test_kill_then_restart_same_port_empty():
    with rl.RedisServer() as s:
        port, pid = s.port, s.pid
        assert cli(port, "set", "k", "v") == "OK"
        s.kill()
        assert gone(pid) and not s.running and not s.ping()
        s.restart()
        assert s.port == port and s.pid != pid and s.ping()
        assert cli(port, "dbsize") == "0"   # empty: nothing persisted across the crash
        assert cli(port, "get", "k") == ""
        pid2 = s.pid
    assert gone(pid2)


@needs_redis
def test_fixed_port_in_use_fails_clearly_and_leaves_nothing():
    with rl.RedisServer() as first:
        second = rl.RedisServer(port=first.port, start_timeout=5)
        with pytest.raises(rl.RedisLaunchError, match="exited with status|did not answer PING"):
            second.start()
        assert second.proc is not None and gone(second.proc.pid)
        assert second.workdir is None    # its private directory is removed too


def test_fixture_server(redis_server):
    assert redis_server.ping() and cli(redis_server.port, "dbsize") == "0"


# --- a real cluster ---------------------------------------------------------------

def _slot_ranges(nodes_text: str) -> dict[str, list[tuple[int, int]]]:
    """CLUSTER NODES -> {addr: [(first, last) slot ranges]} for masters."""
    out = {}
    for line in nodes_text.splitlines():
        f = line.split()
        if "master" not in f[2].split(","):
            continue
        ranges = []
        for r in f[8:]:
            a, _, b = r.partition("-")
            ranges.append((int(a), int(b or a)))
        out[f[1].split("@")[0]] = ranges
    return out


@needs_redis
def test_cluster_three_masters_cover_all_slots_and_stop_leaves_nothing():
    c = rl.RedisCluster(masters=3).start()
    try:
        assert len(c.urls) == 3 and c.url == c.urls[0]
        assert len(set(c.ports)) == 3
        for port in c.ports:
            info = rl.parse_info(cli(port, "cluster", "info"))
            assert info["cluster_state"] == "ok" and info["cluster_known_nodes"] == "3"
            assert info["cluster_size"] == "3" and info["cluster_slots_assigned"] == "16384"
        masters = _slot_ranges(cli(c.ports[0], "cluster", "nodes"))
        assert sorted(masters) == sorted(f"127.0.0.1:{p}" for p in c.ports)
        covered = sorted(s for rs in masters.values() for a, b in rs for s in range(a, b + 1))
        assert covered == list(range(rl.CLUSTER_SLOTS))
        # a key lands on its slot's owner: redis-cli -c follows the redirection
        r = subprocess.run(["redis-cli", "-c", "-p", str(c.ports[0]), "set", "some-key", "v"],
                           capture_output=True, text=True, timeout=10)
        assert r.stdout.strip() == "OK"
        pids = [n.pid for n in c.nodes]
        workdir = c.workdir
    finally:
        c.stop()
    assert all(gone(p) for p in pids)
    assert not any(listening(p) for p in c.ports) and not workdir.exists()


def test_cluster_needs_three_masters():
    with pytest.raises(ValueError, match="at least 3 masters"):
        rl.RedisCluster(masters=2)


def test_fixture_cluster(redis_cluster):
    assert len(redis_cluster.ports) == 3
    assert all(cli(p, "dbsize") == "0" for p in redis_cluster.ports)


@needs_redis
def test_server_dies_with_its_launcher(tmp_path):
    """A launcher killed by SIGKILL (no stop(), no cleanup) leaves no redis-server behind."""
    import shutil
    import signal
    import sys
    import time
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) not installed: apt-get install util-linux")
    code = ("import sys, time\n"
            "from peercache.lab.launch.redis import RedisServer\n"
            "s = RedisServer().start()\n"
            "print(s.port, s.pid, flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port, pid = map(int, p.stdout.readline().split())
        assert listening(port)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        p.stdout.close()
    # A thread group's leader reads as a zombie while its other threads still exit, and the
    # listening socket closes only with the last of them: wait for both, within the bound.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (gone(pid) and not listening(port)):
        time.sleep(0.05)
    assert gone(pid) and not listening(port)


def test_a_cluster_node_can_name_its_own_config_file_so_several_share_one_folder():
    argv = rl.server_command(7001, "/tmp/d", bind="198.18.79.1", cluster=True, cluster_config="nodes-7001.conf")
    assert argv[argv.index("--cluster-config-file") + 1] == "nodes-7001.conf"
    assert argv[argv.index("--bind") + 1] == "198.18.79.1"
    cmd = rl.create_cluster_command(["python"], "198.18.79.1", [7001, 7002, 7003], "pw", 30)
    assert cmd[:3] == ["python", "-m", "peercache.lab.launch.redis"] and cmd[cmd.index("--ports") + 1] == "7001,7002,7003"
