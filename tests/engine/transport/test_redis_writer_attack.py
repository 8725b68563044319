"""A Redis writer who redirects an entry at their own listener learns nothing that reads a producer.

Issue 36, finding 3: with the Redis directory, anyone who can write to Redis (but holds no cluster
secret) registers a node whose data endpoint is their own listener and points one ``pc:e:`` entry
at it. A consumer holding the secret then connects there. Before, its hello carried the 32-byte
data token in the clear, and the listener replayed it to the real producer and read any page.

Here the attacker is a Python listener on loopback, registered in a real redis-server (the
``redis_server`` fixture), in two forms: one that answers like a data server (a challenge of the
right shape, made up) and one that relays the connection to the real producer. It records every
byte the consumer sends it. Then it turns to the real producer with what it recorded: the bytes
verbatim followed by its own read, the recorded hello with the server's proof reflected, and a
bare read. It must read nothing of a page it asks for, and the consumer must say what happened.

Only raw sockets, redis and the library's public ``Client`` are used, so the test runs unchanged
on the code before the fix (where it fails: the replayed token reads the page).
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest

import peercache
from conftest import recv_for, scaled
from peercache.directory.redis.backend import RedisDirectory
from peercache.node import Get
from peercache.transport.base import native_module

mod, _why = native_module()
pytestmark = pytest.mark.skipif(mod is None, reason=str(_why))

SECRET = b"correct horse battery staple 42"
PAGE = 4096
VICTIM, TREASURE = b"victim", b"treasure"
HEAD = struct.Struct("<4sIIQ")
#: A read request as the wire format has it (public: peercache/transport/tcp.py).
OP = struct.Struct("<IIQQQ")


class Attacker:
    """A listener on 127.0.0.1 that records every byte a consumer sends it: ``mode`` "fake" answers a
    hello with a challenge of the right shape (made up: it holds no secret); "relay" forwards the
    connection both ways to ``upstream`` (the real producer)."""

    def __init__(self, mode: str, upstream: tuple[str, int]):
        self.mode, self.upstream = mode, upstream
        self.received: list[bytes] = []          # per connection: all the consumer sent
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except OSError:
                continue
            got = bytearray()
            self.received.append(got)
            threading.Thread(target=self._relay if self.mode == "relay" else self._fake, args=(c, got),
                             daemon=True).start()

    def _fake(self, c: socket.socket, got: bytearray) -> None:
        with c:
            recv_for(c, 0.3, got)                      # the hello (and whatever follows it at once)
            try:                                          # "PCHI" 2, 82 bytes: nonce, address, proof
                c.sendall(HEAD.pack(b"PCHI", 2, 82, 0) + os.urandom(82))
            except OSError:
                return
            recv_for(c, 1.0, got)

    def _relay(self, c: socket.socket, got: bytearray) -> None:
        with c, socket.create_connection(self.upstream, timeout=scaled(3)) as up:
            def back():                                   # producer -> consumer, as it comes
                try:
                    while k := up.recv(65536):
                        c.sendall(k)
                except OSError:
                    pass
            threading.Thread(target=back, daemon=True).start()
            end = time.monotonic() + scaled(3)
            while (left := end - time.monotonic()) > 0:  # consumer -> producer, recorded
                c.settimeout(left)
                try:
                    k = c.recv(65536)
                except OSError:
                    return
                if not k:
                    return
                got += k
                up.sendall(k)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.lsock.close()


def _exchange(addr: tuple[str, int], steps: list, seconds: float = 1.0) -> bytes:
    """Open a connection to ``addr`` and run ``steps`` (bytes to send, or a callable taking what was
    received so far and returning the bytes to send); return everything received."""
    got = bytearray()
    with socket.create_connection(addr, timeout=scaled(3)) as s:
        for step in steps:
            data = step(bytes(got)) if callable(step) else step
            try:
                s.sendall(data)
            except OSError:
                break
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                s.settimeout(left)
                try:
                    k = s.recv(65536)
                except OSError:
                    break
                if not k:
                    return bytes(got)
                got += k
    return bytes(got)


@pytest.mark.parametrize("mode", ["fake", "relay"])
def test_a_redis_writer_who_redirects_an_entry_reads_nothing_from_the_producer(redis_server, mode, caplog):
    url = redis_server.url
    victim, treasure = os.urandom(PAGE), os.urandom(PAGE)
    with peercache.Client(url, protocol="tcp", pool_bytes=16 * (PAGE + 128), page_size=PAGE,
                          auth_key=SECRET) as prod, \
            peercache.Client(url, protocol="tcp", page_size=PAGE, auth_key=SECRET) as cons:
        prod.put_batch([VICTIM, TREASURE], [victim, treasure])
        assert cons.get(VICTIM) == victim

        # The attacker: Redis (read and write), no secret. Where the producer serves and where the
        # treasure lies come from Redis; so does registering a node of its own.
        d = RedisDirectory(url)
        try:
            found = d.call("lookup", keys=[TREASURE])
            owner, region, rkey, offset, length, capacity = found["locs"][0][:6]
            data = found["nodes"][owner]["data"]
            producer = (data["host"], int(data["port"]))
            attacker = Attacker(mode, producer)
            reg = d.call("register", info={"name": "evil", "protocol": "tcp", "regions": [[1, 1 << 30]],
                                           "data": {"host": "127.0.0.1", "port": attacker.port}})
            num = int(d.r.hget(f"pc:n:{{{reg['node_id']}}}", "num"))
            entry = d.r.get(b"pc:e:" + VICTIM)
            d.r.set(b"pc:e:" + VICTIM, struct.pack("<I", num) + entry[4:])   # the victim's entry -> the attacker
        finally:
            d.close()
        try:
            with caplog.at_level("WARNING"):
                r = cons.node.get_batch_into([VICTIM], bytearray(PAGE), [0], [PAGE])
            time.sleep(0.2)                                                 # the relay's last bytes
            heard = [bytes(b) for b in attacker.received]
        finally:
            attacker.close()
        assert heard, "the consumer never connected to the attacker"
        print(f"{mode}: the attacker heard {[len(b) for b in heard]} bytes per connection; the consumer got "
              f"{r.status.tolist()} ({r.error})")

        # What the attacker does with it, against the real producer: its own read of the treasure's slot.
        read = HEAD.pack(b"PCRQ", 0, 1, 77) + OP.pack(region, 0, rkey, offset, 64 + length + 8)
        attempts = []
        for rec in heard:
            attempts.append([rec + read])                                   # everything, verbatim
            hello = rec[:HEAD.size + HEAD.unpack(rec[:HEAD.size])[2]] if len(rec) >= HEAD.size else rec
            attempts.append([hello, lambda got: got[-32:] + read])          # its hello; the server's proof back
            attempts.append([hello, lambda got, rec=rec: rec[len(hello):] + read])   # then the rest it heard
        attempts.append([read])                                             # a bare read
        for steps in attempts:
            back = _exchange(producer, steps)
            assert treasure[:64] not in back and victim[:64] not in back, "the attacker read a page"
            assert b"PCRS" in back, back[:200]                              # it was refused
            assert HEAD.unpack(back[back.index(b"PCRS"):][:HEAD.size])[1] != 0, back[:200]
        assert cons.get(TREASURE) == treasure                               # the producer serves its own

        # The consumer read nothing through the attacker, sent it nothing but a hello, and says why.
        assert r.status.tolist() != [Get.HIT], "the consumer read the page through the attacker"
        assert all(len(rec) == HEAD.size + 32 for rec in heard), [len(rec) for rec in heard]
        told = caplog.text + str(r.error)
        if mode == "fake":
            assert f"the data server at 127.0.0.1:{attacker.port} did not prove it holds the cluster secret" \
                in told, told
        else:
            assert (f"the data server at 127.0.0.1:{attacker.port} proved the cluster secret from "
                    f"127.0.0.1:{producer[1]}, but we reached 127.0.0.1:{attacker.port}") in told, told
