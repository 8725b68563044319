import threading
import time

import numpy as np
import pytest

from peercache import tags
from peercache.directory.cache import DirectoryCache
from peercache.directory.location import Location
from peercache.directory.service import Membership, MetaService
from peercache.directory.validate import Refused
from peercache.directory.store import Directory
from peercache.transport.base import ABSENT, LOC_DTYPE


def loc(node, off, gen=1):
    return [node, 1, 99, off, 10, 16, gen, 1234]


def test_publish_lookup_unpublish_batch():
    d = Directory()
    assert d.publish("n1", [b"a", b"b"], [loc("n1", 0), loc("n1", 64)]) == 2
    got = d.lookup([b"a", b"zz", b"b"])
    assert got[0] == Location("n1", 1, 99, 0, 10, 16, 1, 1234) and got[1] is None and got[2].offset == 64
    assert d.unpublish("n2", [b"a"]) == 0       # not n2's key
    assert d.unpublish("n1", [b"a", b"zz"]) == 1
    assert d.lookup([b"a"]) == [None]


def test_key_moves_between_nodes_and_drop_node():
    d = Directory()
    d.publish("n1", [b"a", b"b"], [loc("n1", 0), loc("n1", 64)])
    d.publish("n2", [b"a"], [loc("n2", 128)])
    assert d.drop_node("n1") == 1
    assert d.lookup([b"a", b"b"]) == [Location("n2", 1, 99, 128, 10, 16, 1, 1234), None]
    with pytest.raises(ValueError):
        d.publish("n1", [b"x"], [])


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_cache_ttl_expiry_and_invalidate():
    clk = Clock()
    c = DirectoryCache(2.0, clock=clk)
    l1 = Location(*loc("n1", 0))
    c.put_many([b"a", b"b"], [l1, None])
    assert c.get_many([b"a", b"b"]) == [l1, None]
    clk.t += 1.9
    assert c.get_many([b"a"]) == [l1]
    clk.t += 0.2
    assert c.get_many([b"a"]) == [None]
    c.put_many([b"a"], [l1])
    c.invalidate([b"a"])
    assert c.get_many([b"a"]) == [None]
    c.put_many([b"a"], [l1])
    c.drop_node("n1")
    assert c.get_many([b"a"]) == [None]


@pytest.mark.parametrize("ttl", [0.0, 30.0])
def test_cache_hands_out_the_hash_of_the_key_asked_for_never_the_entrys(ttl):
    """lookup_into's ``want``: tags.key_hash of each key asked for, cached or not, whatever key hash
    the cached location carries (a directory entry may be a copy of another key's)."""
    c = DirectoryCache(ttl)
    other = Location(*loc("n1", 0))._replace(key_hash=tags.key_hash(b"b"))
    c.put_rows([b"a"], c.rows([other]))                 # a's entry: a copy of b's
    keys = [b"a", b"b", b"c" * 100]
    rows = np.empty(3, LOC_DTYPE)
    want = np.zeros(3, np.uint64)
    found = c.lookup_into(keys, rows, want)
    assert found == (1 if ttl else 0)
    assert want.tolist() == [tags.key_hash(k) for k in keys]
    if ttl:
        assert int(rows["key_hash"][0]) == tags.key_hash(b"b")   # the entry's word, as it was given
    c.key_hashes_into([b"x", bytearray(b"y")], want[:2])       # not bytes: hashed in Python
    assert want[:2].tolist() == [tags.key_hash(b"x"), tags.key_hash(b"y")]


def test_cache_keys_apart_by_every_byte_and_length():
    """The map's own hash reads a key's last 1-7 bytes in overlapping loads: keys of every length up to
    17 that differ in one byte only, or only in length (a zero byte more), are each their own entry."""
    c = DirectoryCache(30.0)
    keys = []
    for n in range(0, 18):
        base = bytes(range(1, n + 1))
        keys.append(base)
        keys += [base[:i] + b"\xff" + base[i + 1:] for i in range(n)]
        keys.append(base + b"\0")
    keys = list(dict.fromkeys(keys))
    rows = c.rows([Location(*loc("n1", 64 * i)) for i in range(len(keys))])
    c.put_rows(keys, rows)
    got = np.empty(len(keys), LOC_DTYPE)
    assert c.lookup_into(keys, got) == len(keys)
    assert got["offset"].tolist() == [64 * i for i in range(len(keys))]


