"""Hardening of the control plane: no request can starve heartbeats, and every request is bounded.

The defect: one 16.5 MB lookup (2.75 M keys) held the single RPC thread for
about 11 s, discovery expired every node, the epoch rose and GETs stalled.
"""
from __future__ import annotations

import threading
import time

import pytest
import zmq

import peercache
from conftest import BENCH, scaled
from peercache.node import Node
from peercache import rpc
from peercache.timeouts import DEFAULT as DEFAULT_TIMEOUTS
from peercache.rpc import MAX_REQUEST_BYTES, SOCKET_MAX_BYTES, RpcClient, RpcServer, pack, unpack


class LIM:
    """The default limits this file assumes (checked against the server's below)."""

    max_keys_per_request = 65536
    max_key_bytes = 4096
    max_map_entries = 1024
    max_pending_per_client = 8


def test_the_limits_this_file_assumes_are_the_defaults():
    d = rpc.DEFAULT_LIMITS.as_dict()
    assert {k: d[k] for k in vars(LIM) if not k.startswith("_")} == \
        {k: v for k, v in vars(LIM).items() if not k.startswith("_")}


class Raw:
    """A bare DEALER that pipelines requests and collects replies by request id."""

    def __init__(self, addr: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://{addr}")
        self.n = 0
        self.replies: dict[int, dict] = {}

    def send(self, body: bytes) -> int:
        self.n += 1
        self.sock.send_multipart([b"", self.n.to_bytes(4, "little"), body])
        return self.n

    def collect(self, count: int, timeout: float) -> dict[int, dict]:
        deadline = time.monotonic() + timeout
        while len(self.replies) < count and time.monotonic() < deadline:
            if self.sock.poll(50):
                frames = self.sock.recv_multipart()
                self.replies[int.from_bytes(frames[1], "little")] = unpack(frames[-1])
        return self.replies

    def ask(self, body: bytes, timeout: float = 5.0) -> dict | None:
        rid = self.send(body)
        return self.collect(len(self.replies) + 1, timeout).get(rid)

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture
def meta(procs, port):
    """A standalone discovery process (heartbeat timeout 2 s) and its address."""
    addr = f"127.0.0.1:{port}"
    p = procs.start([*BENCH, "meta", "--discovery-addr", addr, "--heartbeat-timeout", "2"])
    procs.wait_line(p, "ready")
    return addr, p


@pytest.fixture
def patient_meta(procs, port):
    """A standalone discovery process that keeps a silent node for 60 s, and its address: for tests of what
    big requests do, not of expiry. With 2 s, a producer whose heartbeats the loaded suite held back for
    2 s (a million-key lookup's reply decoded in its process) was dropped and its unpublish refused."""
    addr = f"127.0.0.1:{port}"
    p = procs.start([*BENCH, "meta", "--discovery-addr", addr, "--heartbeat-timeout", "60"])
    procs.wait_line(p, "ready")
    return addr, p


def test_huge_lookup_and_a_flood_of_big_ones_starve_neither_heartbeats_nor_small_gets(meta):
    addr, proc = meta
    huge = pack({"keys": [i.to_bytes(4, "little") for i in range(2_750_000)], "op": "lookup"})
    assert 16_000_000 < len(huge) < 17_000_000
    big = pack({"keys": [b"%0100d" % i for i in range(LIM.max_keys_per_request)], "op": "lookup"})
    with peercache.Client(addr, pool_bytes=16 * 4160, page_size=4096, timeout=3.0) as prod, \
            peercache.Client(addr, page_size=4096, timeout=3.0) as cons:
        prod.put("k", b"v" * 100)
        before = cons.node.discovery.call("members")
        attackers = [Raw(addr) for _ in range(4)]
        sent: list[list[int]] = [[] for _ in attackers]

        def attack():
            for _ in range(3):                                 # two clients, three huge lookups each
                for a, ids in zip(attackers[:2], sent[:2]):
                    ids.append(a.send(huge))
            for a, ids in zip(attackers[2:], sent[2:]):        # two more pipeline 8 legal big ones each
                ids += [a.send(big) for _ in range(8)]

        t = threading.Thread(target=attack)
        t.start()
        lat = []
        try:
            deadline = time.monotonic() + 4.0   # twice the heartbeat timeout
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                assert cons.get("k") == b"v" * 100
                assert cons.exists_batch(["k", "nope"]) == [True, False]
                lat.append(time.monotonic() - t0)
                time.sleep(0.05)
            t.join(30)
            after = cons.node.discovery.call("members")
            assert after["epoch"] == before["epoch"], "a node was expired (or joined) during the flood"
            assert set(after["nodes"]) == set(before["nodes"])
            assert max(lat) < scaled(1.5), f"slowest small GET took {max(lat):.2f} s"
            for a, ids in zip(attackers[:2], sent[:2]):
                got = a.collect(len(ids), scaled(10))
                assert [got.get(i) for i in ids] == [{
                    "ok": False, "limit": "max_keys_per_request", "error":
                    "lookup of 2750000 keys refused: at most 65536 keys per request "
                    "(limit max_keys_per_request)"}] * len(ids)
            for a, ids in zip(attackers[2:], sent[2:]):
                got = a.collect(len(ids), scaled(20))
                assert len(got) == len(ids)
                # each is answered, or refused at once because the server's queue is full (bounded memory)
                assert all(len(r["locs"]) == LIM.max_keys_per_request if r["ok"] else
                           r["limit"] in ("max_queued_bytes", "max_pending_per_client") for r in got.values())
                assert sum(r["ok"] for r in got.values()) >= 1
        finally:
            for a in attackers:
                a.close()
        assert proc.poll() is None


def test_over_limit_requests_get_errors_naming_the_limit_and_the_server_stays_up(meta):
    addr, proc = meta
    raw = Raw(addr)
    try:
        cases = [
            (pack({"keys": [b"k"] * (LIM.max_keys_per_request + 1), "op": "lookup"}),
             "lookup of 65537 keys refused: at most 65536 keys per request (limit max_keys_per_request)"),
            (pack({"keys": [b"a", b"x" * (LIM.max_key_bytes + 1)], "op": "lookup"}),
             "(limit max_key_bytes)"),
            (pack({"keys": [b"y" * 4000] * 2200, "op": "lookup"}),
             f"at most {MAX_REQUEST_BYTES} bytes per message (limit max_message_bytes)"),
            (pack({"info": {"name": "n", "pad": "p" * 10000}, "op": "register"}),
             "at most 8192 bytes of node info (limit max_node_info_bytes)"),
            (pack({"keys": [], "extra": {str(i): i for i in range(LIM.max_map_entries + 1)}, "op": "lookup"}),
             "(limit max_map_entries)"),
            (pack({"keys": [[[]] * 60] * 3000, "op": "lookup"}), "(limit max_containers_per_request)"),
        ]
        for body, needle in cases:
            r = raw.ask(body)
            assert r is not None and not r["ok"] and needle in r["error"], (needle, r)
            assert r["limit"] in needle or r["limit"] in r["error"]
        # Beyond ZMQ_MAXMSGSIZE the connection is dropped: no reply, and the server carries on.
        r = raw.ask(b"\x00" * (SOCKET_MAX_BYTES + 1024), timeout=1.0)
        assert r is None
    finally:
        raw.close()
    c = RpcClient(addr, what="discovery")
    assert c.call("lookup", keys=[b"k"])["locs"] == [None]
    c.close()
    assert proc.poll() is None


def test_small_requests_are_answered_while_large_ones_wait_and_queues_are_bounded(port):
    addr = f"127.0.0.1:{port}"
    release = threading.Event()

    def slow(msg):
        release.wait(10)
        return {"n": len(msg["pad"])}

    srv = RpcServer(addr, {"slow": slow, "echo": lambda m: {"v": m["v"]}}).start()
    raw, small = Raw(addr), RpcClient(addr, timeout=2.0)
    try:
        pad = b"p" * (256 << 10)               # above the inline size: goes to the worker
        ids = [raw.send(pack({"pad": pad, "op": "slow"}))]
        time.sleep(0.3)                        # the worker has taken the first one by now
        ids += [raw.send(pack({"pad": pad, "op": "slow"})) for _ in range(LIM.max_pending_per_client + 1)]
        t0 = time.monotonic()
        assert small.call("echo", v=1)["v"] == 1          # not behind the blocked worker
        assert time.monotonic() - t0 < scaled(0.5)
        # one is running, max_pending_per_client wait in the queue, the last is refused at once
        got = raw.collect(1, scaled(3))
        assert list(got) == [ids[-1]] and got[ids[-1]]["limit"] == "max_pending_per_client"
        release.set()
        got = raw.collect(len(ids), scaled(10))
        assert all(got[i] == {"ok": True, "n": len(pad)} for i in ids[:-1])
    finally:
        release.set()
        raw.close()
        small.close()
        srv.stop()


def test_client_splits_big_batches_and_a_million_key_lookup_answers_every_key(patient_meta):
    addr, _ = patient_meta
    cons = Node(addr)
    prod = Node(addr, pool_slots=70_000, slot_capacity=8)
    try:
        keys = [b"big/%d" % i for i in range(70_000)]
        prod.put_batch(keys, [b"%d" % (i % 1000) for i in range(70_000)])     # > one request: split
        assert all(cons.exists_batch(keys))
        million = keys + [b"miss/%07d" % i for i in range(1_000_000 - len(keys))]
        # How fast lookups go is make bench's (dir_lookups_embedded_128, dir_lookups_embedded_rpc_128, and
        # dir_lookups_embedded_rpc_16384 >= 5e5 keys/s: this test's former bound of 2 s for the million keys);
        # a timed bound here failed whenever the suite ran beside other work.
        locs = cons.lookup(million, use_cache=False)
        assert sum(l is not None for l in locs) == len(keys) and locs[-1] is None
        assert locs[12345].offset == prod.pool.ref(keys[12345]).offset
        long_keys = [b"L" * 3000 + b"%d" % i for i in range(5000)]         # 15 MB: split by bytes
        assert cons.exists_batch(long_keys) == [False] * 5000
        assert prod.remove_batch(keys) == 70_000
        assert not any(cons.exists_batch(keys[::100]))
    finally:
        prod.close()
        cons.close()


# ---------------------------------------------------------------- connections that never speak
_SILENT_SERVER = r"""
import sys, time
from peercache.rpc import RpcServer
s = RpcServer("127.0.0.1:0", {"ping": lambda m: {"pong": 1}}).start()
print(s.port, flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_connections_that_never_speak_do_not_lock_the_control_port_out():
    """Under a 64-fd limit, 80 connections that never send their ZeroMQ greeting take every fd the
    server has, the rest wait in its listen backlog; they are dropped after Timeouts.handshake_s (ZeroMQ's default: 30 s), so a real
    client gets its answer within a few seconds, and meanwhile is told what happened, not an
    auth hint (this side has no auth key, the server none either)."""
    import resource
    import socket
    import subprocess
    import sys

    srv = subprocess.Popen([sys.executable, "-c", _SILENT_SERVER, "60"], stdout=subprocess.PIPE, text=True,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    flood: list[socket.socket] = []
    client = None
    try:
        port = int(srv.stdout.readline())
        end = time.monotonic() + scaled(10)
        while len(flood) < 80 and time.monotonic() < end:
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
            except OSError:
                break                   # the backlog is full: the server holds all it can
        assert len(flood) == 80, len(flood)
        client = RpcClient(f"127.0.0.1:{port}", timeout=1.0, what="discovery")
        t, errors = time.monotonic(), []
        while time.monotonic() - t < scaled(20):
            try:
                assert client.call("ping")["pong"] == 1
                break
            except peercache.PeerCacheError as e:
                errors.append(str(e))
        took = time.monotonic() - t
        print(f"answered {took:.2f} s into a flood of {len(flood)} silent connections; meanwhile: {errors[:1]}")
        assert took < DEFAULT_TIMEOUTS.handshake_s + scaled(3.0), (took, errors)
        assert not any("auth key" in e for e in errors), errors
    finally:
        for s in flood:
            s.close()
        if client is not None:
            client.close()
        srv.kill()
        srv.wait(timeout=10)
        srv.stdout.close()


def test_a_server_that_never_answers_the_handshake_gets_no_auth_hint_without_auth():
    """A listener that accepts and says nothing (a stopped server, one out of fds): the error
    says that, not 'wrong or missing auth key?' (neither side has a key)."""
    import socket
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(8)
        c = RpcClient(f"127.0.0.1:{ls.getsockname()[1]}", timeout=0.5, what="discovery")
        try:
            with pytest.raises(peercache.PeerCacheError) as e:
                c.call("ping")
        finally:
            c.close()
    print(e.value)
    assert "auth key" not in str(e.value)
    assert "never answered the ZeroMQ handshake" in str(e.value) and "out of file descriptors" in str(e.value)
