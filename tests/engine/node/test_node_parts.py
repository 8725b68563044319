"""The parts of a node (peercache/node/), each on its own with a directory that records what it is
asked: the membership's request slices, the publisher's refused keys, the resolver's tiers and its
stale retry, the reader's one retry of stale locations."""
import dataclasses

import numpy as np

from peercache import tags
from peercache.directory.cache import DirectoryCache
from peercache.directory.ops import DirectoryOps, Heartbeat
from peercache.errors import DiscoveryUnreachable, RpcError
from peercache.node.lookup_replies import LookupReplies
from peercache.node.membership import Membership
from peercache.node.peers import PeerInfos
from peercache.node.publisher import POOL_REGION, Publisher
from peercache.node.reader import Reader
from peercache.node.resolver import Resolver
from peercache.node.result import Get
from peercache.pool import Pool
from peercache.rpc import DEFAULT_LIMITS
from peercache.transport.base import ABSENT, LOC_DTYPE


class Directory(DirectoryOps):
    """A directory client that answers from a dict of records and records every request (the
    typed ops send their messages through ``call``)."""

    host = "127.0.0.1"

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self.records: dict[bytes, tuple] = {}      # key -> (offset, length) on node "p"
        self.refuse: set[bytes] = set()

    def call(self, op, timeout=None, **fields):
        self.calls.append((op, fields))
        if op == "register":
            return {"node_id": "p", "token": "t", "epoch": 3}
        if op == "members":
            return {"nodes": {"p": {"data": {"host": "0.0.0.0", "port": 1}}}, "epoch": 3}
        if op == "publish":
            refused = [i for i, k in enumerate(fields["keys"]) if k in self.refuse]
            return {"refused": len(refused), "refused_index": refused,
                    "refused_keys": [fields["keys"][i] for i in refused]}
        if op == "unpublish":
            return {"unpublished": len(fields["keys"])}
        if op == "lookup":
            keys = fields["keys"]
            have = [k for k in keys if k in self.records]
            rows = np.zeros(len(have), LOC_DTYPE)
            for j, k in enumerate(have):
                off, length = self.records[k]
                rows[j] = (0, POOL_REGION, 9, off, length, 4096, 1, tags.key_hash(k))
            missing = np.array([i for i, k in enumerate(keys) if k not in self.records], "<u4")
            return {"recs": rows.tobytes(), "nids": {0: "p"}, "epoch": 3, "missing": missing.tobytes(),
                    "nodes": {"p": {"data": {"host": "0.0.0.0", "port": 1}}}}
        raise AssertionError(op)

    def ops(self) -> list[str]:
        return [op for op, _ in self.calls]


def membership(d: Directory) -> Membership:
    m = Membership(d, {"name": "p"}, 1.0)
    m.register()
    return m


def test_requests_are_sliced_to_the_directorys_limits():
    m = membership(Directory())
    keys = [b"k%d" % i for i in range(10)]
    assert list(m.slices(keys, 8)) == [(0, 10)]
    m.limits = dataclasses.replace(DEFAULT_LIMITS, max_keys_per_request=4)
    assert list(m.slices(keys, 8)) == [(0, 4), (4, 8), (8, 10)]
    m.limits = dataclasses.replace(DEFAULT_LIMITS, max_message_bytes=(64 << 10) + 25)
    assert list(m.slices(keys, 8)) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]   # 2 + 8 B a key
    assert list(m.slices([], 8)) == [(0, 0)]


def test_refused_keys_are_published_again_on_a_heartbeat_until_evicted():
    d = Directory()
    pool = Pool(2, 64)
    try:
        pub = Publisher(pool, d, membership(d))
        d.refuse = {b"b"}
        pub.put_batch([b"a", b"b"], [b"A", b"B"])
        assert pub.refused_total == 1 and pub._refused == {b"b"}
        d.calls.clear()
        pub.retry_refused()                            # still refused: still pending
        assert d.ops() == ["publish"] and d.calls[0][1]["keys"] == [b"b"] and pub._refused == {b"b"}
        d.refuse = set()
        pub.retry_refused()
        assert not pub._refused
        d.refuse = {b"c"}
        pub.put_batch([b"c"], [b"C"])                  # refused, then evicted by the next two
        pub.put_batch([b"d", b"e"], [b"D", b"E"])
        d.calls.clear()
        pub.retry_refused()
        assert d.ops() == [] and not pub._refused      # evicted meanwhile: nothing to retry
    finally:
        pool.close()


def test_a_republish_cut_short_is_done_again_on_the_next_heartbeat():
    """The directory forgot the node (it restarted): the node registers again and republishes; a
    republish that fails (the directory gone again, a timeout) is done again on the next heartbeat
    instead of leaving the node registered with its pages unpublished for good."""
    d = Directory()
    m = Membership(d, {"name": "p"}, 0.001)
    m.register()
    answers = iter([False, True, True, True])
    beats: list = []

    class Heartbeats:
        @staticmethod
        def renew(node_id, token):
            known = next(answers, None)
            if known is None:
                m._stop.set()
                return Heartbeat(True)
            return Heartbeat(known)

    def republish():
        beats.append("republish")
        if beats.count("republish") == 1:
            raise RpcError("discovery at 127.0.0.1:9 closed the connection this call's request went on")
    m.on_forgotten, m.on_heartbeat = republish, lambda: beats.append("heartbeat")
    m._heartbeats(Heartbeats())
    assert d.ops().count("register") == 2 and not m.republish_due
    assert beats == ["republish", "republish", "heartbeat", "heartbeat", "heartbeat"], beats


