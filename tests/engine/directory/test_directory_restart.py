"""The embedded directory started again at the same address (issue 39, item 3), in one process: the
token rule of a directory that knows nobody, its epochs, and a producer and a consumer that come back
to it on their own. The same with real processes, measured: tests/engine/bench/test_directory_restart_e2e.py.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import scaled
from peercache.directory.service import EPOCH_SPACE, MetaService
from peercache.directory.validate import Refused
from peercache.errors import DiscoveryUnreachable, RpcError
from peercache.node import Get, Node
from peercache.rpc import RpcServer

PAGE = 4096
KEYS = [b"r%d" % i for i in range(24)]
#: the nodes' heartbeat interval here: a node is back within one of these after the directory is
HEARTBEAT_S = 0.2


def _register(svc: MetaService, name: str, node_id=None, token=None) -> tuple[str, str]:
    reply = svc.handlers()["register"]({"info": {"name": name}, "node_id": node_id, "token": token})
    return reply["node_id"], reply["token"]


def test_a_restarted_directory_gives_no_id_back_to_an_old_token_nor_to_anyone_else():
    """A directory knows only the tokens it issued. Within its life, a node dropped for silence gets
    its id back with its token, and nobody gets another's id without it. Started again, it knows no
    token: every claim of an id -- the holder's own, someone else's with the wrong token, one it never
    issued -- gets a fresh id, so no old token lets anyone take an id."""
    first = MetaService(60.0)
    try:
        a, ta = _register(first, "a")
        b, tb = _register(first, "b")
        assert a != b and ta != tb
        assert _register(first, "b", a, tb)[0] not in (a, b)        # a's id with b's token: not a's
        assert _register(first, "x", a, "f" * 32)[0] != a           # a forged token
        first.membership.leave(a)
        assert _register(first, "a", a, ta) == (a, ta)              # its own id back, with its token
        old_epochs = {first.membership.epoch, first.membership.incarnation}
    finally:
        first.stop()

    again = MetaService(60.0)                                       # the same directory, started again
    try:
        assert again.handlers()["heartbeat"]({"node_id": a, "token": ta})["known"] is False
        ids = {_register(again, "b", a, tb)[0],                     # someone else's id, its own token
               _register(again, "x", "0123456789ab", "0" * 32)[0],  # an id nobody ever held
               _register(again, "a", a, ta)[0],                     # the holder itself: unproven too
               _register(again, "b", b, tb)[0]}
        assert len(ids) == 4 and not ids & {a, b}, ids
        members = again.handlers()["members"]({})
        assert set(members["nodes"]) == ids
        # what the old tokens can still do here: nothing in a's or b's name
        for nid, tok in ((a, ta), (b, tb)):
            with pytest.raises(Refused, match="not registered"):
                again.handlers()["publish"]({"node_id": nid, "token": tok, "keys": [b"k"],
                                             "locs": [[nid, 1, 0, 0, 1, 1, 1, 0]]})
        # each incarnation draws its own first epoch: a consumer's epoch of the old one is not current
        assert 0 <= again.membership.incarnation < EPOCH_SPACE
        assert again.membership.epoch == again.membership.incarnation + 4
        assert again.membership.epoch not in old_epochs
    finally:
        again.stop()


def _host(addr: str) -> tuple[MetaService, RpcServer]:
    svc = MetaService(2.0)
    return svc, RpcServer(addr, svc.handlers(), limits=svc.limits, deferred_ops=("members",)).start()


def _read(node: Node) -> np.ndarray:
    dest = np.zeros(len(KEYS) * PAGE, np.uint8)
    r = node.get_batch_into(KEYS, dest, np.arange(len(KEYS), dtype=np.uint64) * PAGE, [PAGE] * len(KEYS))
    ok = r.status == Get.HIT
    for i in np.flatnonzero(ok):
        assert bytes(dest[i * PAGE: i * PAGE + 100]) == bytes([i + 1]) * 100, f"wrong bytes for {KEYS[i]!r}"
    return r.status


def test_a_producer_and_a_consumer_come_back_to_a_restarted_directory_on_their_own(port):
    """The directory (a MetaService behind an RpcServer, as `peercache-bench meta` hosts it) goes away
    and is started again at the same address: while it is gone, a consumer's lookups fail at once
    (not at their bound); once it is back, both nodes register again under fresh ids within a heartbeat
    or two, the producer republishes its pages, and the consumer reads them, right, without either
    node being restarted."""
    addr = f"127.0.0.1:{port}"
    svc, srv = _host(addr)
    prod = cons = None
    try:
        prod = Node(addr, host_discovery=False, pool_slots=64, slot_capacity=PAGE, heartbeat_interval=HEARTBEAT_S,
                    rpc_timeout=2.0)
        cons = Node(addr, host_discovery=False, heartbeat_interval=HEARTBEAT_S, rpc_timeout=2.0)
        prod.put_batch(KEYS, [bytes([i + 1]) * 100 for i in range(len(KEYS))])
        assert (_read(cons) == Get.HIT).all()
        old = {prod.node_id, cons.node_id}

        srv.stop()
        svc.stop()
        t = time.monotonic()
        with pytest.raises((DiscoveryUnreachable, RpcError)):
            cons.lookup(KEYS, use_cache=False)
        assert time.monotonic() - t < scaled(1.0), "a lookup while the directory is gone waited its bound"

        svc, srv = _host(addr)                       # the directory, back at the same address
        back = time.monotonic()
        end = back + scaled(5.0)
        while True:
            members = set(svc.membership.members())
            found = sum(loc is not None for loc in svc.directory.lookup(KEYS))
            if members == {prod.node_id, cons.node_id} and not members & old and found == len(KEYS):
                break
            assert time.monotonic() < end, f"members {members} (before: {old}), {found} of {len(KEYS)} keys"
            time.sleep(0.02)
        took = time.monotonic() - back
        assert took < scaled(3 * HEARTBEAT_S + 1.0), took
        end = time.monotonic() + scaled(3.0)
        while True:
            try:
                if (_read(cons) == Get.HIT).all():
                    break
            except DiscoveryUnreachable:       # a first lookup may meet its connection being made again
                pass
            assert time.monotonic() < end, "the consumer did not read every page again"
            time.sleep(0.02)
        print(f"both nodes registered again and {len(KEYS)} pages republished {took:.2f} s after the "
              "directory was back")
    finally:
        for n in (cons, prod):
            if n is not None:
                n.close()
        srv.stop()
        svc.stop()
