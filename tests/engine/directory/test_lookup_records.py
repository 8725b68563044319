"""The fast lookup reply (fixed binary records, node infos only when the client's epoch is stale)
and the Node's fallback to the original ``{locs, nodes, epoch}`` reply; drive's bounded latency samples."""
import dataclasses
import random

import numpy as np
import pytest

import peercache
from peercache.bench import drive
from peercache.bench.cli import build_parser
from peercache.bench.drive import stats
from peercache.directory.location import RECORD
from peercache.directory.service import MetaService
from peercache.directory.store import Directory
from peercache.errors import PeerCacheError, RpcError
from peercache.node import Get, Node
from peercache.rpc import RpcServer
from peercache.transport.base import LOC_DTYPE

from conftest import free_port


def loc(node, off, gen=1):
    return [node, 1, 99, off, 10, 16, gen, 1234]


def test_records_are_the_locations_found_in_order_with_the_misses_indexed():
    d = Directory()
    d.publish("n1", [b"a", b"b"], [loc("n1", 0), loc("n1", 64)])
    d.publish("n2", [b"c"], [loc("n2", 128, gen=7)])
    blob, missing, nids = d.lookup_records([b"b", b"zz", b"c", b"a", b"yy"])
    assert np.frombuffer(missing, "<u4").tolist() == [1, 4]
    rows = np.frombuffer(blob, LOC_DTYPE)
    assert [nids[int(n)] for n in rows["node"]] == ["n1", "n2", "n1"]
    assert rows["offset"].tolist() == [64, 128, 0] and rows["generation"].tolist() == [1, 7, 1]
    assert d.lookup_lists([b"c", b"zz"]) == [["n2", 1, 99, 128, 10, 16, 7, 1234], None]
    blob, missing, nids = d.lookup_records([b"a"])
    assert missing == b"" and len(blob) == RECORD.size and nids == {int(rows["node"][2]): "n1"}
    assert d.lookup_records([]) == (b"", b"", {})


def test_an_entry_that_fits_no_record_makes_discovery_answer_the_original_way():
    svc = MetaService()
    try:
        reg = svc.handlers()["register"]({"info": {"name": "p"}})
        node, token = reg["node_id"], reg["token"]
        svc.handlers()["publish"]({"node_id": node, "token": token, "keys": [b"k"], "locs": [loc(node, 0)]})
        r = svc.handlers()["lookup"]({"keys": [b"k", b"x"], "recs": True, "epoch": None})
        assert set(r) == {"recs", "nids", "missing", "epoch", "nodes"} and node in r["nodes"]
        # a current epoch: no node infos in the reply
        assert "nodes" not in svc.handlers()["lookup"]({"keys": [b"k"], "recs": True, "epoch": r["epoch"]})
        # without recs: the original reply, unchanged
        old = svc.handlers()["lookup"]({"keys": [b"k", b"x"]})
        assert old["locs"] == [loc(node, 0), None] and set(old["nodes"]) == {node}
        svc.directory.publish(node, [b"bad"], [[node, 1, 99, -5, 10, 16, 1, 1234]])   # what only the API can write
        r = svc.handlers()["lookup"]({"keys": [b"k", b"bad"], "recs": True, "epoch": None})
        assert "recs" not in r and r["locs"][1][3] == -5
    finally:
        svc.stop()


@pytest.fixture
def producer(port):
    addr = f"127.0.0.1:{port}"
    prod = peercache.Client(addr, host_discovery=True, pool_bytes=16 * 4160, page_size=4096)
    prod.put_batch(["a", "b"], [b"A" * 100, b"B" * 50])
    yield addr, prod
    prod.close()


def _old_server(meta: MetaService, port: int) -> RpcServer:
    """A real discovery of the original protocol: its lookup ignores ``recs`` and ``epoch``."""
    handlers = meta.handlers()
    handlers["lookup"] = lambda msg: meta.handlers()["lookup"]({"keys": msg["keys"]})
    return RpcServer(f"127.0.0.1:{port}", handlers, limits=meta.limits).start()


