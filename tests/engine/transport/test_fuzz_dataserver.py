"""Seeded, bounded fuzzing of the tcp data server (the native event loop, native/server.c).

Random bytes, truncated and mutated requests, absurd op counts and lengths, offsets near 2^64,
wrong region keys and well-formed requests with random fields go to a server in a child
process, while a legitimate client keeps reading and checking real bytes. The server must stay
up, answer every well-formed request exactly as the reference model says, and give back the
memory and file descriptors the fuzzing took. Bounded by count and by time (FUZZ_BUDGET_S per
run); the seed is fixed, so a failure replays.
"""
from __future__ import annotations

import random
import socket
import time

import pytest

from peercache.auth import DataKey, data_key
from peercache.transport.base import Status, native_module
from peercache.transport.tcp import MAX_OPS, MAX_REPLY_BYTES

from conftest import scaled
from oracles.tcp_client import HEAD, HELLO_MAGIC, REQ_MAGIC, Channel, hello
from test_hardening_dataserver import (OTHER, REGION, RKEY, SECRET, SIZE, DataServer, Reader, greet, pattern,
                                       read_reply, wire_req)

_mod, _why = native_module()
pytestmark = pytest.mark.skipif(_mod is None, reason=str(_why))

SEED = 20240611
#: Seconds of fuzzing per run, and the case counts that bound it first.
FUZZ_BUDGET_S = 12.0
JUNK_CASES = 15000       # one connection each: random / truncated / mutated / absurd requests
GOOD_ROUNDS = 1500       # pipelined groups of well-formed requests with random fields
GOOD_PER_ROUND = 40
HELD_OPEN = 150          # half-sent requests left open until the end
#: The smallest counts a run must reach within its budget to count as a fuzz run.
MIN_JUNK, MIN_GOOD = 3000, 10000

U64 = 2**64


def expected(ops) -> tuple[list[int], int]:
    """The reference model: statuses and OK bytes of a request's ops."""
    st, total = [], 0
    for r, k, o, ln in ops:
        if r != REGION or k != RKEY:
            st.append(Status.BAD_REGION)
        elif ln == 0:
            st.append(Status.ZERO_LENGTH)
        elif o > SIZE or ln > SIZE - o:
            st.append(Status.OUT_OF_RANGE)
        else:
            st.append(Status.OK)
            total += ln
    return st, total


def rand_u64(rng: random.Random) -> int:
    return rng.choice([0, 1, 2**31, 2**32 - 1, 2**32, 2**63, U64 - 1, U64 - 2, rng.getrandbits(64),
                       rng.getrandbits(16)])


def rand_op(rng: random.Random) -> tuple[int, int, int, int]:
    """One op with random fields, biased towards the edges."""
    region = REGION if rng.random() < 0.7 else rng.choice([0, REGION + 1, 2**32 - 1, rng.getrandbits(32)])
    rkey = RKEY if rng.random() < 0.7 else rng.choice([RKEY ^ 1, 0, U64 - 1, rng.getrandbits(64)])
    kind = rng.random()
    if kind < 0.4:                                   # inside the region
        off = rng.randrange(SIZE)
        ln = rng.randint(1, min(SIZE - off, 4096))
    elif kind < 0.55:                                # at or over the end
        off = SIZE - rng.randint(0, 64)
        ln = rng.randint(0, 128)
    elif kind < 0.7:                                 # offsets near 2^64, lengths that wrap
        off = U64 - rng.randint(1, 4096)
        ln = rng.choice([1, U64 - off, U64 - off + 1 if U64 - off + 1 < U64 else 1, rng.getrandbits(64)])
    elif kind < 0.85:                                # huge lengths
        off = rng.randrange(SIZE)
        ln = rng.choice([U64 - 1, 2**63, 2**31 + 1, SIZE - off + 1, rand_u64(rng)])
    else:
        off, ln = rand_u64(rng), rand_u64(rng)
    return region, rkey, off, ln


