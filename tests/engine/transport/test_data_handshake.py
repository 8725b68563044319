"""The tcp data plane's handshake (hello version 2): each side proves the cluster secret over fresh
nonces and the address the connection reached, the server first, and each request then carries a
tag under the session's key.

The MACs are computed once in Python (peercache.auth.DataKey) and once in C (native/handshake.c);
a known vector pins both. Every server here is the native one, in this process, on loopback;
the fake servers and the relay are Python sockets that record what they hear.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading
import time

import numpy as np
import pytest

from peercache.auth import Credentials, DataKey, data_key
from peercache.errors import TransportError
from peercache.transport.base import Status, make_ops, native_module
from peercache.transport.tcp import TcpTransport

from conftest import recv_for as recv_all, scaled
from oracles.tcp_client import (CHALLENGE_BYTES, HEAD, HELLO_MAGIC, REP_MAGIC, REQ_MAGIC, WIRE_OP, Channel,
                                PythonTcpTransport, address_text, hello, wire_address)

mod, _why = native_module()
pytestmark = pytest.mark.skipif(mod is None, reason=str(_why))

SECRET = b"correct horse battery staple 42"
OTHER = b"an entirely different secret 99"
REGION, RKEY, SIZE = 3, 0x1234_5678_9ABC_DEF0, 1 << 16
DATA = (np.arange(SIZE) % 251).astype(np.uint8)
CLIENTS = [pytest.param(True, id="native-client"), pytest.param(False, id="python-client")]


# ------------------------------------------------------------------------------ the MAC, once in each language

#: A known vector: key, transcript (cn || sn || address), request number and request, and what
#: every MAC of the handshake is for them (computed once, then pinned: neither side may drift).
VECTOR_KEY = bytes(range(32))
VECTOR_TRANSCRIPT = bytes(range(32, 64)) + bytes(range(64, 96)) + wire_address(("127.0.0.1", 4242))
VECTOR_REQUEST = HEAD.pack(REQ_MAGIC, 0, 1, 9) + bytes(range(32))
VECTOR_SEQ = 7
VECTOR = {"server": "656c38d2f1e7d209bbbbacfeafecd266b7dd7c987ef087f3de5fd2cbd477a810",
          "client": "f8c35f6da15c1292efd670cfb1d2764dad209cf67584f7bdd609c993726cb789",
          "session": "5bbabf5e2bb76ab60f934e33ab9e8b5de284b9a9e9e651fb8cec0d270706c5d4",
          "tag": "ff26fb756605dc721f5c064d4daacef91119acb3191209fece480c9ee42790ae"}


def python_macs():
    key = DataKey(VECTOR_KEY)
    session = key.session(VECTOR_TRANSCRIPT)
    return {"server": key.proof("server", VECTOR_TRANSCRIPT), "client": key.proof("client", VECTOR_TRANSCRIPT),
            "session": session, "tag": DataKey.tag(session, VECTOR_SEQ, VECTOR_REQUEST)}


def test_python_and_c_compute_the_same_macs_for_a_known_vector():
    py = python_macs()
    c = dict(zip(("server", "client", "session", "tag"),
                 mod.handshake_macs(VECTOR_KEY, VECTOR_TRANSCRIPT, VECTOR_SEQ, VECTOR_REQUEST)))
    assert c == py
    assert {k: v.hex() for k, v in py.items()} == VECTOR
    # keyed BLAKE2b-256 over label || transcript, as the docstring says
    assert py["server"] == hashlib.blake2b(b"peercache data v2 server" + VECTOR_TRANSCRIPT, key=VECTOR_KEY,
                                           digest_size=32).digest()
    assert len(set(py.values())) == 4          # no MAC is another: the labels keep them apart


def test_the_handshake_address_is_one_form_for_either_family():
    assert wire_address(("127.0.0.1", 80)) == wire_address(("::ffff:127.0.0.1", 80, 0, 0))
    assert address_text(wire_address(("10.1.2.3", 7000))) == "10.1.2.3:7000"
    assert address_text(wire_address(("fe80::1%eth0", 7000, 0, 2))) == "[fe80::1]:7000"


# ------------------------------------------------------------------------------ servers, clients, fakes

@pytest.fixture
def server():
    """``server(secret, **limits)``: a native data server in this process (closed at teardown)."""
    made = []

    def start(secret=SECRET, **limits):
        t = TcpTransport(**limits)
        if secret:
            t.use_credentials(Credentials.of(secret))
        t.expose(REGION, DATA, rkey=RKEY)
        info = t.start("127.0.0.1")
        made.append(t)
        return t, info

    yield start
    for t in made:
        t.close()


def read(info: dict, native: bool, secret=SECRET, off: int = 100, ln: int = 200) -> tuple[list, np.ndarray]:
    """One read by a fresh client: its statuses and the bytes it got."""
    t = (TcpTransport if native else PythonTcpTransport)(io_timeout=scaled(2))
    if secret:
        t.use_credentials(Credentials.of(secret))
    ops = make_ops(1)
    ops[0] = (REGION, 0, RKEY, off, ln, 0)
    dest = np.zeros(ln, np.uint8)
    try:
        return t.read_batch("p", info, ops, [dest]).tolist(), dest
    finally:
        t.close()


def connect_error(port: int, native: bool, secret=SECRET) -> str:
    """What a client holding ``secret`` says when its connection to 127.0.0.1:``port`` fails."""
    key = DataKey(data_key(secret))
    if native:
        with pytest.raises(ConnectionError) as e:
            mod.tcp_connect("127.0.0.1", port, 1, scaled(1.0), key.key)
    else:
        with pytest.raises(TransportError) as e:
            Channel.open("127.0.0.1", port, key, scaled(1.0))
    return str(e.value)


def request(req_id: int, off: int, ln: int) -> bytes:
    w = np.zeros(1, dtype=WIRE_OP)
    w[0] = (REGION, 0, RKEY, off, ln)
    return HEAD.pack(REQ_MAGIC, 0, 1, req_id) + w.tobytes()




def refusal(got: bytes) -> str:
    """The reason of the refusal in ``got`` (after a challenge, if any)."""
    i = got.index(REP_MAGIC)
    magic, code, _, rid = HEAD.unpack(got[i:i + HEAD.size])
    assert code != 0 and rid == 0, (code, rid)
    ln = int.from_bytes(got[i + HEAD.size:i + HEAD.size + 4], "little")
    return got[i + HEAD.size + 4:i + HEAD.size + 4 + ln].decode()


class Listener:
    """A fake data server on 127.0.0.1: ``answer(hello_bytes, sock)`` replies (or not) to each
    connection's first bytes; ``heard`` keeps everything each connection sent."""

    def __init__(self, answer):
        self.answer, self.heard = answer, []
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.lsock.settimeout(0.1)
        self.port = self.lsock.getsockname()[1]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except OSError:
                continue
            with c:
                got = bytearray()
                self.heard.append(got)
                got += recv_all(c, 0.3)
                try:
                    self.answer(bytes(got), c)
                except OSError:
                    continue
                got += recv_all(c, scaled(1.5))

    def close(self):
        self._stop.set()
        self._t.join(timeout=5)
        self.lsock.close()


