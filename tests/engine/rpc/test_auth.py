"""The cluster secret (CURVE on the control plane) and the owner checks that hold with or without it.

Each attack test pins something any local process could do before: take over
another node's key so that GETs returned its bytes, ``leave`` or re-register
in another node's name, stop ``serve`` with ``reader_done``, and publish
locations with strings or negative numbers in them.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import time

import pytest
import zmq

import peercache
from conftest import BENCH, free_port, scaled
from peercache.bench.serve import READY_LINE
from peercache.errors import ConfigError, DiscoveryUnreachable, RpcError
from peercache.node import Node
from peercache.rpc import RpcClient, pack

SECRET = b"correct horse battery staple 42"
OTHER = b"an entirely different secret 99"
SMALL = ["--working-set", "16", "--page-size", "4096"]


@pytest.fixture(autouse=True)
def _no_ambient_secret(monkeypatch):
    monkeypatch.delenv("PEERCACHE_AUTH_KEY", raising=False)


def auth(key):
    """Keyword arguments for a secret (none at all without one)."""
    return {"auth_key": key} if key else {}


def keyfile(tmp_path, secret: bytes, name: str = "cluster.key"):
    p = tmp_path / name
    p.write_bytes(secret + b"\n")
    p.chmod(0o600)
    return str(p)


@pytest.fixture(params=[None, SECRET], ids=["no-secret", "secret"])
def cluster(request, port):
    """A producer hosting discovery, a consumer, and an intruder: a registered node (with the secret
    when there is one) that tries to act for others."""
    addr, key = f"127.0.0.1:{port}", request.param
    prod = peercache.Client(addr, host_discovery=True, pool_bytes=16 * 4160, page_size=4096, **auth(key))
    intruder = Node(addr, pool_slots=4, slot_capacity=4096, name="intruder", **auth(key))
    cons = peercache.Client(addr, page_size=4096, **auth(key))
    yield prod, intruder, cons, key
    cons.close()
    intruder.close()
    prod.close()


# ---------------------------------------------------------------- the secret and what is derived from it
def test_keys_are_derived_deterministically():
    from peercache.auth import Credentials, curve_keys, data_key
    a, b, o = curve_keys(SECRET), curve_keys(SECRET), curve_keys(OTHER)
    assert a == b and a.server_public != a.client_public and o.server_public != a.server_public
    assert zmq.curve_public(a.server_secret) == a.server_public
    assert zmq.curve_public(a.client_secret) == a.client_public
    assert SECRET.decode() not in repr(a) and a.server_secret.decode() not in repr(a)
    t = data_key(SECRET)
    assert len(t) == 32 and t == data_key(SECRET) and t != data_key(OTHER)
    assert t not in (SECRET, a.server_secret, a.client_secret)
    assert curve_keys(None) is None
    creds = Credentials.of(SECRET)
    assert creds.data.key == t and t.hex() not in repr(creds) and t.hex() not in repr(creds.data)


def test_secret_loading_file_env_and_refusals(tmp_path, caplog):
    from peercache.auth import load_secret, resolve
    assert load_secret(keyfile(tmp_path, SECRET), env={}) == SECRET
    assert load_secret(None, env={"PEERCACHE_AUTH_KEY": OTHER.decode()}) == OTHER
    assert load_secret(keyfile(tmp_path, SECRET), env={"PEERCACHE_AUTH_KEY": OTHER.decode()}) == SECRET
    assert load_secret(None, env={}) is None
    with pytest.raises(ConfigError, match="at least 16"):
        load_secret(keyfile(tmp_path, b"short"), env={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_secret(str(tmp_path / "missing.key"), env={})
    loose = keyfile(tmp_path, SECRET, "loose.key")
    os.chmod(loose, 0o644)
    with pytest.raises(ConfigError, match="other users .*chmod 600"):   # refused now, as ssh refuses a key
        load_secret(loose, env={})
    assert resolve(SECRET.decode()) == SECRET
    with pytest.raises(ConfigError, match="at least 16"):
        resolve(b"tiny")


def test_listening_beyond_loopback_without_a_secret_warns(caplog, monkeypatch, port):
    from peercache import auth as pauth
    with caplog.at_level(logging.WARNING, logger="peercache.auth"):
        for addr in ("0.0.0.0:31998", "10.1.2.3:31998", "[::]:31998", "myhost:31998"):
            assert pauth.warn_if_open(addr, None), addr
        for addr in ("127.0.0.1:1", "localhost:1", "[::1]:1", "127.0.0.5:1"):
            assert not pauth.warn_if_open(addr, None), addr
        assert not pauth.warn_if_open("0.0.0.0:1", pauth.curve_keys(SECRET))
    text = caplog.text
    for what in ("without an auth key", "read every page", "publish keys", "evict nodes", "--auth-key-file"):
        assert what in text, what
    # The node that hosts discovery checks its address (loopback treated as remote here: nothing is exposed).
    caplog.clear()
    monkeypatch.setattr(pauth, "is_loopback", lambda host: False)
    with caplog.at_level(logging.WARNING, logger="peercache.auth"):
        Node(f"127.0.0.1:{port}", host_discovery=True).close()
        assert "without an auth key" in caplog.text
        caplog.clear()
        Node(f"127.0.0.1:{free_port()}", host_discovery=True, auth_key=SECRET).close()
        assert "without an auth key" not in caplog.text


# ---------------------------------------------------------------- attacks, with and without a secret
def test_publishing_another_nodes_key_does_not_take_it_over(cluster):
    prod, intruder, cons, _ = cluster
    prod.put("victim", b"GOOD" * 25)
    intruder.put_batch([b"victim"], [b"EVIL" * 25])        # its own slot, published under the same key
    assert cons.get("victim") == b"GOOD" * 25
    assert getattr(intruder, "publish_refused", None) == 1
    owner = prod.node.node_id
    loc = cons.node.lookup([b"victim"], use_cache=False)[0]
    with pytest.raises(RpcError, match="publish refused"):   # a forged publish in the owner's name
        intruder.discovery.call("publish", node_id=owner, token="forged", keys=[b"victim"],
                                locs=[list(loc[:3]) + [0, 100, 4096, 9, loc.key_hash]])
    with pytest.raises(RpcError, match="unpublish refused"):
        intruder.discovery.call("unpublish", node_id=owner, keys=[b"victim"])
    assert intruder.discovery.call("unpublish", node_id=intruder.node_id, token=intruder.token,
                                   keys=[b"victim"])["unpublished"] == 0     # not its entry
    assert cons.get("victim") == b"GOOD" * 25


def test_leave_in_another_nodes_name_is_refused(cluster):
    prod, intruder, cons, _ = cluster
    prod.put("k", b"x" * 10)
    victim = prod.node.node_id
    with pytest.raises(RpcError, match="leave refused"):
        intruder.discovery.call("leave", node_id=victim)
    with pytest.raises(RpcError, match="leave refused"):
        intruder.discovery.call("leave", node_id=victim, token="0" * 32)
    assert victim in cons.node.members()
    assert cons.get("k") == b"x" * 10


def test_register_and_heartbeat_in_another_nodes_name_are_refused(cluster):
    prod, intruder, cons, _ = cluster
    victim = prod.node.node_id
    r = intruder.discovery.call("register", info={"name": "impostor", "node_id": victim, "data": {}},
                                node_id=victim, token="forged")
    assert r["node_id"] != victim                       # a fresh id, never the victim's
    assert cons.node.members()[victim]["name"] == prod.node.name
    with pytest.raises(RpcError, match="heartbeat refused"):
        intruder.discovery.call("heartbeat", node_id=victim, token="forged")


def _field(i, value):
    def mutate(loc, node):
        loc[i] = value(node) if callable(value) else value
        return loc
    return mutate


BAD_LOCATIONS = [
    pytest.param(_field(1, "1"), id="region-a-string"),
    pytest.param(_field(3, -1), id="negative-offset"),
    pytest.param(_field(3, 1.5), id="offset-a-float"),
    pytest.param(_field(4, 4097), id="length-beyond-capacity"),
    pytest.param(_field(5, None), id="capacity-none"),
    pytest.param(_field(6, True), id="generation-a-bool"),
    pytest.param(_field(7, -(1 << 63)), id="negative-key-hash"),
    pytest.param(_field(1, 7), id="region-not-registered"),
    pytest.param(_field(3, lambda n: n.pool.size - 64), id="slot-outside-the-region"),
    pytest.param(_field(0, "someone-else"), id="another-nodes-id"),
    pytest.param(lambda loc, node: loc[:5], id="five-fields"),
    pytest.param(lambda loc, node: {"offset": 0}, id="a-map"),
]


@pytest.mark.parametrize("mutate", BAD_LOCATIONS)
def test_publish_of_an_invalid_location_is_refused(cluster, mutate):
    _, intruder, cons, _ = cluster
    intruder.put_batch([b"mine"], [b"m" * 10])
    good = [intruder.node_id, *cons.node.lookup([b"mine"], use_cache=False)[0][1:]]
    with pytest.raises(RpcError, match="publish refused"):
        intruder.discovery.call("publish", node_id=intruder.node_id, token=getattr(intruder, "token", None),
                                keys=[b"other"], locs=[mutate(list(good), intruder)])
    assert cons.exists_batch(["other", "mine"]) == [False, True]


@pytest.mark.parametrize("readers", [0, 1])
@pytest.mark.parametrize("key", [None, SECRET], ids=["no-secret", "secret"])
def test_reader_done_only_from_a_registered_reader_and_never_with_readers_0(procs, port, tmp_path, readers, key):
    from peercache.auth import curve_keys
    addr = f"127.0.0.1:{port}"
    argv = [*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", str(readers), "--max-wait", "60"]
    if key:
        argv += ["--auth-key-file", keyfile(tmp_path, key)]
    serve = procs.start(argv)
    procs.wait_line(serve, READY_LINE)
    # an insider with the secret (if there is one) that never registered, then one that forges a node
    c = RpcClient(addr, what="discovery", **({"auth": curve_keys(key)} if key else {}))
    try:
        with pytest.raises(RpcError, match="reader_done refused"):
            c.call("reader_done", summary={"status": "ok"})
        with pytest.raises(RpcError, match="not registered"):
            c.call("reader_done", node_id="0123456789ab", token="f" * 32)
    finally:
        c.close()
    time.sleep(1.0)
    assert serve.poll() is None
    with Node(addr, name="reader", **auth(key)) as reader:
        reply = reader.call("reader_done", summary={"status": "ok"})
    if readers == 0:
        assert "ignored" in reply
        time.sleep(1.0)
        assert serve.poll() is None, "--readers 0 serve was stopped by reader_done"
    else:
        assert reply["readers_done"] == 1
        assert serve.wait(timeout=scaled(10)) == 0


# ---------------------------------------------------------------- without the right secret
def test_wrong_or_missing_secret_is_named_within_a_bounded_time(port):
    addr = f"127.0.0.1:{port}"
    with peercache.Client(addr, host_discovery=True, auth_key=SECRET):
        for key in (OTHER, None):
            t = time.monotonic()
            with pytest.raises(DiscoveryUnreachable, match=f"no answer from discovery at {addr}: wrong or "
                                                           "missing auth key"):
                peercache.Client(addr, timeout=1.0, **auth(key))
            assert time.monotonic() - t < scaled(4)
        with peercache.Client(addr, auth_key=SECRET, timeout=1.0) as ok:
            assert len(ok.node.members()) == 2
    other = f"127.0.0.1:{free_port()}"
    with peercache.Client(other, host_discovery=True):          # a server without a secret
        with pytest.raises(DiscoveryUnreachable, match="wrong or missing auth key"):
            peercache.Client(other, auth_key=SECRET, timeout=1.0)


def test_without_the_secret_no_request_reaches_the_control_plane(port):
    from peercache.auth import curve_keys
    addr = f"127.0.0.1:{port}"
    with peercache.Client(addr, host_discovery=True, pool_bytes=8 * 4160, page_size=4096,
                          auth_key=SECRET) as prod, \
            peercache.Client(addr, page_size=4096, auth_key=SECRET) as cons:
        prod.put("k", b"secret page")
        s = zmq.Context.instance().socket(zmq.DEALER)      # plain ZeroMQ, no CURVE
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://{addr}")
        try:
            for op in ({"op": "lookup", "keys": [b"k"]}, {"op": "leave", "node_id": prod.node.node_id},
                       {"op": "members"}):
                s.send_multipart([b"", b"1", pack(op)])
            assert not s.poll(1000), "an unauthenticated client got an answer"
        finally:
            s.close(0)
        wrong = RpcClient(addr, timeout=1.0, what="discovery", auth=curve_keys(OTHER))
        with pytest.raises(DiscoveryUnreachable, match="wrong or missing auth key"):
            wrong.call("lookup", keys=[b"k"])
        wrong.close()
        assert cons.get("k") == b"secret page"
        assert prod.node.node_id in cons.node.members()


def drive_argv(addr, out, *extra):
    return [*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", "4", "--duration", "0.5",
            "--warmup", "0.2", "--out", str(out), "--ready-timeout", "10", *extra]


def test_serve_and_drive_share_a_key_file_and_a_wrong_one_exits_1(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    good, bad = keyfile(tmp_path, SECRET, "good.key"), keyfile(tmp_path, OTHER, "bad.key")
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1",
                         "--auth-key-file", good])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "d.json"
    for extra in (["--auth-key-file", bad], []):
        t = time.monotonic()
        r = subprocess.run(drive_argv(addr, out, *extra), capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
        assert "wrong or missing auth key" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert time.monotonic() - t < scaled(30)
    assert serve.poll() is None
    env = dict(os.environ, PEERCACHE_AUTH_KEY=SECRET.decode())      # the secret from the environment
    r = subprocess.run(drive_argv(addr, out), capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["points"][0]["hit_rate"] == 1.0
    assert serve.wait(timeout=scaled(10)) == 0
    assert SECRET.decode() not in out.read_text()


def test_meta_with_a_key_file(procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    meta = procs.start([*BENCH, "meta", "--discovery-addr", addr, "--auth-key-file", keyfile(tmp_path, SECRET)])
    procs.wait_line(meta, "ready")
    with peercache.Client(addr, pool_bytes=8 * 4160, page_size=4096, auth_key=SECRET) as prod, \
            peercache.Client(addr, page_size=4096, auth_key=SECRET) as cons:
        prod.put("m", b"via an authenticated meta")
        assert cons.get("m") == b"via an authenticated meta"
    with pytest.raises(DiscoveryUnreachable, match="wrong or missing auth key"):
        peercache.Client(addr, timeout=1.0)


@pytest.mark.parametrize("secret, message", [(None, "cannot read"), (b"short", "at least 16")])
def test_unusable_key_file_is_refused_before_start(tmp_path, port, secret, message):
    path = str(tmp_path / "missing.key") if secret is None else keyfile(tmp_path, secret)
    for mode in ("serve", "drive", "meta"):
        r = subprocess.run([*BENCH, mode, "--discovery-addr", f"127.0.0.1:{port}", "--auth-key-file", path],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and message in r.stderr, (mode, r.stderr)


def test_a_transports_control_endpoint_takes_the_nodes_secret(port, monkeypatch):
    """The endpoint a producer serves for its transport (rdma: the QP exchange) is a CURVE server
    with the node's keys, and the transport is handed the node's credentials."""
    from peercache import node as node_mod
    from peercache.auth import curve_keys
    from peercache.transport.tcp import TcpTransport

    seen = []

    class WithControl(TcpTransport):
        def control_handlers(self):
            return {"exchange": lambda msg: {"echo": msg.get("x"), "data_key": self.credentials.data is not None}}

    monkeypatch.setattr(node_mod, "make_transport", lambda protocol, **kw: seen.append(kw) or WithControl(**kw))
    addr = f"127.0.0.1:{port}"
    with Node(addr, host_discovery=True, pool_slots=4, slot_capacity=4096, auth_key=SECRET) as n:
        control = f"{n.info['data']['host']}:{n.info['data']['control_port']}"
        assert n.control is not None and control != addr
        for keys in (None, curve_keys(OTHER)):
            c = RpcClient(control, timeout=1.0, what="control endpoint", auth=keys)
            with pytest.raises(RpcError, match="no answer from control endpoint .*wrong or missing auth key"):
                c.call("exchange", x=1)
            c.close()
        good = RpcClient(control, timeout=scaled(3), what="control endpoint", auth=curve_keys(SECRET))
        assert good.call("exchange", x=7) == {"ok": True, "echo": 7, "data_key": True}
        good.close()
    assert seen, "the node did not build its transport through make_transport"


# ---------------------------------------------------------------- open listens, weak secrets
def test_a_data_server_beyond_loopback_without_a_secret_warns(caplog, port):
    """The defect: `serve --bind 0.0.0.0` (and HiCache's 'bind', and Node(bind_host=)) printed nothing;
    only discovery's own address was checked."""
    addr = f"127.0.0.1:{port}"
    with caplog.at_level(logging.WARNING, logger="peercache.auth"):
        Node(addr, host_discovery=True, pool_slots=4, slot_capacity=4096, bind_host="0.0.0.0").close()
    text = caplog.text
    for what in ("the data server listens on 0.0.0.0:", "any host that can reach any address of this machine",
                 "read every page", "--auth-key-file", "--bind 127.0.0.1"):
        assert what in text, what
    for kw in ({"bind_host": "0.0.0.0", "auth_key": SECRET}, {"bind_host": "127.0.0.1"},
               {"bind_host": "0.0.0.0", "protocol": "shm"}):      # shm listens on no network
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="peercache.auth"):
            Node(f"127.0.0.1:{free_port()}", host_discovery=True, pool_slots=4, slot_capacity=4096, **kw).close()
        assert "listens on" not in caplog.text, kw


