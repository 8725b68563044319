"""peercache.directory.redis.lookup: the hand-written lookup request path (RESP written here,
replies parsed by hiredis) and its fallback to redis-py's pipeline, against a real redis-server
on loopback."""
from __future__ import annotations

import pytest
import redis

from peercache.directory.redis.backend import RedisDirectory
from peercache.directory.redis.lookup import LookupSocket, resp_command
from peercache.directory.redis.url import parse_url
from redis_fixtures import RoundTrips


def test_a_command_is_a_resp_array_of_bulk_strings():
    assert resp_command(b"GET", b"k") == b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
    assert resp_command(b"MGET", b"", b"\r\n") == b"*3\r\n$4\r\nMGET\r\n$0\r\n\r\n$2\r\n\r\n\r\n"


def test_the_socket_selects_the_urls_database_and_reads_replies_in_order(redis_server):
    r = redis.Redis(port=redis_server.port, db=3)
    r.set(b"k", b"in three")
    sock = LookupSocket(parse_url(f"redis://127.0.0.1:{redis_server.port}/3", env={}), timeout=2.0)
    try:
        got = sock.request(resp_command(b"GET", b"k") + resp_command(b"GET", b"absent"), 2)
        assert got == [b"in three", None]
        with pytest.raises(redis.exceptions.ResponseError, match="unknown command"):
            sock.request(resp_command(b"NOSUCHCOMMAND"), 1)
    finally:
        sock.close()
        r.close()


def test_a_closed_connection_is_a_connection_error(redis_server):
    sock = LookupSocket(parse_url(redis_server.url, env={}), timeout=2.0)
    try:
        assert sock.request(resp_command(b"QUIT"), 1) == [b"OK"]
        with pytest.raises((redis.exceptions.ConnectionError, OSError)):
            sock.request(resp_command(b"GET", b"k"), 1)
    finally:
        sock.close()


def test_one_mget_reads_the_epoch_and_the_entries_of_short_and_long_keys(redis_server):
    d = RedisDirectory(redis_server.url)
    try:
        long_key = b"L" * 300                        # past the pre-built headers (255 bytes)
        d.r.set(b"pc:e:a", b"A")
        d.r.set(b"pc:e:" + long_key, b"LONG")
        d.r.set(d.k_epoch, 7)
        for keys, want in (([b"a", b"b"], [b"A", None]), ([b"a", long_key], [b"A", b"LONG"])):
            pkt = d._mget(keys, d._epoch_key)
            assert pkt.startswith(b"*%d\r\n$4\r\nMGET\r\n" % (len(keys) + 2))
            assert d._fetch(keys) == (7, want)
    finally:
        d.close()


def test_a_broken_lookup_connection_falls_back_to_the_pipeline(redis_server):
    d = RedisDirectory(redis_server.url)
    try:
        d.r.set(b"pc:e:a", b"A")
        assert d._fetch([b"a"]) == (0, [b"A"])
        (conn,) = d._conns                           # the direct path's connection, kept for the next lookup
        conn.close()                                 # broken under it
        trips = RoundTrips(d)
        assert d._fetch([b"a"]) == (0, [b"A"])
        assert trips.n == 1 and len(d._conns) == 0   # one pipeline; the broken connection was dropped
    finally:
        d.close()