@pytest.mark.parametrize("native", [True, False])
def test_node_reads_the_original_reply_of_another_directory(producer, native):
    addr, prod = producer
    old = _old_server(prod.node.meta, free_port())
    try:
        with Node(old.address.replace("tcp://", ""), dir_cache_ttl=0.0) as cons:
            if not native:
                cons.reader.native = None
            dest = np.zeros(2 * 4096, np.uint8)
            r = cons.get_batch_into([b"a", b"nope", b"b"], dest, [0, 4096, 0])
            assert r.status.tolist() == [Get.HIT, Get.MISS, Get.HIT] and r.lengths[0] == 100
            assert cons.exists_batch([b"b", b"nope"]) == [True, False]
    finally:
        old.stop()


def test_a_node_seen_first_at_the_current_epoch_is_fetched_once(producer):
    addr, prod = producer
    with peercache.Client(addr, dir_cache_ttl=0.0, page_size=4096) as cons:
        assert cons.get("a") == b"A" * 100                  # stale epoch: the reply carried A's info
        with peercache.Client(addr, pool_bytes=8 * 4160, page_size=4096) as prod2:
            prod2.put("c", b"C" * 10)
            cons.node.lookup([b"a"], use_cache=False)       # epoch now current, only A known
            assert prod2.node.node_id not in cons.node.peers
            assert cons.get("c") == b"C" * 10                # B unknown at this epoch: one members call
            assert prod2.node.node_id in cons.node.peer_infos.fresh


def test_a_malformed_record_reply_is_an_rpc_error(producer):
    addr, prod = producer
    bad = RpcServer(f"127.0.0.1:{free_port()}", {
        **prod.node.meta.handlers(),
        "lookup": lambda msg: {"recs": b"\0" * 55, "nids": {}, "epoch": 1},
    }).start()
    try:
        with Node(bad.address.replace("tcp://", "")) as cons:
            with pytest.raises(RpcError, match="malformed lookup reply"):
                cons.lookup([b"a"])
            assert issubclass(RpcError, PeerCacheError)
    finally:
        bad.stop()


def test_drive_keeps_a_bounded_uniform_sample_of_latencies(monkeypatch):
    monkeypatch.setattr(stats, "LATENCY_SAMPLES", 100)
    st, rnd = drive.ThreadStats(), random.Random(1)
    for i in range(10_000):
        st.sample_latency(i * 1e-6, rnd)
    assert len(st.latencies) == 100 and st.latency_seen == 10_000
    assert 3000 < np.median(st.latencies) * 1e6 < 7000          # a sample of the whole window, not its start
    cfg = dataclasses.replace(drive.DriveConfig.from_args(build_parser().parse_args(["drive"]), drive.Worker),
                              duration=1.0, layout="mla", op="get", processes=1, batch_size=1, page_size=4096,
                              verify=False)
    p = drive.aggregate(1, cfg, [{"stats": dict(st.__dict__, batches=10_000, keys=10_000, hits=10_000),
                                  "abort": []}])
    assert p.latency_samples == 100 and p.latency_batches == 10_000 and p.latency_us["p50"] > 0


def test_a_split_batch_whose_replies_mix_records_and_lists_is_merged(producer):
    """A batch over the key limit goes as several lookups; one directory reply may be ``locs`` and another
    ``recs`` (a Redis value of an older layout answers the original way): merged key by key, in order."""
    addr, prod = producer
    meta, calls = prod.node.meta, []

    def lookup(msg):      # the second and later parts answered the original way
        calls.append(len(msg["keys"]))
        return meta.handlers()["lookup"](msg if len(calls) == 1 else {"keys": msg["keys"]})

    srv = RpcServer(f"127.0.0.1:{free_port()}", {**meta.handlers(), "lookup": lookup}, limits=meta.limits).start()
    try:
        with Node(srv.address.replace("tcp://", ""), dir_cache_ttl=0.0) as cons:
            cons.membership.limits = dataclasses.replace(cons.limits, max_keys_per_request=2)
            keys = [b"nope", b"a", b"b", b"x", b"a"]
            locs = cons.lookup(keys)
            assert calls == [2, 2, 1]
            assert [l is not None for l in locs] == [False, True, True, False, True]
            assert locs[1] == locs[4] and locs[1].length == 100 and locs[2].length == 50
            assert {locs[1].node_id, locs[2].node_id} == {prod.node.node_id}
    finally:
        srv.stop()