def test_the_warning_says_who_can_reach_the_listener():
    from peercache.auth import open_warning
    assert "any address of this machine" in open_warning("[::]:1", "data")
    assert "any host that can reach 10.1.2.3 (its network" in open_warning("10.1.2.3:1", "data")
    assert "any host on the internet" in open_warning("8.8.8.8:1")
    assert "any host that can reach box.example" in open_warning("tcp://box.example:1")


def test_serve_bind_0000_without_a_secret_prints_the_warning(procs, port):
    serve = procs.start([*BENCH, "serve", "--discovery-addr", f"127.0.0.1:{port}", *SMALL, "--readers", "0",
                         "--bind", "0.0.0.0"])
    procs.wait_line(serve, READY_LINE)
    serve.terminate()
    serve.wait(timeout=scaled(10))
    err = serve.stderr.read()
    assert "the data server listens on 0.0.0.0:" in err and "without an auth key" in err, err


WEAK = [
    (b"\0" * 1024, 0o600, "1024 copies of the byte 0x00"),           # the probe's /dev/zero, as a file
    (b"a" * 32, 0o600, "32 copies of the byte 0x61"),
    (b"ab" * 20, 0o600, "repeats 2 byte values"),
    (b"abcdefghijklmnopqrstu", 0o600, "21 lower-case letters carry at most 99 bits"),
    (SECRET, 0o640, "other users (mode 640)"),
    (SECRET, 0o604, "other users (mode 604)"),
]


