"""peercache.directory.redis.leases: whether the member that owns an entry is alive, trusted for
as long as its node key's TTL said, against a real redis-server on loopback."""
from __future__ import annotations

import time

from peercache.directory.redis.backend import RedisDirectory
from redis_fixtures import RoundTrips, producer


def _num(d: RedisDirectory, nid: str) -> int:
    return int(d.r.hget(f"pc:n:{{{nid}}}", "num"))


def test_an_owner_is_learned_once_then_trusted_for_its_keys_ttl(redis_server):
    d, nid, _ = producer(redis_server.url, "owner", heartbeat_timeout=5.0)
    cons = RedisDirectory(redis_server.url)
    try:
        num = _num(d, nid)
        trips = RoundTrips(cons)
        before = time.monotonic()
        owners = cons._owners([num], epoch=1)
        assert owners == {num: (nid, {"name": "owner", "regions": [[1, 1 << 30]], "node_id": nid})}
        assert trips.n == 2                   # its node id (first seen), then its node hash and TTL
        until = cons._leases[num][0]
        assert before + 4.0 < until <= time.monotonic() + 5.0    # the key's TTL: the heartbeat timeout
        trips.n = 0
        assert cons._owners([num], epoch=1) == owners and trips.n == 0      # the lease holds
        assert cons._owners([num], epoch=2) == owners and trips.n == 1      # a new epoch drops every lease
    finally:
        cons.close()
        d.close()


def test_a_number_nobody_holds_is_not_an_owner_for_a_short_while(redis_server):
    cons = RedisDirectory(redis_server.url, heartbeat_timeout=1.0)
    try:
        trips = RoundTrips(cons)
        assert cons._owners([424242], epoch=1) == {} and trips.n == 1
        until, holder = cons._leases[424242]
        assert holder is None and until - time.monotonic() <= 0.25          # min(0.25 s, timeout / 4)
        assert cons._owners([424242], epoch=1) == {} and trips.n == 1       # not asked again meanwhile
    finally:
        cons.close()


def test_a_node_key_that_carries_another_number_now_is_not_that_owner(redis_server):
    """After a Redis restarted empty, a node registers again under its id with a new number: the
    old number must not be taken for it, and its id is asked again next time."""
    d, nid, _ = producer(redis_server.url, "owner")
    cons = RedisDirectory(redis_server.url)
    try:
        num = _num(d, nid)
        assert num in cons._owners([num], epoch=1)
        d.r.hset(f"pc:n:{{{nid}}}", "num", num + 1000)
        assert cons._owners([num], epoch=2) == {}
        assert num not in cons._ids
    finally:
        cons.close()
        d.close()


def test_an_owner_whose_node_key_expired_is_gone(redis_server):
    d, nid, _ = producer(redis_server.url, "short", heartbeat_timeout=1.0)      # never heartbeats
    cons = RedisDirectory(redis_server.url)
    try:
        num = _num(d, nid)
        assert num in cons._owners([num], epoch=1)
        deadline = time.monotonic() + 5
        while d.r.exists(f"pc:n:{{{nid}}}") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(max(0.0, cons._leases[num][0] - time.monotonic()))       # its lease runs out
        assert cons._owners([num], epoch=1) == {}
    finally:
        cons.close()
        d.close()