# ------------------------------------------------------------------------------ a wrong secret, either side

@pytest.mark.parametrize("native", CLIENTS)
def test_a_server_with_another_secret_is_told_nothing_and_named(server, native):
    srv, info = server(secret=OTHER)
    st, dest = read(info, native)
    assert st == [Status.PEER_GONE] and not dest.any()
    why = connect_error(info["port"], native)
    assert f"the data server at 127.0.0.1:{info['port']} did not prove it holds the cluster secret " \
           "(its proof is wrong), so nothing was sent to it; check that the producer runs with this " \
           "consumer's secret (--auth-key-file / $PEERCACHE_AUTH_KEY)" in why, why
    deadline = time.monotonic() + scaled(2)
    while srv.server_stats()["conn_bad_token"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.server_stats()["conn_bad_token"] >= 2      # it counts the clients that left after its challenge


def test_a_client_with_another_secret_is_refused_before_any_request(server):
    srv, info = server()
    key = DataKey(data_key(OTHER))
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=scaled(2)) as s:
        cn = os.urandom(32)
        s.sendall(hello(cn))
        challenge = recv_all(s, 0.3)[HEAD.size:]
        t = cn + challenge[:-32]
        s.sendall(key.proof("client", t) + request(1, 0, 64))
        got = recv_all(s, scaled(1))
    assert "wrong handshake proof: the consumer's cluster secret is not the producer's" in refusal(got)
    assert DATA[:64].tobytes() not in got and srv.server_stats()["served"] == 0