def junk(rng: random.Random, s: socket.socket, secret: bytes | None) -> bytes:
    """A message for the new connection ``s``: a hello gone wrong (sent first), or anything but a
    well-formed request (or a well-formed one, mutated) after the handshake when the server checks
    one, then with its tag half the time (the junk's own tag, or a wrong one)."""
    kind = rng.randrange(12)
    good = wire_req(rng.getrandbits(64), [rand_op(rng) for _ in range(rng.randint(1, 8))])
    if kind == 9:                                    # a hello, then a proof not of the nonces or not of the secret
        key = DataKey(data_key(rng.choice([SECRET, OTHER])))
        return hello(rng.randbytes(32)) + rng.choice([key.proof("client", bytes(82)),
                                                      rng.randbytes(32)]) + good
    if kind == 10:                                   # a hello header with random fields
        return HEAD.pack(HELLO_MAGIC, rng.getrandbits(32), rng.getrandbits(32), rng.getrandbits(64)) + \
            rng.randbytes(rng.randint(0, 64))
    if kind == 11:                                   # a truncated or mutated hello
        h = bytearray(hello(rng.randbytes(32)))
        h[rng.randrange(len(h))] ^= 1 << rng.randrange(8)
        return bytes(h[:rng.randint(1, len(h))]) + (good if rng.random() < 0.5 else b"")
    msg = _junk_request(rng, kind, good)
    if secret:
        ch = greet(s, secret)
        msg += ch.tag(msg) if rng.random() < 0.5 else b""
    return msg


def _junk_request(rng: random.Random, kind: int, good: bytes) -> bytes:
    if kind == 0:                                    # random bytes
        return rng.randbytes(rng.randint(1, 300))
    if kind == 1:                                    # truncated header
        return good[:rng.randint(1, HEAD.size - 1)]
    if kind == 2:                                    # truncated body
        return good[:rng.randint(HEAD.size, len(good) - 1)]
    if kind == 3:                                    # flipped bytes
        b = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == 4:                                    # absurd op counts, bodies short or absent
        n = rng.choice([MAX_OPS, MAX_OPS + 1, 2**31, 2**32 - 1, rng.getrandbits(32)])
        return HEAD.pack(REQ_MAGIC, rng.getrandbits(32), n, 1) + rng.randbytes(rng.randint(0, 256))
    if kind == 5:                                    # bad magic, random rest
        return rng.randbytes(4) + good[4:]
    if kind == 6:                                    # zero ops, then junk
        return HEAD.pack(REQ_MAGIC, 0, 0, 2) + rng.randbytes(rng.randint(0, 64))
    if kind == 7:                                    # good request followed by random bytes
        return good + rng.randbytes(rng.randint(1, 64))
    return HEAD.pack(REQ_MAGIC, rng.getrandbits(32), rng.randint(1, 4), rng.getrandbits(64)) + \
        rng.randbytes(rng.randint(0, 200))           # valid header, random body


def drain_to_eof(s: socket.socket, limit_s: float) -> None:
    """Read whatever the server says until it closes (bounded)."""
    s.settimeout(limit_s)
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            if not s.recv(1 << 20):
                return
        except (ConnectionResetError, BrokenPipeError):
            return
    raise AssertionError("the server neither answered nor closed a junk connection")


