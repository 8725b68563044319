"""peercache.directory.redis.scripts: the Lua scripts run on a real redis-server on loopback,
each on its own (the backend's tests run them through RedisDirectory)."""
from __future__ import annotations

import hashlib
import struct
import time

import pytest
import redis

from peercache.directory.location import RECORD
from peercache.directory.redis.scripts import (DROP_LUA, HEARTBEAT_LUA, JOIN_LUA, NOW_MS_LUA, PUBLISH_LUA, SCRIPTS,
                                               TAKEOVER_LUA, UNPUBLISH_LUA, load_script)


def me(num: int) -> bytes:
    """A publisher's member number as the scripts take it: the 4 bytes a record starts with."""
    return struct.pack("<I", num)


def record(num: int, offset: int) -> bytes:
    return RECORD.pack(num, 1, 7, offset, 64, 64, 3, 99)


@pytest.fixture
def r(redis_server):
    client = redis.Redis(port=redis_server.port)
    yield client
    client.close()


def test_every_script_loads_under_its_sha1(r):
    for name, src in SCRIPTS.items():
        assert load_script(r, src, cluster=False) == hashlib.sha1(src.encode()).hexdigest(), name


def test_publish_writes_what_is_free_or_its_own_and_names_the_other_owner(r):
    r.set("e:theirs", record(2, 0))
    r.set("e:mine", record(1, 0))
    r.set("e:old", b"\x0cnot a record")              # an older format: nobody's
    out = r.eval(PUBLISH_LUA, 4, "e:free", "e:theirs", "e:mine", "e:old", me(1),
                 record(1, 10), record(1, 20), record(1, 30), record(1, 40))
    assert out[0] == 0 and out[2] == 0 and out[3] == 0 and out[1] == me(2)
    assert r.get("e:free") == record(1, 10) and r.get("e:mine") == record(1, 30) and r.get("e:old") == record(1, 40)
    assert r.get("e:theirs") == record(2, 0)          # left alone


def test_takeover_only_from_the_dead_owner_seen(r):
    r.set("e:dead", record(2, 0))
    r.set("e:moved", record(3, 0))                   # another node took it meanwhile
    out = r.eval(TAKEOVER_LUA, 2, "e:dead", "e:moved", me(1), me(2), record(1, 5), me(2), record(1, 6))
    assert out == [1, 0]
    assert r.get("e:dead") == record(1, 5) and r.get("e:moved") == record(3, 0)


def test_unpublish_deletes_own_and_nobodys_entries_only(r):
    r.set("e:mine", record(1, 0))
    r.set("e:theirs", record(2, 0))
    r.set("e:junk", b"xx")
    assert r.eval(UNPUBLISH_LUA, 4, "e:mine", "e:theirs", "e:junk", "e:absent", me(1)) == 2
    assert r.exists("e:mine", "e:junk") == 0 and r.get("e:theirs") == record(2, 0)


def test_heartbeat_renews_a_known_node_refuses_a_wrong_token_and_asks_an_unknown_one_to_register(r):
    r.hset("n", mapping={"info": b"i", "token": b"tok"})
    r.sadd("o", b"k")
    assert r.eval(HEARTBEAT_LUA, 3, "n", "o", "t", b"tok", 5000, 6000, 86400) == 1
    assert 0 < r.pttl("n") <= 5000 and 5000 < r.pttl("o") <= 6000 and r.ttl("t") == -2   # no token record yet
    assert r.eval(HEARTBEAT_LUA, 3, "n", "o", "t", b"forged", 5000, 6000, 86400) == -1
    r.delete("n")
    r.set("t", b"tok")
    assert r.eval(HEARTBEAT_LUA, 3, "n", "o", "t", b"tok", 5000, 6000, 86400) == 0      # register again
    assert r.eval(HEARTBEAT_LUA, 3, "n", "o", "t", b"forged", 5000, 6000, 86400) == -1   # not under its id


def test_join_gives_a_number_once_and_keeps_it_and_drop_bumps_the_epoch_once(r):
    keys = ("m", "alive", "epoch", "num", "ids", "count")
    e1, n1 = r.eval(JOIN_LUA, 6, *keys, b"a", 100, 2, 1000)
    assert (e1, n1) == (1, 1001)                     # the counter seeded once, then counted up
    assert r.eval(JOIN_LUA, 6, *keys, b"a", 200, 2, 5000) == [2, 1001]        # a member keeps its number
    assert r.eval(JOIN_LUA, 6, *keys, b"b", 100, 2, 5000) == [3, 1002]
    assert r.eval(JOIN_LUA, 6, *keys, b"c", 100, 2, 5000) == [-1, 0]          # at max nodes
    assert r.hget("ids", 1002) == b"b" and r.zscore("alive", b"a") == 200
    assert r.eval(DROP_LUA, 3, "m", "alive", "epoch", b"a") == 4
    assert r.eval(DROP_LUA, 3, "m", "alive", "epoch", b"a") == 0             # already gone: no new epoch
    assert r.smembers("m") == {b"b"} and r.zscore("alive", b"a") is None


def test_now_ms_is_the_servers_clock_in_milliseconds(r):
    sec, usec = r.time()
    got = r.eval(NOW_MS_LUA, 1, "any")
    assert abs(got - (sec * 1000 + usec // 1000)) < 1000
    assert abs(got - time.time() * 1000) < 5000      # the same host's clock here