# ------------------------------------------------------------------------------ replay and reflection

def _session(port: int, key: DataKey) -> tuple[list[bytes], bytes]:
    """A good session, recorded: what the client sent (hello, proof, one tagged request) and what came back."""
    sent = []
    with socket.create_connection(("127.0.0.1", port), timeout=scaled(2)) as s:
        cn = os.urandom(32)
        sent.append(hello(cn))
        s.sendall(sent[-1])
        challenge = recv_all(s, 0.3)[HEAD.size:]
        t = cn + challenge[:-32]
        sent.append(key.proof("client", t))
        ch = Channel(s, key.session(t))
        msg = request(1, 0, 64)
        sent.append(msg + ch.tag(msg))
        s.sendall(sent[-2] + sent[-1])
        got = recv_all(s, 0.3)
    return sent, got


def test_a_recorded_session_replayed_is_refused(server):
    srv, info = server()
    sent, got = _session(info["port"], DataKey(data_key(SECRET)))
    assert DATA[:64].tobytes() in got                              # the session itself was served
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=scaled(2)) as s:
        s.sendall(b"".join(sent))                                  # all of it, at once
        again = recv_all(s, scaled(1))
    assert "wrong handshake proof" in refusal(again) and DATA[:64].tobytes() not in again
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=scaled(2)) as s:
        s.sendall(sent[0])                                         # its hello, then its proof once challenged
        recv_all(s, 0.3)
        s.sendall(sent[1] + sent[2])
        again = recv_all(s, scaled(1))
    assert "wrong handshake proof" in refusal(again) and DATA[:64].tobytes() not in again


def test_the_servers_own_proof_reflected_is_refused(server):
    srv, info = server()
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=scaled(2)) as s:
        s.sendall(hello(os.urandom(32)))
        challenge = recv_all(s, 0.3)
        assert len(challenge) == HEAD.size + CHALLENGE_BYTES
        s.sendall(challenge[-32:] + request(1, 0, 64))             # its proof, as ours
        got = recv_all(s, scaled(1))
    assert "wrong handshake proof" in refusal(got) and DATA[:64].tobytes() not in got


def test_a_request_without_its_tag_or_with_anothers_is_refused_and_closed(server):
    """After a good handshake: a request whose tag is missing, another connection's, replayed within
    the connection, or over changed ops is refused and its connection closed (counted req_bad_tag)."""
    srv, info = server()
    key = DataKey(data_key(SECRET))
    sent, _ = _session(info["port"], key)
    recorded = sent[2]                                             # another connection's tagged request

    def greeted(s):
        ch = Channel(s, None)
        cn = os.urandom(32)
        s.sendall(hello(cn))
        t = cn + recv_all(s, 0.3)[HEAD.size:-32]
        s.sendall(key.proof("client", t))
        ch.session = key.session(t)
        return ch

    good = request(2, 0, 64)
    cases = {"untagged": lambda ch: good + good,                  # the second one's bytes are read as a tag
             "another connection's": lambda ch: recorded,
             "replayed": lambda ch: (lambda m: m + ch.tag(m) + m + DataKey.tag(ch.session, 0, m))(good),
             "changed ops": lambda ch: (lambda m, t: request(2, 0, 4096) + t)(good, ch.tag(good))}
    for name, make in cases.items():
        with socket.create_connection(("127.0.0.1", info["port"]), timeout=scaled(2)) as s:
            s.sendall(make(greeted(s)))
            got = recv_all(s, scaled(1))
        assert b"does not match its connection's handshake" in got, (name, got[:300])
        if name == "replayed":
            assert got.count(DATA[:64].tobytes()) == 1, name       # the first is served, its replay is not
        else:
            assert DATA[:64].tobytes() not in got, name
    assert srv.server_stats()["req_bad_tag"] == len(cases)


# ------------------------------------------------------------------------------ servers that prove nothing

def _no_answer(got, c):
    pass


