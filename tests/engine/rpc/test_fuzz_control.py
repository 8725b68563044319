"""A seeded, bounded fuzz of the control plane (discovery + directory).

Tens of thousands of random and mutated messages go to a standalone
discovery process: random bytes, msgpack of random shapes, known ops with
wrong types, unknown ops, truncated and mutated real requests, headers that
claim huge arrays, deep nesting, odd frame counts, and raw TCP garbage that
is not ZeroMQ at all. Every message with a client envelope must get an
error (or ok) reply, the server must stay up, a legitimate producer and
consumer must be served correctly throughout, and the server's memory and
file descriptors must come back near where they started.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import time

import msgpack
import zmq

import peercache
from conftest import BENCH, SLOWNESS, scaled
from peercache.rpc import pack, unpack

SEED = 20240611
MESSAGES = 60_000          # upper bound on fuzz messages
SECONDS = 18.0             # upper bound on fuzzing time (the whole test stays under ~30 s)
MIN_MESSAGES = 20_000      # what even a slow machine must get through in that time
WINDOW = 48                # requests in flight per socket
OPS = ["register", "heartbeat", "leave", "members", "publish", "lookup", "unpublish", "reader_done"]
FIELDS = ["op", "keys", "locs", "info", "node_id", "token", "unpublish", "summary", "data", "regions"]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Fuzz:
    """Message generators driven by one seeded Random."""

    def __init__(self, seed: int, templates: list[bytes]):
        self.r = random.Random(seed)
        self.templates = templates
        self.kinds = [
            (self.random_bytes, 12), (self.random_msgpack, 14), (self.op_with_wrong_types, 24),
            (self.mutated, 24), (self.huge_header, 6), (self.deep, 3), (self.unknown_op, 6),
            (self.bad_locations, 8), (self.big, 0.15),
        ]
        self.total = sum(w for _, w in self.kinds)

    def body(self) -> bytes:
        x = self.r.random() * self.total
        for fn, w in self.kinds:
            x -= w
            if x < 0:
                return fn()
        return self.random_bytes()

    def obj(self, depth: int = 0):
        r = self.r
        c = r.randrange(14 if depth < 3 else 9)
        if c == 0:
            return None
        if c == 1:
            return r.random() < 0.5
        if c == 2:
            return r.choice([0, 1, -1, 2 ** 31, 2 ** 63 - 1, -2 ** 63, 2 ** 64 - 1, r.randrange(-1000, 1000)])
        if c == 3:
            return r.random() * 1e6
        if c == 4:
            return "".join(chr(r.randrange(32, 0x2FF)) for _ in range(r.randrange(12)))
        if c == 5:
            return r.randbytes(r.randrange(40))
        if c == 6:
            return r.choice(OPS + FIELDS)
        if c == 7:
            return msgpack.ExtType(r.randrange(128), r.randbytes(r.randrange(8)))
        if c == 8:
            return r.randbytes(r.randrange(300))
        if c in (9, 10):
            return [self.obj(depth + 1) for _ in range(r.randrange(6))]
        if c == 11:
            return [r.randbytes(r.randrange(16)) for _ in range(r.randrange(200))]
        return {self.key(): self.obj(depth + 1) for _ in range(r.randrange(6))}

    def key(self):
        r = self.r
        return r.choice([r.choice(FIELDS), r.randrange(100), r.randbytes(3), None, 1.5, True])

    def random_bytes(self) -> bytes:
        return self.r.randbytes(self.r.randrange(300))

    def random_msgpack(self) -> bytes:
        return pack(self.obj())

    def op_with_wrong_types(self) -> bytes:
        r = self.r
        m = {f: self.obj(1) for f in r.sample(FIELDS[1:], r.randrange(1, 6))}
        if r.random() < 0.3:
            m["info"] = {self.key(): self.obj(2) for _ in range(r.randrange(5))}
        m["op"] = r.choice(OPS)
        return pack(m)

    def mutated(self) -> bytes:
        r = self.r
        b = bytearray(r.choice(self.templates))
        for _ in range(r.randrange(1, 5)):
            if not b:
                break
            c, i = r.randrange(6), r.randrange(len(b))
            if c == 0:
                b[i] ^= 1 << r.randrange(8)
            elif c == 1:
                b[i:i] = r.randbytes(r.randrange(1, 8))
            elif c == 2:
                del b[i:i + r.randrange(1, 16)]
            elif c == 3:
                del b[i:]                          # truncated
            elif c == 4:
                b[i] = r.choice([0xdc, 0xdd, 0xde, 0xdf, 0xc6, 0xdb, 0xc1, 0xd4, 0xc7])
            else:
                b[i:i] = b[max(0, i - 8):i]
        return bytes(b)

    def huge_header(self) -> bytes:
        r = self.r
        hdr = r.choice([b"\xdd\xff\xff\xff\xff", b"\xdd\x00\x01\x00\x01", b"\xdf\x7f\xff\xff\xff",
                        b"\xde\xff\xff", b"\xc6\xff\xff\xff\xf0", b"\xdb\x7f\xff\xff\xff",
                        b"\xdc\xff\xff", b"\xc9\xff\xff\xff\xff\x01"])
        tail = r.randbytes(r.randrange(20))
        field = r.choice([b"\xa4keys", b"\xa4locs", b"\xa4info"])
        if r.random() < 0.5:
            return b"\x82" + field + hdr + tail + b"\xa2op\xa6lookup"
        return hdr + tail

    def deep(self) -> bytes:
        n = self.r.choice([100, 1000, 5000, 60_000])
        opener = self.r.choice([b"\x91", b"\x81\xa1k"])
        return b"\x82\xa2op\xa6lookup\xa4keys" + opener * n + b"\xc0"

    def unknown_op(self) -> bytes:
        r = self.r
        op = r.choice(["", "__init__", "handlers", "_register", "LOOKUP", "rdma_connect", "x" * 65,
                       r.randbytes(6).hex()])
        return pack({"op": op, "keys": [b"k"]})

    def bad_locations(self) -> bytes:
        r = self.r
        n = r.randrange(1, 20)
        loc = lambda: [self.obj(2) if r.random() < 0.3 else r.randrange(-5, 1 << 40) for _ in range(r.randrange(6, 10))]
        return pack({"node_id": r.randbytes(6).hex(), "token": r.randbytes(16).hex(),
                     "keys": [r.randbytes(8) for _ in range(n)], "locs": [loc() for _ in range(n)],
                     "op": r.choice(["publish", "unpublish", "leave", "heartbeat"])})

    def big(self) -> bytes:
        r = self.r
        c = r.randrange(3)
        if c == 0:                                           # over max_keys_per_request
            return pack({"keys": [b"k%d" % i for i in range(70_000)], "op": "lookup"})
        if c == 1:                                           # over max_message_bytes
            return pack({"keys": [b"z" * 4000] * 2200, "op": "lookup"})
        return pack({"keys": [[[]] * 60] * 3000, "op": "lookup"})   # too many containers


def raw_tcp_garbage(port: int, r: random.Random) -> None:
    """A connection that is not a ZeroMQ peer (or stops mid-greeting), then closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        c = r.randrange(4)
        if c == 0:
            s.sendall(r.randbytes(r.randrange(1, 400)))
        elif c == 1:
            s.sendall(b"\xff" + b"\x00" * 8 + b"\x7f")          # a ZMTP signature, then nothing
        elif c == 2:
            s.sendall(b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00NULL" + b"\x00" * 16 + b"\x00" * 31
                      + r.randbytes(r.randrange(200)))         # greeting, then junk commands
        else:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    except OSError:
        pass
    finally:
        s.close()