@pytest.mark.parametrize("content, mode, message", WEAK, ids=["zeros", "one-byte", "two-bytes", "short-alphabet",
                                                              "group-readable", "world-readable"])
def test_weak_or_exposed_secrets_are_refused_saying_what_to_do(tmp_path, content, mode, message):
    from peercache.auth import load_secret
    path = keyfile(tmp_path, content)
    os.chmod(path, mode)
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        load_secret(path, env={})
    assert "chmod 600" in str(e.value)
    assert path in str(e.value)


def test_weak_secrets_from_the_environment_and_the_library_are_refused():
    from peercache.auth import load_secret, resolve
    with pytest.raises(ConfigError, match=r"\$PEERCACHE_AUTH_KEY is 32 copies"):
        load_secret(None, env={"PEERCACHE_AUTH_KEY": "x" * 32})
    with pytest.raises(ConfigError, match="auth_key="):
        resolve("0123456789abcdef")                 # 16 hex digits: 64 bits
    assert resolve("0123456789abcdef" * 2) == b"0123456789abcdef" * 2   # 32 hex digits: 128 bits


@pytest.mark.parametrize("mode", ["serve", "drive", "meta"])
def test_dev_zero_as_key_file_is_refused_with_rc_2(port, mode):
    r = subprocess.run([*BENCH, mode, "--discovery-addr", f"127.0.0.1:{port}", "--auth-key-file", "/dev/zero"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (mode, r.stderr)
    assert "--auth-key-file /dev/zero is not a regular file" in r.stderr and "Traceback" not in r.stderr


def test_hicache_refuses_etc_shadow_and_weak_keys():
    from peercache import hicache
    if not os.path.exists("/etc/shadow"):
        pytest.skip("no /etc/shadow here")
    with pytest.raises(ConfigError, match=r"extra config 'auth_key_file' /etc/shadow (can be read|is)") as e:
        hicache.StoreConfig.from_extra({"auth_key_file": "/etc/shadow"})
    assert "chmod 600" in str(e.value) or "cannot read" in str(e.value)
    with pytest.raises(ConfigError, match="extra config 'auth_key'"):
        hicache.StoreConfig.from_extra({"auth_key": "k" * 32})


def test_a_request_that_cannot_be_queued_is_bounded_by_the_calls_timeout_not_forever():
    """A DEALER's send blocks while it has no connection to queue on: ZeroMQ drops the connection after a
    secure handshake fails and tries again, and a send in between waited forever (make test, 2026-12-07:
    a client with a secret against a server without one hung 300 s in send_multipart). The send is bounded by
    the call's timeout and ends as a call that got no reply."""
    c = RpcClient(f"127.0.0.1:{free_port()}", timeout=0.8, what="discovery")
    seen = {}

    class NoPipe:
        """The client's socket as it is between a failed handshake and the next connection."""

        def __init__(self, sock):
            self.sock = sock

        def send_multipart(self, frames, *a, **kw):
            seen["sndtimeo"] = self.sock.getsockopt(zmq.SNDTIMEO)
            raise zmq.Again()

        def __getattr__(self, name):
            return getattr(self.sock, name)

    try:
        c._sock = NoPipe(c._sock)
        t = time.monotonic()
        with pytest.raises(DiscoveryUnreachable, match="no reply from discovery at .* to 'members' within 0.8 s"):
            c.call("members")
        assert time.monotonic() - t < scaled(2)
        assert 0 < seen["sndtimeo"] <= 800, seen          # the send was given the call's bound, not -1 (forever)
        assert not isinstance(c._sock, NoPipe)             # a fresh socket for the next call
    finally:
        c.close()
