"""The directory's typed ops (peercache.directory.ops.DirectoryOps): each sends the message the
node always sent through ``call``, on both backends, and reads its reply into a small record."""
import pytest

from peercache.directory.client import EmbeddedDirectory
from peercache.directory.ops import DirectoryOps, LookupResult, Members, Published, Registration
from peercache.directory.redis.backend import RedisDirectory


class Recorded(DirectoryOps):
    def __init__(self, reply: dict):
        self.sent: list = []
        self.reply = reply

    def call(self, op, timeout=None, **fields):
        self.sent.append((op, timeout, list(fields.items())))
        return self.reply


def test_both_backends_answer_the_typed_ops():
    assert issubclass(EmbeddedDirectory, DirectoryOps) and issubclass(RedisDirectory, DirectoryOps)
    assert RedisDirectory.lookup is DirectoryOps.lookup          # not the lists form (lookup_lists)


def test_each_op_sends_the_message_it_always_did():
    d = Recorded({"node_id": "n1", "epoch": 4, "token": "t", "limits": {"max_nodes": 3}})
    assert d.register({"name": "a"}) == Registration("n1", 4, "t", {"max_nodes": 3}, None)
    assert d.register({"name": "a"}, "n1", None).node_id == "n1"          # no token: a first registration
    d.register({"name": "a"}, "n1", "t")
    assert d.sent == [("register", None, [("info", {"name": "a"})]), ("register", None, [("info", {"name": "a"})]),
                      ("register", None, [("info", {"name": "a"}), ("node_id", "n1"), ("token", "t")])]
    d = Recorded({"known": 0})
    assert d.heartbeat("n1", "t") is False
    d.leave("n1", "t", timeout=1.0)
    assert d.sent == [("heartbeat", None, [("node_id", "n1"), ("token", "t")]),
                      ("leave", 1.0, [("node_id", "n1"), ("token", "t")])]
    d = Recorded({"refused": 1, "refused_index": [1], "refused_keys": [b"b"], "unpublished": 2})
    assert d.publish("n1", "t", [b"a", b"b"], [[1], [2]], [b"c"]) == Published(1, [1], [b"b"])
    assert d.unpublish("n1", "t", [b"c", b"d"]) == 2
    assert d.sent == [("publish", None, [("node_id", "n1"), ("token", "t"), ("keys", [b"a", b"b"]),
                                         ("locs", [[1], [2]]), ("unpublish", [b"c"])]),
                      ("unpublish", None, [("node_id", "n1"), ("token", "t"), ("keys", [b"c", b"d"])])]
    assert Recorded({}).publish("n1", "t", [], []) == Published(0, [], [])
    d = Recorded({"nodes": {"n1": {}}, "epoch": 5, "nums": {0: "n1"}})
    assert d.members() == Members({"n1": {}}, 5, None, {0: "n1"}) and d.sent == [("members", None, [])]
    d = Recorded({"recs": b"", "nids": {}, "epoch": 5})
    assert d.lookup((b"a",), epoch=3) == LookupResult(True, 5, None, b"", {}, None)
    assert d.sent == [("lookup", None, [("keys", [b"a"]), ("recs", True), ("epoch", 3)])]


def test_a_lookup_reply_of_either_shape():
    r = LookupResult.of({"ok": True, "recs": b"x", "nids": {0: "n"}, "epoch": 2, "missing": b"m", "nodes": {"n": {}}})
    assert r == LookupResult(True, 2, {"n": {}}, b"x", {0: "n"}, b"m")
    r = LookupResult.of({"ok": True, "locs": [None], "nodes": {}, "epoch": 2})
    assert r == LookupResult(False, 2, {}, locs=[None])
    with pytest.raises(KeyError):
        LookupResult.of({"ok": True, "locs": [None], "epoch": 2})      # the original form names its nodes