def _close(got, c):
    c.shutdown(socket.SHUT_RDWR)


def _made_up(got, c):
    c.sendall(HEAD.pack(HELLO_MAGIC, 2, CHALLENGE_BYTES, 0) + os.urandom(32) + wire_address(c.getsockname())
              + os.urandom(32))


def _not_a_challenge(got, c):
    c.sendall(HEAD.pack(REP_MAGIC, 0, 1, 1) + bytes(60))


@pytest.mark.parametrize("answer, how", [(_no_answer, "no answer to our hello within"),
                                         (_close, "it closed the connection after our hello"),
                                         (_made_up, "its proof is wrong"),
                                         (_not_a_challenge, "its answer is not a challenge")],
                         ids=["silent", "closes", "made-up-proof", "not-a-challenge"])
@pytest.mark.parametrize("native", CLIENTS)
def test_a_server_that_does_not_prove_the_secret_hears_only_a_hello(answer, how, native):
    fake = Listener(answer)
    try:
        why = connect_error(fake.port, native)
        time.sleep(0.1)
    finally:
        fake.close()
    assert f"the data server at 127.0.0.1:{fake.port} did not prove it holds the cluster secret ({how}" in why, why
    assert "check that the producer runs with this consumer's secret" in why and "directory" in why, why
    assert [len(h) for h in fake.heard] == [HEAD.size + 32], fake.heard      # one hello: a nonce, nothing secret
    assert fake.heard[0][:HEAD.size] == HEAD.pack(HELLO_MAGIC, 2, 32, 0)


@pytest.mark.parametrize("native", CLIENTS)
def test_a_relay_to_the_real_server_is_told_nothing(server, native):
    """Something that forwards the connection (here a relay on another port) passes the server's
    proof on unchanged; the address in it is not the one the client reached, so the client stops."""
    srv, info = server()

    def relay(got, c):
        up = socket.create_connection(("127.0.0.1", info["port"]), timeout=scaled(2))
        up.sendall(got)
        c.sendall(recv_all(up, 0.3))
        up.close()

    fake = Listener(relay)
    try:
        why = connect_error(fake.port, native)
        time.sleep(0.1)
    finally:
        fake.close()
    assert (f"the data server at 127.0.0.1:{fake.port} proved the cluster secret from 127.0.0.1:{info['port']}, "
            f"but we reached 127.0.0.1:{fake.port}: something forwards our connections to it") in why, why
    assert [len(h) for h in fake.heard] == [HEAD.size + 32]


# ------------------------------------------------------------------------------ the old hello, and the budget

def test_an_old_clients_hello_is_refused_naming_both_versions(server):
    """Version 1 sent the token in the clear; it is refused, whatever it carries."""
    srv, info = server()
    old_token = hmac.new(b"x" * 32, b"peercache data-plane handshake v1", hashlib.sha256).digest()
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=scaled(2)) as s:
        s.sendall(HEAD.pack(HELLO_MAGIC, 1, 32, 0) + old_token + request(1, 0, 64))
        got = recv_all(s, scaled(1))
    why = refusal(got)
    assert "hello version 1" in why and "speaks hello version 2" in why, why
    assert DATA[:64].tobytes() not in got


def test_connections_that_never_prove_wait_within_the_greeting_budget(server):
    """Hellos whose proof never comes wait as connections without a hello do: at most max_greeting,
    for hello_timeout each; a client that proves at once is served all along."""
    srv, info = server(hello_timeout=0.5, max_greeting=8, max_greeting_per_source=8, server_workers=1)
    stalled = []
    try:
        for i in range(40):
            s = socket.create_connection(("127.0.0.1", info["port"]), timeout=scaled(2))
            s.sendall(hello(os.urandom(32)))
            stalled.append(s)
            if i % 10 == 9:
                assert read(info, True)[0] == [Status.OK] and read(info, False)[0] == [Status.OK]
        time.sleep(0.1)
        assert srv.server_stats()["greeting"] <= 8
        deadline = time.monotonic() + scaled(3)
        while srv.server_stats()["greeting"] and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = srv.server_stats()
        assert stats["greeting"] == 0 and stats["conn_evicted"] >= 32 and stats["conn_hello_timeout"] >= 1, stats
    finally:
        for s in stalled:
            s.close()
