"""The latency trace (native/trace.h, peercache.trace): off unless started; started, a tcp read's points
on both sides carry the request id, so a consumer's send and the server's handling of it join up, in
time order on the one CLOCK_MONOTONIC."""
import time

import numpy as np
import pytest

from peercache import trace
from peercache.pool import Pool
from peercache.transport.base import Status, make_ops, native_module
from peercache.transport.tcp import TcpTransport

mod, why = native_module()
pytestmark = pytest.mark.skipif(mod is None, reason=str(why))
RKEY = 0x77


@pytest.fixture
def pair():
    pool = Pool(4, 4096)
    pool.bytes[:] = (np.arange(pool.size) % 241).astype(np.uint8)
    prod = TcpTransport()
    prod.expose(3, pool.mm, RKEY)
    info = prod.start("127.0.0.1")
    cons = TcpTransport(max_channels=1)
    peer = cons.native_peer("p", info)
    yield pool, peer
    cons.close()
    prod.close()
    pool.close()


def _read(peer, pool, i: int) -> None:
    ops = make_ops(1)
    ops[0] = (3, 0, RKEY, i * 4096, 4096, 0)
    dest, st = np.zeros(4096, np.uint8), np.zeros(1, np.int32)
    assert peer.read_batch(ops, [dest], st) is None and st[0] == Status.OK
    assert (dest == pool.bytes[i * 4096:(i + 1) * 4096]).all()


def test_nothing_is_recorded_unless_started(pair):
    pool, peer = pair
    trace.stop()
    _read(peer, pool, 0)
    recs, dropped = trace.stop()
    assert len(recs) == 0 and dropped == 0


def test_a_tcp_reads_points_on_both_sides_join_by_request_id_in_time_order(pair):
    pool, peer = pair
    trace.start(1000)
    for i in range(3):
        _read(peer, pool, i)
    time.sleep(0.1)   # the reply reaches us before the server's sendmsg returns: let it stamp srv_sent
    recs, dropped = trace.stop()
    assert dropped == 0
    names = np.asarray(trace.POINTS)[recs["point"]]
    sends = recs[names == "send_begin"]
    assert len(sends) == 3 and len(set(sends["req"].tolist())) == 3
    # the reply's bytes can reach the client before the server's sendmsg returns: srv_sent is not ordered
    # against the client's receive
    order = ("send_begin", "srv_head", "srv_body", "reply_head", "reply_done")
    for req in sends["req"]:
        mine = {names[j]: int(recs["ns"][j]) for j in np.flatnonzero(recs["req"] == req)}
        assert set(mine) == {"send_begin", "send_end", "srv_wake", "srv_head", "srv_body", "srv_sent",
                             "reply_head", "reply_done"}, mine
        assert [mine[p] for p in order] == sorted(mine[p] for p in order), mine
        # srv_wake may come before our send: a request that arrived while the server was still sending the
        # reply before it is read in that same wake-up
        assert mine["srv_wake"] <= mine["srv_head"] and mine["srv_body"] <= mine["srv_sent"]
        assert mine["send_begin"] <= mine["send_end"]
    # the server's points come from its worker thread, the client's from this one
    assert len(set(recs["tid"][names == "srv_sent"].tolist()) & set(sends["tid"].tolist())) == 0


def test_a_full_trace_drops_and_counts_and_its_document_round_trips(pair):
    pool, peer = pair
    trace.start(5)
    _read(peer, pool, 1)
    _read(peer, pool, 2)
    time.sleep(0.1)   # the server's last srv_sent (see above)
    recs, dropped = trace.stop()
    assert len(recs) == 5 and dropped == 16 - 5      # 8 points a read, both sides
    back = trace.records_of(trace.document(recs, dropped))
    assert (back == recs).all()
    with pytest.raises(ValueError, match="points this build does not have"):
        trace.records_of(dict(trace.document(recs, dropped), points=["nope", *trace.POINTS[1:]]))
