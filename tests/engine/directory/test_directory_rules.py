"""One set of directory rules (peercache/directory/validate.py): the embedded service and the
Redis backend refuse the same bad requests for the same reason, and a consumer refuses a
lookup answer that cannot be a slot."""
import pytest

from peercache import tags
from peercache.directory.client import EmbeddedDirectory
from peercache.directory.redis.backend import RedisDirectory
from peercache.directory.service import MetaService
from peercache.directory.validate import Refused, check_location, read_location
from peercache.errors import RpcError
from peercache.rpc import Limits, RpcServer

REGIONS = [[1, 1 << 20]]

#: (what is wrong, the publish's locs for key b"k" of node NID, the reason both must give)
BAD_PUBLISHES = [
    ("another node's slot", lambda nid: [["someone-else", 1, 7, 0, 64, 64, 3, 9]], "not the publisher"),
    ("a negative offset", lambda nid: [[nid, 1, 7, -4096, 64, 64, 3, 9]], "offset=-4096"),
    ("a string for a number", lambda nid: [[nid, 1, 7, "0", 64, 64, 3, 9]], "offset='0'"),
    ("length beyond the slot", lambda nid: [[nid, 1, 7, 0, 65, 64, 3, 9]], "length 65 > capacity 64"),
    ("a region it did not register", lambda nid: [[nid, 2, 7, 0, 64, 64, 3, 9]], "did not register"),
    ("a slot past its region's end", lambda nid: [[nid, 1, 7, 1 << 20, 64, 64, 3, 9]], "lies outside"),
    ("six fields", lambda nid: [[1, 7, 0, 64, 64, 3]], "must be a list of the 8 fields"),
]


@pytest.fixture
def embedded(port):
    svc = MetaService(limits=Limits(max_keys_per_request=8, max_key_bytes=8))
    server = RpcServer(f"127.0.0.1:{port}", svc.handlers(), limits=svc.limits).start()
    client = EmbeddedDirectory(f"127.0.0.1:{port}", timeout=5.0)
    try:
        yield client
    finally:
        client.close()
        server.stop()
        svc.stop()


@pytest.fixture(params=["embedded", "redis"])
def directory(request, port):
    if request.param == "embedded":
        yield request.getfixturevalue("embedded")
        return
    server = request.getfixturevalue("redis_server")
    d = RedisDirectory(server.url, limits=Limits(max_keys_per_request=8, max_key_bytes=8))
    try:
        yield d
    finally:
        d.close()


@pytest.mark.parametrize("what,locs,why", BAD_PUBLISHES, ids=[b[0] for b in BAD_PUBLISHES])
def test_both_backends_refuse_a_bad_location_for_the_same_reason(directory, what, locs, why):
    reg = directory.call("register", info={"name": "p", "regions": REGIONS})
    nid, tok = reg["node_id"], reg["token"]
    with pytest.raises(RpcError, match="publish refused: location 0") as e:
        directory.call("publish", node_id=nid, token=tok, keys=[b"k"], locs=locs(nid))
    assert why in str(e.value), f"{what}: {e.value}"
    assert directory.call("lookup", keys=[b"k"])["locs"] == [None]      # nothing was written


def test_both_backends_refuse_bad_keys_and_strangers_alike(directory):
    reg = directory.call("register", info={"name": "p", "regions": REGIONS})
    nid, tok = reg["node_id"], reg["token"]
    loc = [nid, 1, 7, 0, 64, 64, 3, tags.key_hash(b"k")]
    with pytest.raises(RpcError, match=r"publish: keys\[0\] is str; keys are byte strings"):
        directory.call("publish", node_id=nid, token=tok, keys=["k"], locs=[loc])
    with pytest.raises(RpcError, match="max_keys_per_request"):
        directory.call("lookup", keys=[b"a"] * 9)
    with pytest.raises(RpcError, match="max_key_bytes"):
        directory.call("lookup", keys=[b"x" * 9])
    with pytest.raises(RpcError, match="missing or wrong token for node"):
        directory.call("publish", node_id=nid, token="forged", keys=[b"k"], locs=[loc])
    with pytest.raises(RpcError, match="it must name the registered node it comes from"):
        directory.call("unpublish", node_id="", token=tok, keys=[b"k"])
    with pytest.raises(RpcError, match="is not registered"):
        directory.call("unpublish", node_id="0123456789ab", token=tok, keys=[b"k"])
    with pytest.raises(RpcError, match=r"info\['regions'\] must be a list of \[region id, size\]"):
        directory.call("register", info={"name": "q", "regions": [[1, -1]]})
    assert directory.call("publish", node_id=nid, token=tok, keys=[b"k"], locs=[loc])["published"] == 1


def test_a_location_rule_names_the_field_and_the_location():
    with pytest.raises(Refused, match="location 3 has rkey=-1"):
        check_location("n", 3, ["n", 1, -1, 0, 64, 64, 0, 0], None)
    assert check_location("n", 0, [1, 7, 0, 64, 64, 0, 0], {1: 4096}) == (1, 7, 0, 64, 64, 0, 0)


@pytest.mark.parametrize("raw,why", [
    (["n", 1, 7, 0, 64, 64, 3], "expected 8 fields"),
    ([5, 1, 7, 0, 64, 64, 3, 9], "is not a string"),
    (["n", 1 << 32, 7, 0, 64, 64, 3, 9], "region 4294967296 is out of range"),
    (["n", 1, 7, 0, 65, 64, 3, 9], "exceeds the slot capacity"),
    (["n", 1, 7, (1 << 64) - 8, 64, 64, 3, 9], "overflows 64 bits"),
    (["n", 1, 7, "0", 64, 64, 3, 9], "is not an integer"),
])
def test_a_consumer_refuses_an_answer_that_cannot_be_a_slot(raw, why):
    loc, reason = read_location(raw)
    assert loc is None and why in reason
    assert read_location(["n", 1, 7, 0, 64, 64, 3, 9])[0].capacity == 64
