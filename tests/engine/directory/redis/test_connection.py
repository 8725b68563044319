"""peercache.directory.redis.connection: how the Redis directory connects (one Redis or a
cluster, asked of the server), its credentials and TLS, and what a failure means to the caller;
against real redis-servers on loopback."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import redis

import peercache
from conftest import free_port
from peercache.directory.client import connect_directory
from peercache.directory.redis.backend import RedisDirectory
from peercache.directory.redis.connection import (CLUSTER_WAITS, cluster_socket_timeout, once_on_a_broken_connection,
                                                  timed_out)
from peercache.directory.redis.url import PASSWORD_ENV
from peercache.errors import DiscoveryUnreachable, RpcError

def test_password_from_url_or_environment(procs, tmp_path, monkeypatch):
    port = free_port()
    srv = procs.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                       "--appendonly", "no", "--requirepass", "s3cret", "--dir", str(tmp_path)])
    procs.wait_line(srv, "Ready to accept connections")
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(DiscoveryUnreachable, match=PASSWORD_ENV) as e:
        connect_directory(f"redis://127.0.0.1:{port}/0")
    assert f"redis://127.0.0.1:{port}/0" in str(e.value)
    with pytest.raises(DiscoveryUnreachable, match="credentials") as e:
        connect_directory(f"redis://:wrong@127.0.0.1:{port}/0")
    assert "wrong" not in str(e.value).replace("wrong or", "")   # the password is masked
    connect_directory(f"redis://:s3cret@127.0.0.1:{port}/0").close()
    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    with peercache.Client(directory=f"redis://127.0.0.1:{port}/0", pool_bytes=1 << 20, page_size=4096) as c:
        c.put("p", b"pw" * 4)
        assert c.get("p") == b"pw" * 4


def test_rediss_tls_with_the_servers_ca(procs, tmp_path):
    """rediss:// against a redis-server with TLS only (a certificate made here for 127.0.0.1)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found; install it (apt-get install openssl) to make the test certificate")
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    port = free_port()
    srv = procs.start(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                       "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                       "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)])
    procs.wait_line(srv, "Ready to accept connections")
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    with peercache.Client(directory=url, pool_bytes=1 << 20, page_size=4096) as c:
        c.put("t", b"tls" * 3)
        assert c.get("t") == b"tls" * 3 and c.node.discovery.address.startswith("rediss://")
    with pytest.raises(DiscoveryUnreachable, match="unreachable"):     # plain redis:// to a TLS port
        connect_directory(f"redis://127.0.0.1:{port}/0", timeout=1.0)


def test_a_port_nobody_listens_on_is_unreachable_naming_the_url_and_what_to_check():
    port = free_port()
    with pytest.raises(DiscoveryUnreachable) as e:
        connect_directory(f"redis://127.0.0.1:{port}/0", timeout=1.0)
    msg = str(e.value)
    assert f"redis://127.0.0.1:{port}/0" in msg and "'connect'" in msg and "redis-server is running" in msg


def test_timed_out_tells_a_timeout_from_other_failures():
    assert timed_out(TimeoutError()) and timed_out(BlockingIOError()) and timed_out(redis.exceptions.TimeoutError())
    assert not timed_out(ConnectionRefusedError()) and not timed_out(redis.exceptions.ConnectionError())


def test_a_broken_pooled_connection_is_retried_once_never_after_a_timeout():
    retry = once_on_a_broken_connection()
    calls = []

    def broken():
        calls.append(1)
        raise redis.exceptions.ConnectionError("reset")

    with pytest.raises(redis.exceptions.ConnectionError):
        retry.call_with_retry(broken, lambda e: None)
    assert len(calls) == 2                          # once, then once more on a fresh connection
    calls.clear()

    def slow():
        calls.append(1)
        raise redis.exceptions.TimeoutError("no answer")

    with pytest.raises(redis.exceptions.TimeoutError):
        retry.call_with_retry(slow, lambda e: None)
    assert len(calls) == 1                          # a timeout is not waited out twice


def test_a_cluster_calls_socket_waits_fit_its_bound_together(redis_cluster):
    """redis-py's cluster client retries a timeout once after a topology refresh: a call may wait
    CLUSTER_WAITS times (test_cluster_failover.py stops a master to see it)."""
    assert cluster_socket_timeout(3.0) * CLUSTER_WAITS == pytest.approx(3.0)
    d = RedisDirectory(redis_cluster.url, timeout=1.5)
    try:
        assert d.cluster and d.r.retry.get_retries() == 1
        kw = d.r.get_redis_connection(d.r.get_primaries()[0]).connection_pool.connection_kwargs
        assert kw["socket_timeout"] == pytest.approx(0.5) and kw["socket_connect_timeout"] == pytest.approx(0.5)
    finally:
        d.close()


def test_a_redis_that_lost_its_scripts_gets_them_again(redis_server):
    """A Redis restarted empty (here: SCRIPT FLUSH) answers NOSCRIPT; the next request loads the
    scripts again and goes through, in one call."""
    d = RedisDirectory(redis_server.url)
    try:
        reg = d.call("register", info={"name": "p", "regions": [[1, 1 << 20]]})
        d.r.script_flush()
        assert d.call("heartbeat", node_id=reg["node_id"], token=reg["token"])["known"]
        assert all(d.r.script_exists(sha)[0] for sha in d._sha.values())
    finally:
        d.close()


def test_a_refused_command_is_an_rpc_error_naming_the_op(redis_server):
    d = RedisDirectory(redis_server.url)
    try:
        with pytest.raises(RpcError, match=r"refused 'members'.*unknown command"):
            d._pipe("members", lambda p: p.execute_command("NOSUCHCOMMAND"))
    finally:
        d.close()
