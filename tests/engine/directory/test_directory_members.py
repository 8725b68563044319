"""The embedded directory's member numbers: as many as there are live members, however many
registrations came and went, and a number given again never carries the old member's entries
(issue 36, finding 9)."""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest

from peercache import tags
from peercache.directory.service import MetaService
from peercache.directory.table import TableView
from peercache.directory.validate import Refused

INFO = {"name": "cycler", "host": "127.0.0.1", "protocol": "tcp", "regions": [[1, 1 << 20]]}
CYCLES = 100_000
#: What 100,000 cycles may add to the process: the retired-token ring (4,096 tokens, bounded) and
#: allocator slack. Before the fix the number map alone grew ~14 MiB.
BUDGET = 2 << 20


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no VmRSS in /proc/self/status (not Linux)")


def _loc(key: bytes, off: int) -> list:
    return [1, 77, off, 100, 4096, 1, tags.key_hash(key)]


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _table_has(svc: MetaService, key: bytes) -> int | None:
    """The member number of ``key``'s entry in the table, None when the table says absent."""
    table = svc.directory.table
    view = TableView({**table.info(), "node_id": "host"})
    kh = np.array([tags.key_hash(key)], np.uint64)
    ub, inv, remote, length, local, nbytes = view.plan(kh)
    mem, buf = np.frombuffer(table.mm, np.uint8), np.zeros(nbytes, np.uint8)
    for r, ln, lo in zip(remote.tolist(), length.tolist(), local.tolist()):
        buf[lo:lo + ln] = mem[r:r + ln]
    _, recs, found, absent = view.parse(buf, ub, inv, kh)
    assert found[0] or absent[0], "the table could not answer"
    return int(np.ascontiguousarray(recs).view("<u4")[0, 0]) if found[0] else None


def test_100k_register_leave_and_expiry_cycles_keep_memory_bounded_by_live_members():
    svc = MetaService(table_entries=1024, reaper=False)   # this test reaps, on its own clock
    clock = FakeClock()
    svc.membership.clock = clock
    h = svc.handlers()
    try:
        alive = h["register"]({"info": INFO})
        stay = {"node_id": alive["node_id"], "token": alive["token"]}
        h["publish"]({**stay, "keys": [b"kept"], "locs": [_loc(b"kept", 0)]})
        timeout = svc.membership.heartbeat_timeout

        def cycle(i: int) -> None:
            r = h["register"]({"info": INFO})
            me = {"node_id": r["node_id"], "token": r["token"]}
            if i % 16 == 0:      # some own entries, in the dict and the table
                h["publish"]({**me, "keys": [b"k%d" % i], "locs": [_loc(b"k%d" % i, 0)]})
            if i % 2:
                h["leave"](me)
            else:                # the other way out: missed heartbeats
                clock.t += timeout + 1
                h["heartbeat"](stay)
                assert svc.reap_once() == [r["node_id"]]

        for i in range(200):     # the first allocations of every structure, before the baseline
            cycle(i)
        gc.collect()
        before, t0 = _rss(), time.monotonic()
        for i in range(CYCLES):
            cycle(i)
        gc.collect()
        grew, took = _rss() - before, time.monotonic() - t0
        print(f"{CYCLES} cycles in {took:.1f} s: RSS +{grew / 2**20:.2f} MiB")
        d = svc.directory
        assert grew <= BUDGET, (f"{CYCLES} register/leave cycles with one member alive grew RSS by "
                                f"{grew / 2**20:.1f} MiB (budget {BUDGET >> 20} MiB)")
        assert len(d._num) == 1 and len(d._ids) <= 2, "member numbers outlived their members"
        assert len(d) == 1 and len(d.table) == 1 and d.lookup([b"kept"])[0].node_id == stay["node_id"]
    finally:
        svc.stop()


def test_a_number_given_again_owns_nothing_of_its_former_member():
    svc = MetaService(table_entries=1024)
    h = svc.handlers()
    try:
        a = h["register"]({"info": INFO})
        old = {"node_id": a["node_id"], "token": a["token"]}
        h["publish"]({**old, "keys": [b"old"], "locs": [_loc(b"old", 0)]})
        num = svc.directory.number(a["node_id"])
        assert _table_has(svc, b"old") == num
        h["leave"](old)

        b = h["register"]({"info": INFO})
        new = {"node_id": b["node_id"], "token": b["token"]}
        assert svc.directory.number(b["node_id"]) == num          # recycled
        assert svc.directory.lookup([b"old"]) == [None] and _table_has(svc, b"old") is None
        assert h["lookup"]({"keys": [b"old"], "recs": True}).get("missing")
        h["publish"]({**new, "keys": [b"new"], "locs": [_loc(b"new", 64)]})
        assert svc.directory.lookup([b"new"])[0].node_id == b["node_id"] and _table_has(svc, b"new") == num
        assert svc.directory.numbers(svc.membership.members()) == {num: b["node_id"]}

        # A publish of the old member's that was authorized just before it left gets no number back
        # (its entries would outlive it, owned by whoever gets that number next).
        with pytest.raises(Refused, match="not registered"):
            svc.directory.publish_checked(a["node_id"], [b"late"], [_loc(b"late", 0)], members_only=True)
        assert svc.directory.lookup([b"late"]) == [None] and _table_has(svc, b"late") is None
        with pytest.raises(Refused):
            h["publish"]({**old, "keys": [b"late"], "locs": [_loc(b"late", 0)]})
    finally:
        svc.stop()


def test_freed_numbers_are_given_oldest_first_and_only_numbers_of_live_members_are_listed():
    svc = MetaService()
    d = svc.directory
    try:
        ids = [f"n{i}" for i in range(4)]
        nums = [d.number(n) for n in ids]
        assert nums == [0, 1, 2, 3]
        d.drop_node("n2")
        d.drop_node("n0")
        assert d.numbers(ids) == {1: "n1", 3: "n3"}
        assert [d.number("x"), d.number("y"), d.number("z")] == [2, 0, 4]
    finally:
        svc.stop()