@pytest.mark.parametrize("secret", [None, SECRET], ids=["open", "secret"])
def test_fuzz_data_server(secret):
    rng = random.Random(SEED)
    srv = DataServer({"request_timeout": 2.0, "idle_timeout": 30.0}, max_s=120, secret=secret)
    reader = Reader(srv.port, channels=2, secret=secret)
    # the secret's runs fuzz half as long: the open runs already cover the request paths
    share = 0.5 if secret else 1.0
    held: list[socket.socket] = []
    try:
        assert reader.read()
        for _ in range(50):                       # warm the paths before the baseline
            assert reader.read(rng.randrange(SIZE - 4096), 4096)
        time.sleep(0.2)
        fds0, rss0 = srv.fds(), srv.rss_kib()
        t0 = time.monotonic()
        budget = scaled(FUZZ_BUDGET_S * share)
        n_junk = n_good = n_checks = 0
        addr = ("127.0.0.1", srv.port)

        def check_legit():
            nonlocal n_checks
            off = rng.randrange(SIZE)
            ln = rng.randint(1, min(SIZE - off, 65536))
            assert reader.read(off, ln), f"legitimate read of [{off}, +{ln}) failed mid-fuzz"
            n_checks += 1

        # 1. junk, one connection each, half-sent ones held open
        while n_junk < JUNK_CASES and time.monotonic() - t0 < budget / 2:
            s = socket.create_connection(addr, timeout=scaled(3))
            try:
                s.sendall(junk(rng, s, secret))
            except (BrokenPipeError, ConnectionResetError):
                pass                              # refused and closed before we finished
            if len(held) < HELD_OPEN and rng.random() < 0.05:
                held.append(s)
            else:
                try:
                    s.shutdown(socket.SHUT_WR)
                    drain_to_eof(s, scaled(5))
                except OSError:
                    pass
                s.close()
            n_junk += 1
            if n_junk % 100 == 0:
                check_legit()
                assert srv.alive(), f"server died: rc={srv.p.poll()}"

        # 2. well-formed requests with random fields, pipelined, checked against the model
        with socket.create_connection(addr, timeout=scaled(5)) as s:
            ch = greet(s, secret) if secret else Channel(s)   # Channel(s).tag(): b"", no handshake
            for rnd in range(GOOD_ROUNDS):
                if time.monotonic() - t0 >= budget:
                    break
                reqs = []
                for i in range(GOOD_PER_ROUND):
                    if rng.random() < 0.01:       # one asking for more than MAX_REPLY_BYTES
                        ops = [(REGION, RKEY, 0, SIZE)] * (MAX_REPLY_BYTES // SIZE + 1)
                    else:
                        ops = [rand_op(rng) for _ in range(rng.randint(1, 12))]
                    reqs.append((rnd * GOOD_PER_ROUND + i, ops))
                s.sendall(b"".join(m + ch.tag(m) for m in (wire_req(rid, ops) for rid, ops in reqs)))
                for rid, ops in reqs:
                    want, total = expected(ops)
                    if total > MAX_REPLY_BYTES:
                        code, got_rid, reason, _ = read_reply(s)
                        assert code != 0 and got_rid == rid and "split the batch" in reason
                        continue
                    code, got_rid, st, data = read_reply(s, [ln for _, _, _, ln in ops])
                    assert (code, got_rid) == (0, rid)
                    assert st == want, (ops, st, want)
                    for (_, _, o, ln), v, d in zip(ops, st, data):
                        assert (d == pattern(o, ln)) if v == Status.OK else d == b""
                n_good += len(reqs)
                if rnd % 10 == 0:
                    check_legit()
            # the connection is still in sync after all that
            m = wire_req(1, [(REGION, RKEY, 7, 9)])
            s.sendall(m + ch.tag(m))
            assert read_reply(s, [9])[3] == [pattern(7, 9)]
        elapsed = time.monotonic() - t0

        assert srv.alive(), f"server died: rc={srv.p.poll()}"
        assert n_junk >= MIN_JUNK * share and n_good >= MIN_GOOD * share, (n_junk, n_good, elapsed)
        for s in held:
            s.close()
        held.clear()
        check_legit()
        # resources come back: the fuzz connections are all gone, memory near where it was
        end = time.monotonic() + scaled(5)
        while srv.fds() > fds0 + 2 and time.monotonic() < end:
            time.sleep(0.05)
        fds1, rss1 = srv.fds(), srv.rss_kib()
        print(f"fuzz{' with a secret' if secret else ''}: {n_junk} junk connections, {n_good} random "
              f"well-formed requests, {n_checks} legitimate reads checked in {elapsed:.1f} s; "
              f"fds {fds0} -> {fds1}, VmRSS {rss0} -> {rss1} KiB")
        assert fds1 <= fds0 + 2, (fds0, fds1)
        assert rss1 - rss0 < 16 * 1024, (rss0, rss1)
        log = srv.stop()
        assert "Traceback" not in log and "failed" not in log, log[-2000:]
    finally:
        for s in held:
            s.close()
        reader.close()
        srv.kill()