def test_a_heartbeat_that_says_entries_were_lost_republishes_without_registering_again():
    """A Redis directory that failed over to a replica lacking the last writes: the node is still known,
    but its heartbeat says some of its publish marks were behind; the node publishes its pool again
    (until that succeeds), and goes back to retrying refused keys on the heartbeats after."""
    d = Directory()
    m = Membership(d, {"name": "p"}, 0.001)
    m.register()
    answers = iter([Heartbeat(True), Heartbeat(True, lost=2), Heartbeat(True), Heartbeat(True)])
    beats: list = []

    class Heartbeats:
        @staticmethod
        def renew(node_id, token):
            beat = next(answers, None)
            if beat is None:
                m._stop.set()
                return Heartbeat(True)
            return beat

    def republish():
        beats.append("republish")
        if beats.count("republish") == 1:
            raise DiscoveryUnreachable("directory redis://127.0.0.1:9/0 unreachable during 'publish'")
    m.on_forgotten, m.on_heartbeat = republish, lambda: beats.append("heartbeat")
    m._heartbeats(Heartbeats())
    assert d.ops().count("register") == 1 and not m.republish_due
    assert beats == ["heartbeat", "republish", "republish", "heartbeat", "heartbeat"], beats
    assert m.lost_reports == 1 and m.lost_reported_at is not None


class Table:
    """A directory table reader that must not be asked (the RPC alone answers)."""

    view = "a table"

    def one(self, key, deadline=None):
        raise AssertionError("the table was asked")

    rows = lookup = one


def resolver(d: Directory, ttl: float = 30.0) -> Resolver:
    cache = DirectoryCache(ttl)
    peers = PeerInfos(d, d.host)
    return Resolver(cache, Table(), d, membership(d), peers, LookupReplies(cache, peers, "directory"))


def test_the_stale_retry_forgets_the_cached_location_and_asks_the_directory_itself():
    d = Directory()
    d.records = {b"a": (0, 10), b"b": (4160, 20)}
    r = resolver(d)
    keys = [b"a", b"b"]
    # cached (as a table answer would have been), then the producer moved b
    r.cache.put_rows(keys, r.rpc_rows(keys))
    d.records[b"b"] = (8320, 30)
    d.calls.clear()
    rows = r.lookup_rows(keys, [])
    assert d.calls == [] and rows["offset"].tolist() == [0, 4160]          # the cache answers
    bad: list = []
    again = r.relocate([b"b"], bad, as_rows=True)
    assert d.ops() == ["lookup"] and again["offset"].tolist() == [8320] and not bad
    assert r.lookup_rows([b"b"], [])["offset"].tolist() == [8320]            # cached anew
    locs = r.relocate([b"b", b"gone"], bad, as_rows=False)                   # the Location form
    assert locs[0].offset == 8320 and locs[0].node_id == "p" and locs[1] is None
    del d.records[b"a"]                                                      # a left the directory
    assert r.relocate([b"a"], bad, as_rows=True)["node"].tolist() == [ABSENT]
    assert r.cache.lookup_into([b"a"], np.empty(1, LOC_DTYPE)) == 0          # and the cache


def test_an_invalid_entry_is_reported_never_cached():
    d = Directory()
    d.records = {b"a": (0, 10), b"huge": (0, 5000)}                      # longer than its 4096 B slot
    r = resolver(d)
    bad: list = []
    rows = r.relocate([b"a", b"huge"], bad, as_rows=True)
    assert rows["node"][1] == ABSENT and bad == [(1, "length 5000 exceeds the slot capacity 4096")]
    assert r.replies.bad_locations == 1
    assert r.cache.lookup_into([b"huge"], np.empty(1, LOC_DTYPE)) == 0


class Located:
    """A resolver whose locations are given: ``first`` for the batch, ``fresh`` after a tag mismatch."""

    def __init__(self, first, fresh):
        self.first, self.fresh, self.relocated = first, fresh, []

    def locate(self, keys, bad, want, deadline=None):
        want[:] = [tags.key_hash(k) for k in keys]
        return self.first

    def relocate(self, keys, bad, as_rows, deadline=None):
        self.relocated.append(list(keys))
        return self.fresh


def test_a_stale_location_is_read_once_more_then_a_miss():
    keys = [b"hit", b"stale", b"moved", b"redirected"]
    res = Located(first="first", fresh="fresh")
    reader = Reader(None, transport=None, cache=None, resolver=res, peers=None, integrity=False, timeout=1.0)
    reads = []

    def read(keys_, want, locs, dest, offsets, caps, status, lengths, gens, content, checks):
        reads.append((list(keys_), locs, offsets.tolist()))
        if locs == "first":                       # the first read: keys 1..3 did not match their tags
            status[0], lengths[0] = Get.HIT, 5
            return None, np.array([1, 2, 3]), np.array([], np.intp)
        status[1], lengths[1] = Get.HIT, 7            # "moved": found where the directory says now
        return "an error", np.array([0, 2]), np.array([2])     # "redirected": another key's slot

    reader.read_via_transport = read
    reader._redirected = lambda keys_, locs, idx: f"{keys_[int(idx[0])]!r} redirected"
    r = reader.get_batch_into(keys, bytearray(64), [0, 16, 32, 48])
    assert res.relocated == [[b"stale", b"moved", b"redirected"]]                 # one fresh lookup
    assert [k for k, _, _ in reads] == [keys, [b"stale", b"moved", b"redirected"]]  # one more read, no more
    assert reads[1][2] == [16, 32, 48]
    assert r.status.tolist() == [Get.HIT, Get.MISS, Get.HIT, Get.MISS]
    assert r.lengths.tolist() == [5, 0, 7, 0] and r.error == "an error"
    assert r.redirected.tolist() == [3] and r.miss_reason == "b'redirected' redirected"
    assert reader.stale_locations == 3
