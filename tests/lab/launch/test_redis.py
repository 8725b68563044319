"""launch.redis: a real redis-server and a real three-master Redis Cluster on loopback —
started, answering, killed, restarted empty, stopped with no process left."""
from __future__ import annotations

import os
import socket
import subprocess
import time

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
    assert rl.cluster_create_command([1, 2, 3, 4, 5, 6], replicas=1)[-3:] == ["--cluster-replicas", "1",
                                                                               "--cluster-yes"]
    lab = rl.create_cluster_command(["py"], "10.0.0.9", [1, 2, 3, 4, 5, 6], "pw", 30, replicas=1)
    assert lab == ["py", "-m", "peercache.lab.launch.redis", "create-cluster", "--host", "10.0.0.9", "--ports",
                   "1,2,3,4,5,6", "--timeout", "30", "--replicas", "1", "--password", "pw"]
    assert "--replicas" not in rl.create_cluster_command(["py"], "h", [1, 2, 3], None, 30)


def test_replica_and_password_flags():
    argv = rl.server_command(7002, "/tmp/x", replicaof=("127.0.0.1", 7001), password="pw")
    i = argv.index("--replicaof")
    assert argv[i:i + 3] == ["--replicaof", "127.0.0.1", "7001"]
    after = {a: argv[k + 1] for k, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert after["--requirepass"] == "pw" and after["--masterauth"] == "pw"
    assert after["--repl-diskless-sync-delay"] == "0"
    assert "--replicaof" not in rl.server_command(7001, "/tmp/x") and "--requirepass" not in rl.server_command(7001, "/tmp/x")


def test_sentinel_command_config_and_url():
    assert rl.sentinel_command("/tmp/s/sentinel.conf") == ["redis-server", "/tmp/s/sentinel.conf", "--sentinel"]
    conf = rl.sentinel_config(26379, 7001, "/tmp/s", quorum=2, service="svc", down_after_ms=1000,
                              failover_timeout_ms=3000).splitlines()
    assert conf[:5] == ["port 26379", "bind 127.0.0.1", "daemonize no", 'logfile ""', "dir /tmp/s"]
    assert "sentinel monitor svc 127.0.0.1 7001 2" in conf
    assert "sentinel down-after-milliseconds svc 1000" in conf and "sentinel failover-timeout svc 3000" in conf
    assert not any("pass" in line for line in conf)
    locked = rl.sentinel_config(1, 2, "/d", quorum=1, password="pw", sentinel_password="spw").splitlines()
    assert f"sentinel auth-pass {rl.SENTINEL_SERVICE} pw" in locked
    assert "requirepass spw" in locked and "sentinel sentinel-pass spw" in locked
    assert rl.sentinel_url_for([1, 2]) == f"redis+sentinel://127.0.0.1:1,127.0.0.1:2/{rl.SENTINEL_SERVICE}/0"
    assert rl.sentinel_url_for([1], "m", 3, password="p@ss") == "redis+sentinel://:p%40ss@127.0.0.1:1/m/3"
    assert rl.parse_pairs("name\nsvc\nflags\nmaster\nnum-slaves\n1\n") == {
        "name": "svc", "flags": "master", "num-slaves": "1"}
    with pytest.raises(ValueError, match="give password"):
        rl.SentinelSet(sentinel_auth=True)
    with pytest.raises(ValueError, match="1 or more sentinels"):
        rl.SentinelSet(0)


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


def test_slots_and_probe_keys_as_redis_cluster_hashes_them():
    from redis.crc import key_slot      # redis-py's, to check ours (the launch module imports no redis-py)

    for k in ("foo", "{user1000}.following", "{}x", "a{b}c", "a{b", "pc:g:{ff}:node"):
        assert rl.slot_of(k) == key_slot(k.encode()), k
    assert rl.slot_of("foo") == 12182 and rl.slot_of("a{b}c") == rl.slot_of("b")
    for slot in (0, 5461, 16383):
        assert rl.slot_of(rl.probe_key(slot)) == slot
    assert rl.probe_key() == "peercache:launch:probe"


@needs_redis
def test_cluster_three_masters_three_replicas_in_sync():
    with rl.RedisCluster(masters=3, replicas=1) as c:
        assert len(c.ports) == 6
        roles = c.roles()
        assert sorted(roles.values()) == ["master"] * 3 + ["slave"] * 3, roles
        for port, role in roles.items():
            info = rl.parse_info(cli(port, "cluster", "info"))
            assert info["cluster_state"] == "ok" and info["cluster_known_nodes"] == "6"
            if role == "slave":
                assert rl.in_sync(rl.replication(port))
        replicas = c.replicas_of()
        assert sorted(replicas) == sorted(p for p, r in roles.items() if r == "master")
        assert sorted(r for rs in replicas.values() for r in rs) == sorted(p for p, r in roles.items() if r == "slave")
        assert c.node(c.ports[0]).port == c.ports[0]
        pids = [n.pid for n in c.nodes]
    assert all(gone(p) for p in pids)


@needs_redis
@pytest.mark.parametrize("password", [None, "a-replica-pw"])
def test_a_cut_replica_misses_the_writes_after_the_cut_until_reconnected(password):
    with rl.RedisServer(password=password) as master, \
            rl.RedisServer(replicaof=master.port, password=password) as replica:
        deadline = time.monotonic() + 10
        while not rl.in_sync(rl.replication(replica.port, password=password)) and time.monotonic() < deadline:
            time.sleep(0.05)
        master.cli("set", "before", "1")
        master.replicated(1, timeout=5.0)   # a probe write and WAIT in one connection
        rl.cut_replica(master, replica)
        master.cli("set", "after", "2")
        with pytest.raises(rl.RedisLaunchError, match="0 of 1 replicas"):
            master.replicated(1, timeout=1.5)   # a replica tries to resync once a second: every try fails
        assert replica.cli("get", "before").stdout.strip() == "1"
        assert replica.cli("get", "after").stdout.strip() == ""
        assert replica.cli("get", rl.probe_key()).stdout.strip() == ""     # the probe leaves nothing
        rl.reconnect_replica(replica)
        while replica.cli("get", "after").stdout.strip() != "2" and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert replica.cli("get", "after").stdout.strip() == "2"


@needs_redis
def test_sentinel_set_agrees_pauses_and_stop_leaves_nothing():
    with rl.SentinelSet(password="a-sentinel-set-pw") as ss:
        master, replica = ss.servers
        assert rl.replication(master.port, password=ss.password)["role"] == "master"
        assert rl.in_sync(rl.replication(replica.port, password=ss.password))
        assert ss.quorum == 2 and len(ss.sentinels) == rl.SENTINELS
        assert set(ss.master_addrs().values()) == {("127.0.0.1", master.port)}
        for s in ss.sentinels:
            st = s.master_state()
            assert (st["flags"], st["num-slaves"], st["num-other-sentinels"], st["quorum"]) == (
                "master", "1", "2", "2")
            # the config holds the master's password: Sentinel rewrites it with its own mode, in a
            # private directory only this user may enter
            assert oct(s.config_path.parent.stat().st_mode & 0o777) == "0o700"
            assert f"down-after-milliseconds {rl.SENTINEL_SERVICE} {rl.SENTINEL_DOWN_AFTER_MS}" in \
                s.config_path.read_text()
        assert ss.url == ("redis+sentinel://:a-sentinel-set-pw@" + ",".join(f"127.0.0.1:{p}" for p in
                          ss.sentinel_ports) + f"/{rl.SENTINEL_SERVICE}/0")
        assert ss.wait_master(timeout=5) == master.port
        with pytest.raises(rl.RedisLaunchError, match="did not agree on a master other than port"):
            ss.wait_master(other_than=master.port, timeout=0.3)
        replica.pause()
        assert not replica.ping(timeout=0.5)
        replica.resume()
        assert replica.ping()
        replica.pause()                                  # stop() ends a paused server too
        pids = [x.pid for x in ss.servers + ss.sentinels]
        dirs = [x.workdir for x in ss.servers + ss.sentinels]
        ports = [x.port for x in ss.servers + ss.sentinels]
    assert all(gone(p) for p in pids)
    assert not any(d.exists() for d in dirs) and not any(listening(p) for p in ports)


@needs_redis
def test_sentinel_command_line_prints_the_masked_url_and_cleans_up_on_sigterm():
    import signal
    import sys
    p = subprocess.Popen([sys.executable, "-m", "peercache.lab.launch.redis", "sentinel", "--password",
                          "cli-sentinel-pw-1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        first = p.stdout.readline()
        assert first.startswith(rl.SENTINEL_READY), first
        lines = [p.stdout.readline() for _ in range(4)]
        text = first + "".join(lines)
        assert "cli-sentinel-pw-1" not in text and "redis+sentinel://:***@127.0.0.1:" in text, text
        master_pid = int(lines[-1].split("kill -KILL ")[1].split(";")[0])
        assert not gone(master_pid)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        p.stdout.close()
    assert gone(master_pid)


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