def check_reply(frames: list[bytes]) -> bool:
    r = unpack(frames[-1])
    assert isinstance(r, dict) and isinstance(r.get("ok"), bool), r
    if not r["ok"]:
        assert isinstance(r.get("error"), str) and r["error"], r
    return r["ok"]


def test_fuzzed_control_messages_get_replies_and_leave_the_server_whole(port, tmp_path):
    addr = f"127.0.0.1:{port}"
    log = open(tmp_path / "meta.log", "w+")
    meta = subprocess.Popen([*BENCH, "meta", "--discovery-addr", addr, "--heartbeat-timeout", "2"],
                            stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    socks: list[zmq.Socket] = []
    try:
        assert "ready" in meta.stdout.readline()
        ctx = zmq.Context.instance()
        with peercache.Client(addr, pool_bytes=32 * 4160, page_size=4096, timeout=3.0) as prod, \
                peercache.Client(addr, page_size=4096, timeout=3.0) as cons:
            pages = {f"page{i}": bytes([i]) * (100 + i) for i in range(16)}
            prod.put_batch(list(pages), list(pages.values()))
            n = prod.node
            templates = [
                pack({"info": {"name": "x", "data": {}, "regions": [[1, 4096]]}, "op": "register"}),
                pack({"node_id": n.node_id, "token": "0" * 32, "op": "heartbeat"}),
                pack({"keys": [b"page1", b"page2"], "op": "lookup"}),
                pack({"node_id": n.node_id, "token": "f" * 32, "keys": [b"page1"],
                      "locs": [[n.node_id, 1, 5, 0, 10, 4096, 1, 77]], "unpublish": [], "op": "publish"}),
                pack({"node_id": n.node_id, "token": "x", "keys": [b"page3"], "op": "unpublish"}),
                pack({"node_id": n.node_id, "op": "leave"}), pack({"op": "members"}),
            ]
            fuzz = Fuzz(SEED, templates)
            socks = [ctx.socket(zmq.DEALER) for _ in range(4)]
            for s in socks:
                s.setsockopt(zmq.LINGER, 0)
                s.connect(f"tcp://{addr}")
            odd = ctx.socket(zmq.DEALER)          # odd envelopes: replies not matched
            odd.setsockopt(zmq.LINGER, 0)
            odd.connect(f"tcp://{addr}")
            socks.append(odd)
            pending = [dict() for _ in socks[:4]]
            sent = replied = oks = odd_sent = garbage = 0
            worst_get, rss0, fd0 = 0.0, None, None
            rng = random.Random(SEED + 1)

            def drain(i: int, wait_ms: int) -> None:
                nonlocal replied, oks
                s = socks[i]
                while s.poll(wait_ms):
                    frames = s.recv_multipart()
                    assert pending[i].pop(frames[1], None) is not None, "reply to nothing sent"
                    replied += 1
                    oks += check_reply(frames)
                    wait_ms = 0

            def legit_check() -> None:
                nonlocal worst_get
                t0 = time.monotonic()
                keys = rng.sample(list(pages), 4)
                assert cons.get_batch(keys) == [pages[k] for k in keys]
                assert cons.exists_batch(["never-put"]) == [False]
                worst_get = max(worst_get, time.monotonic() - t0)

            start = time.monotonic()
            while sent < MESSAGES and time.monotonic() - start < SECONDS:
                i = sent % 4
                if len(pending[i]) >= WINDOW:
                    drain(i, 2000)
                    assert len(pending[i]) < WINDOW, f"no reply within 2 s; {len(pending[i])} pending"
                rid = struct.pack("<Q", sent)
                socks[i].send_multipart([b"", rid, fuzz.body()])
                pending[i][rid] = True
                sent += 1
                drain(i, 0)
                if sent % 97 == 0:                  # odd frame shapes: no envelope, many frames, empty
                    shape = rng.randrange(4)
                    frames = {0: [fuzz.body()], 1: [b"", b"r", b"extra", fuzz.body()],
                              2: [b""] * 7 + [fuzz.body()], 3: [b"", b"r", b""]}[shape]
                    odd.send_multipart(frames)
                    odd_sent += 1
                    while odd.poll(0):
                        odd.recv_multipart()
                if sent % 499 == 0:
                    raw_tcp_garbage(port, rng)
                    garbage += 1
                if sent % 1000 == 0:
                    legit_check()
                # The baseline once the allocator and the fuzz's registered nodes are warm: measured, the
                # meta process grows 18 MB in the first 10000 messages, then 8 MB in the next 50000
                # (3, 3, 0.5, 1, 0 a 10000), a plateau, not a leak; from 2000 on, a loaded machine took it
                # past the bound
                if sent == min(10_000, int(MIN_MESSAGES / SLOWNESS / 2)):
                    rss0, fd0 = rss_kib(meta.pid), fds(meta.pid)
            took = time.monotonic() - start
            for i in range(4):
                deadline = time.monotonic() + scaled(10)
                while pending[i] and time.monotonic() < deadline:
                    drain(i, 100)
            assert all(not p for p in pending), f"{sum(map(len, pending))} messages got no reply"
            assert replied == sent
            legit_check()
            assert meta.poll() is None, "discovery died"
            assert prod.node.node_id in cons.node.members()
            assert worst_get < scaled(1.5), f"a legitimate GET took {worst_get:.2f} s during the fuzz"
            assert sent >= min(MESSAGES, MIN_MESSAGES / SLOWNESS), f"only {sent} messages in {took:.1f} s"
            # Nodes the fuzz registered expire (2 s); connections close; memory settles.
            for s in socks:
                s.close(0)
            socks = []
            time.sleep(3.0)
            legit_check()
            rss1, fd1 = rss_kib(meta.pid), fds(meta.pid)
            print(f"fuzz: {sent} messages ({oks} ok replies) + {odd_sent} odd envelopes + {garbage} raw "
                  f"TCP garbage connections in {took:.1f} s; VmRSS {rss0} -> {rss1} KiB, fds {fd0} -> {fd1}")
            assert rss1 - rss0 < 32 * 1024, f"VmRSS grew from {rss0} to {rss1} KiB"
            assert fd1 <= fd0 + 3, f"fds grew from {fd0} to {fd1}"
            assert len(cons.node.members()) == 2
    finally:
        for s in socks:
            s.close(0)
        if meta.poll() is None:
            os.killpg(meta.pid, signal.SIGKILL)
        meta.wait(timeout=10)
        meta.stdout.close()
        log.seek(0)
        text = log.read()
        log.close()
    assert "Traceback" not in text, text[-3000:]
