import socket
import struct

import numpy as np
import pytest

from oracles.tcp_client import HEAD, REP_MAGIC, PythonTcpTransport, recv_exact
from peercache.transport.base import Status, make_ops
from peercache.transport.tcp import TcpTransport

#: The engine's client (native) and its Python twin (tests/oracles): both must read the same.
CLIENTS = pytest.mark.parametrize("client", [TcpTransport, PythonTcpTransport], ids=["native", "python"])


@pytest.fixture(params=[TcpTransport, PythonTcpTransport], ids=["native", "python"])
def served(request):
    region = np.arange(4096, dtype=np.uint8)
    prod = TcpTransport()
    prod.expose(3, region, rkey=77)
    info = prod.start("127.0.0.1")
    cons = request.param(max_channels=2)
    yield region, info, prod, cons
    cons.close()
    prod.close()


def op(ops, i, off, ln, loff, region=3, rkey=77, lr=0):
    ops[i] = (region, lr, rkey, off, ln, loff)


def test_ranges_land_at_offsets_and_bad_ops_are_refused(served):
    region, info, prod, cons = served
    ops = make_ops(6)
    op(ops, 0, 100, 50, 0)
    op(ops, 1, 4000, 96, 100)
    op(ops, 2, 0, 10, 0, rkey=78)          # wrong key
    op(ops, 3, 4090, 10, 0)                # past the end of the region
    op(ops, 4, 0, 0, 0)                    # zero length
    op(ops, 5, 0, 10, 250)                 # past the end of the local buffer
    dest = np.zeros(256, dtype=np.uint8)
    st = cons.read_batch("p", info, ops, [dest])
    assert st.tolist() == [Status.OK, Status.OK, Status.BAD_REGION, Status.OUT_OF_RANGE,
                           Status.ZERO_LENGTH, Status.LOCAL_RANGE]
    assert (dest[:50] == region[100:150]).all() and (dest[100:196] == region[4000:4096]).all()
    assert prod.refused >= 2
    # the server keeps serving after refusing
    ops2 = make_ops(1)
    op(ops2, 0, 0, 8, 0)
    assert cons.read_batch("p", info, ops2, [dest]).tolist() == [Status.OK]


def test_bad_magic_gets_refusal_and_server_survives(served):
    region, info, prod, cons = served
    with socket.create_connection((info["host"], info["port"]), timeout=3) as s:
        s.sendall(HEAD.pack(b"JUNK", 0, 1, 5) + b"\0" * 32)
        magic, code, n, rid = HEAD.unpack(recv_exact(s, HEAD.size))
        (ln,) = struct.unpack("<I", recv_exact(s, 4))
        assert magic == REP_MAGIC and code != 0 and b"bad request magic" in recv_exact(s, ln)
    ops = make_ops(1)
    op(ops, 0, 8, 8, 0)
    dest = np.zeros(8, dtype=np.uint8)
    assert cons.read_batch("p", info, ops, [dest]).tolist() == [Status.OK]
    assert (dest == region[8:16]).all()


@CLIENTS
def test_unreachable_peer_is_peer_gone(client):
    cons = client()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    ops = make_ops(1)
    op(ops, 0, 0, 8, 0)
    st = cons.read_batch("gone", {"host": "127.0.0.1", "port": dead_port}, ops, [bytearray(8)])
    assert st.tolist() == [Status.PEER_GONE]
    cons.close()


@pytest.mark.parametrize("workers, conns", [(2, 6), (3, 7), (2, 2)])
def test_accepted_connections_are_spread_over_the_workers(workers, conns):
    """EPOLLEXCLUSIVE wakes one worker per new connection, often the same one: the worker that accepts
    hands a connection to the one serving the fewest, so busy clients never share a thread while
    another idles. Each worker ends within one connection of every other, and every connection is
    served (each reads a range back)."""
    import time
    from peercache.pool import Pool
    pool = Pool(4, 4096)
    pool.bytes[:] = (np.arange(pool.size) % 249).astype(np.uint8)
    prod = TcpTransport(server_workers=workers)
    prod.expose(5, pool.mm, 0x33)
    info = prod.start("127.0.0.1")
    clients = []
    try:
        for _ in range(conns):
            cons = TcpTransport(max_channels=1)
            clients.append(cons)
            peer = cons.native_peer("p", info)
            ops = make_ops(1)
            ops[0] = (5, 0, 0x33, 4096, 4096, 0)
            dest, st = np.zeros(4096, np.uint8), np.zeros(1, np.int32)
            assert peer.read_batch(ops, [dest], st) is None and st[0] == Status.OK
            assert (dest == pool.bytes[4096:8192]).all()
        deadline = time.monotonic() + 5
        while True:
            per = prod.server_stats()["worker_connections"]
            if sum(per) == conns or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert len(per) == workers and sum(per) == conns, per
        assert max(per) - min(per) <= 1, per
    finally:
        for c in clients:
            c.close()
        prod.close()
        pool.close()