def test_cache_lookups_racing_puts_and_clears_see_only_their_own_key():
    """Readers without the GIL (lookup_into) against a writer that grows the shards (puts of ever more
    keys) and empties the map (put over max_entries): a key found carries its own location, never
    another's, and every lookup returns."""
    c = DirectoryCache(30.0, max_entries=6000)
    keys = [b"k%d" % i for i in range(8000)]
    rows = c.rows([Location(*loc("n1", 64 * i)) for i in range(len(keys))])
    stop = threading.Event()
    bad: list = []
    found = [0]

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        out = np.empty(256, LOC_DTYPE)
        while not stop.is_set():
            idx = rng.integers(0, len(keys), 256)
            c.lookup_into([keys[i] for i in idx], out)
            hit = out["node"] != ABSENT
            found[0] += int(hit.sum())
            if (out["offset"][hit] != idx[hit] * 64).any():
                bad.append(idx[hit][out["offset"][hit] != idx[hit] * 64][:4].tolist())

    ts = [threading.Thread(target=reader, args=(s,)) for s in range(3)]
    for t in ts:
        t.start()
    try:
        deadline = time.monotonic() + 2.0
        rounds = 0
        while time.monotonic() < deadline and rounds < 200:   # each round grows from empty past max_entries
            for lo in range(0, len(keys), 500):
                c.put_rows(keys[lo:lo + 500], rows[lo:lo + 500])
            rounds += 1
    finally:
        stop.set()
        for t in ts:
            t.join(10)
    assert not any(t.is_alive() for t in ts), "a lookup did not return"
    assert not bad, f"keys found with another key's location: {bad[:3]}"
    assert rounds >= 2 and found[0] > 0


def test_cache_ttl_zero_is_off_and_negative_refused():
    c = DirectoryCache(0)
    c.put_many([b"a"], [Location(*loc("n1", 0))])
    assert c.get_many([b"a"]) == [None]
    with pytest.raises(ValueError, match="dir-cache-ttl"):
        DirectoryCache(-1)


def test_membership_epoch_and_heartbeat_expiry():
    clk = Clock()
    m = Membership(heartbeat_timeout=5.0, clock=clk)
    n1, e1 = m.register({"name": "a"})
    n2, e2 = m.register({"name": "b"})
    assert e2 == e1 + 1 and n1 != n2
    clk.t += 4
    assert m.heartbeat(n1)
    clk.t += 2
    assert m.expire() == [n2]                 # n2 silent 6 s, n1 only 2 s
    assert m.epoch == e2 + 1 and set(m.members()) == {n1}
    assert not m.heartbeat(n2)                # must register again
    assert m.leave(n1) and not m.leave(n1)


def test_meta_service_drops_entries_of_dead_node():
    svc = MetaService(heartbeat_timeout=5.0, reaper=False)
    try:
        clk = Clock()
        svc.membership.clock = clk
        reg = svc.handlers()["register"]({"info": {"name": "p"}})
        node, token = reg["node_id"], reg["token"]      # requests in a node's name carry its token
        svc.handlers()["publish"]({"node_id": node, "token": token, "keys": [b"k"], "locs": [loc(node, 0)]})
        assert svc.handlers()["lookup"]({"keys": [b"k"]})["locs"][0] is not None
        clk.t += 10
        assert svc.reap_once() == [node]
        assert svc.handlers()["lookup"]({"keys": [b"k"]})["locs"] == [None]
        with pytest.raises(Refused, match="not registered"):
            svc.handlers()["publish"]({"node_id": node, "token": token, "keys": [b"k"],
                                       "locs": [loc(node, 0)]})
    finally:
        svc.stop()
