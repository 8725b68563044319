"""The directory table: locations a consumer reads one-sided from the discovery host's data
server (peercache/directory/table.py), checked line by line, with the lookup RPC for everything the
table cannot answer."""
import threading
import time

import numpy as np
import pytest

import peercache.node as node_module
from peercache import tags
from peercache.directory.store import Directory
from peercache.directory.table import LINE_BYTES, MAGIC, DirTable, TableView, bucket_line, line_check
from peercache.directory.service import MetaService
from peercache.node import Get, Node
from peercache.node.lookup_replies import SLOT_LIMIT
from peercache.rpc import RpcServer
from peercache.transport.base import ABSENT, LOC_DTYPE, native_module

from conftest import free_port
from oracles.tcp_client import PythonTcpTransport

PAGE = 4096


def loc(key: bytes, off: int, gen: int = 1, length: int = 10) -> list:
    return [1, 99, off, length, 64, gen, tags.key_hash(key)]


def read_all(table: DirTable, view: TableView, keys: list[bytes]):
    """What one read of the keys' buckets returns, copied straight from the table's memory."""
    kh = np.fromiter((tags.key_hash(k) for k in keys), np.uint64, len(keys))
    ub, inv, remote, length, local, nbytes = view.plan(kh)
    mem = np.frombuffer(table.mm, np.uint8)
    buf = np.zeros(nbytes, np.uint8)
    for r, ln, lo in zip(remote.tolist(), length.tolist(), local.tolist()):
        buf[lo:lo + ln] = mem[r:r + ln]
    return view.parse(buf, ub, inv, kh)


def one(table: DirTable, view: TableView, key: bytes):
    kh = tags.key_hash(key)
    b, remote = view.plan_one(kh)
    raw = bytes(table.mm[:LINE_BYTES]) + bytes(table.mm[remote:remote + view.bucket_bytes])
    return view.parse_one(raw, b, kh)


def view_of(table: DirTable) -> TableView:
    return TableView({**table.info(), "node_id": "host"})


def entry_line(table: DirTable, key: bytes) -> int:
    return table._line_of[key]


# -- the table on its own ------------------------------------------------------------------

def test_round_trip_overflow_and_definitive_misses():
    d = Directory(table_entries=7)                # one bucket of 7 ways
    t, v = d.table, view_of(d.table)
    keys = [b"k%d" % i for i in range(10)]
    d.publish("n1", keys, [loc(k, 64 * i, gen=i + 1) for i, k in enumerate(keys)])
    assert len(t) == 7 and t.spilled == 3
    epoch, recs, found, absent = read_all(t, v, keys + [b"never"])
    assert found[:7].all() and not found[7:].any()
    assert not absent.any()                       # overflowed: only the dict knows the rest
    assert recs[:7, 2].tolist() == [64 * i for i in range(7)]                  # offsets
    assert recs[:7, 5].tolist() == list(range(1, 8))                           # generations
    assert recs[:7, 6].tolist() == [tags.key_hash(k) for k in keys[:7]]
    assert (recs[:7, 0] & 0xFFFFFFFF).tolist() == [d.number("n1")] * 7       # member numbers
    # the one-key parser agrees with the batch parser
    for k, f in zip(keys + [b"never"], found.tolist()):
        e, rec, a = one(t, v, k)
        assert e == epoch and (rec is not None) == f and not a
    d.unpublish("n1", keys[7:])                   # no key of the bucket lives elsewhere now
    _, _, found, absent = read_all(t, v, keys + [b"never"])
    assert found[:7].all() and absent[7:].all()
    assert one(t, v, b"never") == (epoch, None, True)
    d.unpublish("n1", keys[:3])
    _, _, found, absent = read_all(t, v, keys[:4])
    assert found.tolist() == [False, False, False, True] and absent.tolist() == [True, True, True, False]
    d.close()


def test_republish_in_place_and_records_the_table_cannot_hold():
    d = Directory(table_entries=64)
    t, v = d.table, view_of(d.table)
    d.publish("n1", [b"a"], [loc(b"a", 0, gen=1)])
    line = entry_line(t, b"a")
    d.publish("n1", [b"a"], [loc(b"a", 128, gen=2)])
    assert entry_line(t, b"a") == line and len(t) == 1
    _, recs, found, _ = read_all(t, v, [b"a"])
    assert found[0] and recs[0, 2] == 128 and recs[0, 5] == 2
    # a key hash that is not the key's own: kept out of the table (only the dict answers it)
    d.publish("n1", [b"liar"], [loc(b"someone-else", 0)])
    # a field beyond a record's width: stored as a Location by the dict, kept out too
    d.publish("n1", [b"wide"], [[1 << 40, 99, 0, 10, 64, 1, tags.key_hash(b"wide")]])
    assert len(t) == 1 and t.spilled == 2
    _, _, found, absent = read_all(t, v, [b"liar", b"wide"])
    assert not found.any() and not absent.any()
    d.unpublish("n1", [b"liar", b"wide", b"a"])
    assert len(t) == 0 and t.spilled == 0
    _, _, found, absent = read_all(t, v, [b"liar", b"wide", b"a"])
    assert absent.all()
    d.close()


def test_garbage_and_torn_lines_are_never_trusted():
    d = Directory(table_entries=64)
    t, v = d.table, view_of(d.table)
    keys = [b"g%d" % i for i in range(20)]
    d.publish("n1", keys, [loc(k, 64 * i, gen=1) for i, k in enumerate(keys)])
    rng = np.random.default_rng(7)
    victim = keys[3]
    line = entry_line(t, victim)
    good = t.words[line].copy()
    # torn: the new record's first half with the old record's second half and old check
    d.publish("n1", [victim], [loc(victim, 4096, gen=9, length=33)])
    new = t.words[line].copy()
    t.words[line] = np.concatenate([new[:3], good[3:]])
    _, _, found, absent = read_all(t, v, [victim])
    assert not found[0] and not absent[0]
    assert one(t, v, victim)[1:] == (None, False)
    # the same torn the other way round, and a check word that belongs to the new record
    t.words[line] = np.concatenate([good[:3], new[3:]])
    assert not read_all(t, v, [victim])[2][0]
    # random garbage with the key's hash in place (so the parser looks at it) is not trusted
    junk = rng.integers(0, 2**63, 8, dtype=np.uint64)
    junk[6] = tags.key_hash(victim)
    t.words[line] = junk
    _, _, found, absent = read_all(t, v, [victim])
    assert not found[0] and not absent[0]
    # a garbage line in a bucket makes a missing key of that bucket doubtful, not absent
    kh_never = next(h for h in (tags.key_hash(b"x%d" % i) for i in range(10_000))
                    if h % t.buckets == tags.key_hash(victim) % t.buckets)
    view_buckets = np.array([kh_never], np.uint64)
    ub, inv, remote, length, local, nbytes = v.plan(view_buckets)
    mem = np.frombuffer(t.mm, np.uint8)
    buf = np.zeros(nbytes, np.uint8)
    for r, ln, lo in zip(remote.tolist(), length.tolist(), local.tolist()):
        buf[lo:lo + ln] = mem[r:r + ln]
    assert not v.parse(buf, ub, inv, view_buckets)[3][0]
    # a line copied to another place does not check there (the line number is in its check)
    other = entry_line(t, keys[5])
    assert line_check(t.words[other][:7].tobytes(), line, t.seal) != int(t.words[other][7])
    assert line_check(t.words[other][:7].tobytes(), other, t.seal) == int(t.words[other][7])
    # a header that does not check makes everything doubtful
    t.words[0, 1] ^= np.uint64(1)
    assert read_all(t, v, keys[:2])[0] is None and one(t, v, keys[0])[0] is None
    d.close()


def test_copies_racing_the_writer_never_yield_a_mixed_record():
    """A reader copying the table (memcpy, no order) while a writer rewrites entries: anything the
    parser trusts is a record the writer wrote, never a mix of two."""
    d = Directory(table_entries=14)
    t, v = d.table, view_of(d.table)
    keys = [b"r%d" % i for i in range(10)]
    stop = threading.Event()

    def writer():
        gen = 1
        while not stop.is_set() and gen < 2_000_000:
            d.publish("n1", keys, [loc(k, 64 * gen, gen=gen, length=gen % 64) for k in keys])
            gen += 1

    th = threading.Thread(target=writer)
    th.start()
    trusted = 0
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            _, recs, found, _ = read_all(t, v, keys)
            r = recs[found]
            assert (r[:, 2] == r[:, 5] * 64).all() and (r[:, 3] == r[:, 5] % 64).all()
            trusted += int(found.sum())
    finally:
        stop.set()
        th.join()
    assert trusted > 0
    d.close()


def test_dropped_node_leaves_the_table():
    d = Directory(table_entries=64)
    d.publish("n1", [b"a", b"b"], [loc(b"a", 0), loc(b"b", 64)])
    d.publish("n2", [b"c"], [loc(b"c", 0)])
    assert len(d.table) == 3
    d.drop_node("n1")
    _, _, found, absent = read_all(d.table, view_of(d.table), [b"a", b"b", b"c"])
    assert found.tolist() == [False, False, True] and absent.tolist() == [True, True, False]
    d.close()


# -- nodes: a consumer reading the table through the data transport --------------------------

def pages(keys):
    return [bytes([i % 251 + 1]) * PAGE for i in range(len(keys))]


def counted(node: Node) -> list:
    """Ops this node sends to discovery, in order."""
    calls = []
    orig = node.discovery.call

    def call(op, **kw):
        calls.append(op)
        return orig(op, **kw)
    node.discovery.call = call
    return calls


def protocols():
    out = ["tcp"]
    mod, why = native_module()
    out.append(pytest.param("shm", marks=pytest.mark.skipif(mod is None, reason=f"shm: {why}")))
    return out


@pytest.mark.parametrize("protocol", protocols())
def test_consumer_reads_every_key_through_the_table(port, protocol):
    addr = f"127.0.0.1:{port}"
    keys = [b"page-%d" % i for i in range(300)]
    with Node(addr, protocol=protocol, host_discovery=True, pool_slots=len(keys), slot_capacity=PAGE) as prod:
        prod.put_batch(keys, pages(keys))
        assert len(prod.meta.directory.table) == len(keys)
        with Node(addr, protocol=protocol, dir_cache_ttl=0.0) as cons:
            assert cons.table_reader.view is not None and cons.table_reader.view.node_id == prod.node_id
            calls = counted(cons)
            dest = np.zeros(len(keys) * PAGE, np.uint8)
            r = cons.get_batch_into(keys, dest, np.arange(len(keys)) * PAGE)
            assert r.hits == len(keys)
            assert (dest.reshape(len(keys), PAGE)[:, 0] == [i % 251 + 1 for i in range(len(keys))]).all()
            one_page = np.zeros(PAGE, np.uint8)
            for i in range(0, len(keys), 7):
                r = cons.get_batch_into([keys[i]], one_page, [0])
                assert r.status[0] == Get.HIT and one_page[0] == i % 251 + 1
            r = cons.get_batch_into([b"absent", keys[1]], dest, [0, PAGE])
            assert r.status.tolist() == [Get.MISS, Get.HIT]
            assert cons.get_batch_into([b"absent"], one_page, [0]).status[0] == Get.MISS
            n_single = len(range(0, len(keys), 7))
            assert cons.table_resolved == len(keys) + n_single + 3 and cons.table_forwarded == 0
            assert "lookup" not in calls and calls.count("members") <= 1
            # the Python lookup path (and exists) resolves through the table too
            assert cons.exists_batch([keys[0], b"absent", keys[2]]) == [True, False, True]
            assert [l.offset for l in cons.lookup(keys[:3])] == [prod.pool.ref(k).offset for k in keys[:3]]
            assert "lookup" not in calls and cons.stale_locations == 0
        # the hosting node resolves through its own table, read in place
        host_calls = counted(prod)
        assert [l.offset for l in prod.lookup(keys[:3])] == [prod.pool.ref(k).offset for k in keys[:3]]
        assert prod.table_resolved == 3 and "lookup" not in host_calls


def test_python_read_path_uses_the_table(port):
    addr = f"127.0.0.1:{port}"
    keys = [b"py-%d" % i for i in range(20)]
    with Node(addr, host_discovery=True, pool_slots=len(keys), slot_capacity=PAGE) as prod:
        prod.put_batch(keys, pages(keys))
        with Node(addr, dir_cache_ttl=0.0) as cons:
            cons.reader.native = None
            calls = counted(cons)
            dest = np.zeros(len(keys) * PAGE, np.uint8)
            assert cons.get_batch_into(keys, dest, np.arange(len(keys)) * PAGE).hits == len(keys)
            assert "lookup" not in calls and cons.table_resolved == len(keys)


def test_doubtful_entries_go_to_the_lookup_rpc(port):
    addr = f"127.0.0.1:{port}"
    keys = [b"t-%d" % i for i in range(40)]
    with Node(addr, host_discovery=True, pool_slots=len(keys), slot_capacity=PAGE) as prod:
        prod.put_batch(keys, pages(keys))
        table = prod.meta.directory.table
        victim = keys[11]
        line = table._line_of[victim]
        junk = np.random.default_rng(3).integers(0, 2**63, 8, dtype=np.uint64)
        junk[6] = tags.key_hash(victim)
        table.words[line] = junk                                  # garbage where the entry was
        with Node(addr, dir_cache_ttl=0.0) as cons:
            calls = counted(cons)
            one_page = np.zeros(PAGE, np.uint8)
            r = cons.get_batch_into([victim], one_page, [0])
            assert r.status[0] == Get.HIT and one_page[0] == 11 % 251 + 1
            assert cons.table_forwarded == 1 and cons.table_resolved == 0 and calls.count("lookup") == 1
            dest = np.zeros(len(keys) * PAGE, np.uint8)
            r = cons.get_batch_into(keys, dest, np.arange(len(keys)) * PAGE)
            assert r.hits == len(keys)
            assert cons.table_forwarded == 2 and cons.table_resolved == len(keys) - 1
            assert calls.count("lookup") == 2 and cons.stale_locations == 0


def test_a_stale_table_entry_is_caught_by_the_slot_tag_and_never_loops(port):
    addr = f"127.0.0.1:{port}"
    keys = [b"s-%d" % i for i in range(8)]
    with Node(addr, host_discovery=True, pool_slots=len(keys), slot_capacity=PAGE) as prod:
        prod.put_batch(keys, pages(keys))
        table = prod.meta.directory.table
        key = keys[2]
        line = table._line_of[key]
        old = table.words[line].copy()                            # a consistent entry of generation 1
        prod.put_batch([key], [b"\x77" * PAGE])                   # republished: generation 2
        assert prod.pool.ref(key).generation == 2
        table.words[line] = old                                   # the table still says generation 1
        with Node(addr, dir_cache_ttl=0.0) as cons:
            calls = counted(cons)
            one_page = np.zeros(PAGE, np.uint8)
            for rounds in (1, 2):
                r = cons.get_batch_into([key], one_page, [0])
                assert r.status[0] == Get.HIT and r.generations[0] == 2 and one_page[0] == 0x77
                assert cons.stale_locations == rounds                # one tag mismatch per GET ...
                assert calls.count("lookup") == rounds               # ... answered by one RPC, no loop
                assert cons.table_resolved == rounds
            dest = np.zeros(2 * PAGE, np.uint8)
            r = cons.get_batch_into([key, keys[3]], dest, [0, PAGE])
            assert r.hits == 2 and cons.stale_locations == 3 and calls.count("lookup") == 3


def test_a_left_or_dropped_producer_leaves_the_table(port):
    """A pool-less discovery host serves the table; producers' entries leave it with them."""
    addr = f"127.0.0.1:{port}"
    with Node(addr, host_discovery=True, heartbeat_interval=0.1, heartbeat_timeout=0.6) as host:
        assert host.pool is None and host.table_reader.view is not None and host.info["data"]
        table = host.meta.directory.table
        p1 = Node(addr, pool_slots=4, slot_capacity=PAGE, heartbeat_interval=0.1, heartbeat_timeout=0.6)
        p2 = Node(addr, pool_slots=4, slot_capacity=PAGE, heartbeat_interval=0.1, heartbeat_timeout=0.6)
        try:
            p1.put_batch([b"a", b"b"], [b"A" * PAGE, b"B" * PAGE])
            p2.put_batch([b"c"], [b"C" * PAGE])
            with Node(addr, dir_cache_ttl=0.0, heartbeat_interval=0.1, heartbeat_timeout=0.6) as cons:
                dest = np.zeros(3 * PAGE, np.uint8)
                assert cons.get_batch_into([b"a", b"b", b"c"], dest, [0, PAGE, 2 * PAGE]).hits == 3
                assert cons.table_resolved == 3 and len(table) == 3
                p1.close()                                        # leaves: its entries go at once
                assert len(table) == 1
                calls = counted(cons)
                r = cons.get_batch_into([b"a", b"c"], dest, [0, PAGE])
                assert r.status.tolist() == [Get.MISS, Get.HIT] and "lookup" not in calls
                p2.close(leave=False)                             # silent: dropped by the reaper
                deadline = time.monotonic() + 5
                while len(table) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert len(table) == 0
                assert cons.get_batch_into([b"c"], dest, [0]).status[0] == Get.MISS
                assert "lookup" not in calls and cons.table_forwarded == 0
        finally:
            p1.close()
            p2.close()


def test_a_member_that_joined_later_is_mapped_with_one_members_call(port):
    addr = f"127.0.0.1:{port}"
    with Node(addr, host_discovery=True, pool_slots=4, slot_capacity=PAGE) as prod:
        prod.put_batch([b"a"], [b"A" * PAGE])
        with Node(addr, dir_cache_ttl=0.0) as cons:
            dest = np.zeros(PAGE, np.uint8)
            assert cons.get_batch_into([b"a"], dest, [0]).hits == 1
            with Node(addr, pool_slots=4, slot_capacity=PAGE) as prod2:
                prod2.put_batch([b"z"], [b"Z" * PAGE])
                calls = counted(cons)
                r = cons.get_batch_into([b"z"], dest, [0])
                assert r.status[0] == Get.HIT and dest[0] == ord("Z")
                assert calls == ["members"] and cons.table_resolved == 2


def test_with_a_secret_the_table_is_read_through_the_token_checked_server(port):
    addr = f"127.0.0.1:{port}"
    secret = b"a table-reading secret, 128 bits+"   # b"s" * 32 is refused now: one byte value repeated
    with Node(addr, host_discovery=True, pool_slots=4, slot_capacity=PAGE, auth_key=secret) as prod:
        prod.put_batch([b"a"], [b"A" * PAGE])
        with Node(addr, dir_cache_ttl=0.0, auth_key=secret) as cons:
            calls = counted(cons)
            dest = np.zeros(PAGE, np.uint8)
            assert cons.get_batch_into([b"a"], dest, [0]).hits == 1
            assert cons.table_resolved == 1 and "lookup" not in calls
        # a data connection without the token gets nothing from the table's region either
        from peercache.transport import make_transport
        from peercache.transport.base import OP_DTYPE, Status
        tr = make_transport("tcp")
        try:
            view = TableView(prod.meta.table_info())
            ops = np.zeros(1, OP_DTYPE)
            ops["region"], ops["rkey"], ops["length"] = view.region, view.rkey, LINE_BYTES
            st = tr.read_batch("intruder", view.data, ops, [bytearray(LINE_BYTES)])
            assert st[0] != Status.OK
        finally:
            tr.close()


def test_the_table_off_still_works(port):
    addr = f"127.0.0.1:{port}"
    with Node(addr, host_discovery=True, pool_slots=4, slot_capacity=PAGE, dir_table_entries=0) as prod:
        assert prod.meta.directory.table is None and prod.meta.table_info() is None
        prod.put_batch([b"a"], [b"A" * PAGE])
        with Node(addr, dir_cache_ttl=0.0) as cons:
            assert cons.table_reader.view is None
            dest = np.zeros(PAGE, np.uint8)
            assert cons.get_batch_into([b"a"], dest, [0]).hits == 1
            assert cons.get_batch_into([b"nope"], dest, [0]).status[0] == Get.MISS
            assert cons.table_resolved == cons.table_forwarded == 0
    with pytest.raises(Exception, match="dir-table-entries must be >= 0"):
        Node(f"127.0.0.1:{free_port()}", host_discovery=True, dir_table_entries=-1)


def test_a_discovery_without_the_table_still_works(port):
    """A standalone meta process (no data server, so no table), as ``peercache-bench meta`` runs one,
    answers the original register reply: nodes use the lookup RPC."""
    addr = f"127.0.0.1:{port}"
    svc = MetaService()
    server = RpcServer(addr, svc.handlers(), limits=svc.limits).start()
    try:
        assert "table" not in svc.handlers()["members"]({})
        with Node(addr, pool_slots=4, slot_capacity=PAGE) as prod, Node(addr, dir_cache_ttl=0.0) as cons:
            prod.put_batch([b"a"], [b"A" * PAGE])
            assert cons.table_reader.view is None
            dest = np.zeros(PAGE, np.uint8)
            assert cons.get_batch_into([b"a"], dest, [0]).hits == 1
            assert cons.table_resolved == 0
    finally:
        server.stop()
        svc.stop()


def test_a_table_announced_for_another_directory_address_is_not_used(port):
    """A consumer that reaches the directory through another endpoint (a relay) does not read a
    table announced as the view of the directory at ``addr``."""
    addr = f"127.0.0.1:{port}"
    with Node(addr, host_discovery=True, pool_slots=4, slot_capacity=PAGE) as prod:
        prod.put_batch([b"a"], [b"A" * PAGE])
        relay = RpcServer(f"127.0.0.1:{free_port()}", prod.meta.handlers(), limits=prod.meta.limits).start()
        try:
            with Node(relay.address.replace("tcp://", ""), dir_cache_ttl=0.0) as cons:
                assert cons.table_reader.view is None
                dest = np.zeros(PAGE, np.uint8)
                assert cons.get_batch_into([b"a"], dest, [0]).hits == 1
        finally:
            relay.stop()


def test_table_header_geometry():
    t = DirTable(100, ways=5)
    try:
        assert t.buckets == 20 and t.size == LINE_BYTES * (1 + 20 * 6)
        assert int(t.words[0, 0]) == MAGIC and int(t.words[0, 2]) == 20 and int(t.words[0, 3]) == 5
        assert bucket_line(3, 5) == 19
        t.set_epoch(9)
        v = view_of(t)
        assert one(t, v, b"x")[0] == 9
    finally:
        t.close()
    with pytest.raises(Exception, match="at least one entry"):
        DirTable(0)


def test_dirbench_node_path_resolves_through_the_table():
    """dirbench --path node: lookups as a consumer node resolves keys (the table first)."""
    from peercache.bench import dirbench, options

    addr = f"127.0.0.1:{free_port()}"
    keys = options.page_keys(256, "mla")
    prod = dirbench.Producer(addr, keys[:100])
    try:
        cli = dirbench.NodeLookupClient(addr)
        try:
            assert cli.lookup(keys[:100]) == 0
            assert cli.lookup(keys[50:178]) == 78
            assert cli.node.table_resolved == 228 and cli.node.table_forwarded == 0
        finally:
            cli.close()
    finally:
        prod.close()
    doc = dirbench.run(dirbench.build_parser().parse_args(
        ["--directory", f"127.0.0.1:{free_port()}", "--keys", "1024", "--batch", "128", "--clients", "1",
         "--duration", "0.5", "--warmup", "0.2", "--path", "node"]))
    assert doc["status"] == "ok", doc["error"]
    assert doc["meta"]["path"] == "node" and doc["result"]["batches"] > 0 and doc["result"]["misses"] == 0


# -- the native read (native/dirtable.c) against the Python reference on the same tables ----------

NATIVE, NATIVE_WHY = native_module()
needs_native = pytest.mark.skipif(NATIVE is None, reason=f"peercache._native: {NATIVE_WHY}")


def native_read(table: DirTable, view: TableView, keys: list[bytes], nums=None, epoch=None):
    rows = np.empty(len(keys), LOC_DTYPE)
    state = np.full(len(keys), 99, np.int8)
    nums = np.zeros(0, np.uint32) if nums is None else np.asarray(nums, np.uint32)
    code, ep, resolved, first, err = NATIVE.table_lookup(table.mm, keys, view.native_spec, nums, SLOT_LIMIT,
                                                         epoch, rows, state)
    if code == NATIVE.TABLE_READ_FAILED:
        return code, first, err, rows, state
    assert first == 0 and err == ""
    return code, ep, resolved, rows, state


def assert_native_agrees(table: DirTable, view: TableView, keys: list[bytes]) -> tuple:
    """The native read (numbers not mapped yet: rows keep the member numbers) says what
    TableView.parse and parse_one say, key by key; returns (found, absent)."""
    epoch, recs, found, absent = read_all(table, view, keys)
    code, ep, resolved, rows, state = native_read(table, view, keys)
    if epoch is None:
        assert code == NATIVE.TABLE_BAD_HEADER and (state == NATIVE.TABLE_DOUBT).all()
        assert (rows["node"] == ABSENT).all()
        assert all(one(table, view, k)[0] is None for k in keys)
        return found, absent
    assert code == NATIVE.TABLE_REMAP and ep == epoch
    assert (state == NATIVE.TABLE_FOUND).tolist() == found.tolist()
    assert (state == NATIVE.TABLE_ABSENT).tolist() == absent.tolist()
    assert (state <= NATIVE.TABLE_ABSENT).all() and resolved == int((found | absent).sum())
    raw = rows.view(np.uint64).reshape(len(keys), 7)
    assert (raw[found] == recs[found]).all()
    assert (rows["node"][~found] == ABSENT).all() and (raw[~found][:, 1:] == 0).all()
    for k, f, a, r in zip(keys, found.tolist(), absent.tolist(), raw):
        e, rec, a1 = one(table, view, k)
        assert e == epoch and a1 == a and (rec is not None) == f
        if f:
            assert rec == r.tobytes()
    return found, absent


@needs_native
def test_native_key_hashes_are_the_tags_key_hash():
    keys = [b"", b"\x00", b"a", b"x" * 127, b"y" * 128, b"z" * 129, b"w" * 5000] + \
        [b"page-%d" % i for i in range(2000)]
    out = np.zeros(len(keys), np.uint64)
    NATIVE.key_hashes(keys, out)
    assert out.tolist() == [tags.key_hash(k) for k in keys]
    with pytest.raises(TypeError, match="key 1 is str"):
        NATIVE.key_hashes([b"a", "b"], np.zeros(2, np.uint64))


@needs_native
def test_native_read_agrees_with_the_python_parser():
    d = Directory(table_entries=70)                  # 10 buckets of 7 ways
    t, v = d.table, view_of(d.table)
    pub = [b"n%d" % i for i in range(90)]            # some buckets overflow, some do not
    d.publish("n1", pub[:60], [loc(k, 64 * i, gen=i + 1) for i, k in enumerate(pub[:60])])
    d.publish("n2", pub[60:], [loc(k, 64 * i, gen=2) for i, k in enumerate(pub[60:])])
    absent_keys = [b"absent-%d" % i for i in range(60)]
    keys = pub + absent_keys + pub[:5] + absent_keys[:5]   # repeats: one bucket read, same answers
    found, absent = assert_native_agrees(t, v, keys)
    assert found.sum() == len(t) + 5 and t.spilled > 0 and absent.any() and not absent[:90].any()
    overflowed = {int(b) for b in range(t.buckets) if t.words[bucket_line(b, t.ways), 0]}
    assert overflowed and len(overflowed) < t.buckets
    # remove keys until some buckets are clean again, then bad check words in some of them
    d.unpublish("n1", pub[::3])
    d.unpublish("n2", pub[60::2])
    found, absent = assert_native_agrees(t, v, keys)
    assert absent.any() and found.any()
    victim = next(k for k in pub if k in t._line_of)
    t.words[t._line_of[victim], 7] ^= np.uint64(1)                    # an entry's check word
    b_empty = next(b for b in range(t.buckets) if not t.words[bucket_line(b, t.ways), 0]
                   and any(not t.words[bucket_line(b, t.ways) + w].any() for w in range(1, t.ways + 1)))
    first = bucket_line(b_empty, t.ways)
    empty = next(first + w for w in range(1, t.ways + 1) if not t.words[first + w].any())
    t.words[empty, 3] = np.uint64(5)                                  # garbage in an empty line
    other = next(b for b in range(t.buckets) if b != b_empty and not t.words[bucket_line(b, t.ways), 0])
    t.words[bucket_line(other, t.ways), 2] = np.uint64(1)            # a bucket line's body
    found, absent = assert_native_agrees(t, v, keys)
    assert not found[keys.index(victim)]
    # a torn entry (new first half, old second half) is never trusted by either
    live = next(k for k in pub if k in t._line_of and k != victim)
    line = t._line_of[live]
    old = t.words[line].copy()
    d.publish("n1", [live], [loc(live, 4096, gen=77, length=33)])
    t.words[line] = np.concatenate([t.words[line][:3], old[3:]])
    found, absent = assert_native_agrees(t, v, keys)
    assert not found[keys.index(live)] and not absent[keys.index(live)]
    # a new epoch; then a header that does not check (every key doubtful)
    t.set_epoch(41)
    assert_native_agrees(t, v, keys)
    assert native_read(t, v, keys[:3])[1] == 41
    t.words[0, 1] ^= np.uint64(1)
    assert_native_agrees(t, v, keys)
    t.set_epoch(42)
    # a view of another geometry reads the header as not its own
    wrong = TableView({**t.info(), "buckets": t.buckets - 1, "node_id": "host"})
    assert native_read(t, wrong, keys[:4])[0] == NATIVE.TABLE_BAD_HEADER
    # one that names buckets beyond the memory: the read fails, as the data server refuses it
    wider = TableView({**t.info(), "buckets": t.buckets * 4, "node_id": "host"})
    code, first, err, rows, state = native_read(t, wider, keys)
    assert code == NATIVE.TABLE_READ_FAILED and first == 2 and "smaller than" in err   # OUT_OF_RANGE
    assert (state == NATIVE.TABLE_DOUBT).all() and (rows["node"] == ABSENT).all()
    assert native_read(t, v, [])[0] == NATIVE.TABLE_DONE
    with pytest.raises(ValueError, match="out of range"):
        TableView({**t.info(), "region": 1 << 40, "node_id": "host"})
    d.close()


@needs_native
def test_native_mapping_of_member_numbers():
    d = Directory(table_entries=700)
    t, v = d.table, view_of(d.table)
    keys = [b"m%d" % i for i in range(40)]
    d.publish("n1", keys[:20], [loc(k, 64 * i) for i, k in enumerate(keys[:20])])
    d.publish("n2", keys[20:], [loc(k, 64 * i) for i, k in enumerate(keys[20:])])
    big = b"too-long"                                    # a record that cannot be a slot
    t.put(big, np.array([d.number("n1"), 1, 0, 100, 64, 1, tags.key_hash(big)], "<u8").tobytes())
    far = b"far-slot"
    t.put(far, np.array([d.number("n1"), 1, SLOT_LIMIT - 10, 5, 64, 1, tags.key_hash(far)], "<u8").tobytes())
    ghost = b"ghost"                                     # a member number nobody maps
    t.put(ghost, np.array([7, 1, 0, 5, 64, 1, tags.key_hash(ghost)], "<u8").tobytes())
    allk = keys + [big, far, ghost, b"nobody"]
    n1, n2 = d.number("n1"), d.number("n2")
    nums = np.full(max(n1, n2) + 1, ABSENT, np.uint32)
    nums[n1], nums[n2] = 10, 20
    # numbers current for the header's epoch: done in one call; doubtful records are left out
    code, ep, resolved, rows, state = native_read(t, v, allk, nums[:max(n1, n2) + 1], epoch=0)
    assert code == NATIVE.TABLE_REMAP          # ghost's number is unknown: the caller maps again
    unknown, res = NATIVE.table_map(rows, state, nums, SLOT_LIMIT, False)
    assert unknown == 1 and res == len(allk)   # nothing changed
    unknown, res = NATIVE.table_map(rows, state, nums, SLOT_LIMIT, True)
    assert unknown == 1
    want_node = [10] * 20 + [20] * 20 + [ABSENT] * 4
    assert rows["node"].tolist() == want_node
    assert state.tolist() == [1] * 40 + [0, 0, 0, 2] and res == 41
    assert rows["offset"][:20].tolist() == [64 * i for i in range(20)]
    t.remove(ghost)
    code, ep, resolved, rows, state = native_read(t, v, allk, nums, epoch=0)
    assert code == NATIVE.TABLE_DONE and resolved == 42 and rows["node"].tolist() == want_node
    assert state.tolist() == [1] * 40 + [0, 0, 2, 2]        # ghost: gone, definitively absent now
    code, *_ = native_read(t, v, allk, nums, epoch=1)       # numbers of another epoch: mapped again
    assert code == NATIVE.TABLE_REMAP
    d.close()


def oracle_lookup(reader, table: DirTable, keys: list):
    """The table lookup of a node's TableReader in Python (NumPy), as the engine once had it: the
    oracle its native reads are compared with. ``(rows, resolved, resolved count)``, or None; the
    ranges are copied straight from the table's memory, the member numbers are the reader's
    (synced by it, one members call, when the epoch moved or a number is new)."""
    view, n = reader.view, len(keys)
    epoch, recs, found, absent = read_all(table, view, keys)
    if epoch is None:
        return None
    rows = np.ascontiguousarray(recs).view(LOC_DTYPE).reshape(n).copy()
    num = rows["node"]
    if epoch != reader.epoch:
        reader.sync(epoch)
    nums = reader.nums
    known = num < len(nums)
    if found.any() and not known[found].all() or (known & found).any() \
            and (nums[num[known & found]] == ABSENT).any():
        reader.sync(epoch)      # a member not mapped yet
        nums = reader.nums
        known = num < len(nums)
    idx = np.full(n, ABSENT, np.uint32)
    idx[known] = nums[num[known]]
    found &= idx != ABSENT
    cap, lim = rows["capacity"], np.uint64(SLOT_LIMIT)
    found &= ~((rows["length"] > cap) | (cap > lim) | (rows["offset"] > lim - np.minimum(cap, lim)))
    rows["node"] = np.where(found, idx, ABSENT)
    resolved = found | absent
    return rows, resolved, int(resolved.sum())


def oracle_one(reader, table: DirTable, key: bytes):
    """:func:`oracle_lookup` of one key with :meth:`TableView.parse_one`: its row, or None."""
    epoch, rec, absent = one(table, reader.view, key)
    if epoch is None or (rec is None and not absent):
        return None
    if epoch != reader.epoch:
        reader.sync(epoch)
    if rec is None:
        row = np.zeros(1, LOC_DTYPE)
        row["node"] = ABSENT
        return row
    num = int.from_bytes(rec[:4], "little")
    if num >= len(reader.nums) or reader.nums[num] == ABSENT:
        reader.sync(epoch)
        if num >= len(reader.nums) or reader.nums[num] == ABSENT:
            return None
    row = np.frombuffer(int(reader.nums[num]).to_bytes(4, "little") + rec[4:], LOC_DTYPE).copy()
    length, offset, cap = (int(row[0][f]) for f in ("length", "offset", "capacity"))
    if length > cap or cap > SLOT_LIMIT or offset > SLOT_LIMIT - cap:
        return None
    return row


def a_table_with_doubtful_entries(prod: Node, keys: list) -> tuple:
    """The producer's table with, besides ``keys``, a record that cannot be a slot, one of a member
    number nobody maps, and one key whose line fails its check; returns (table, every key asked)."""
    table = prod.meta.directory.table
    num = prod.meta.directory.number(prod.node_id)
    ref = prod.pool.ref(keys[0])
    big, ghost = b"too-long", b"ghost"
    table.put(big, np.array([num, 1, ref.offset, PAGE + 1, PAGE, 1, tags.key_hash(big)], "<u8").tobytes())
    table.put(ghost, np.array([num + 5, 1, ref.offset, 8, PAGE, 1, tags.key_hash(ghost)], "<u8").tobytes())
    victim = keys[17]
    table.words[table._line_of[victim], 7] ^= np.uint64(1)
    return table, keys + [big, ghost, victim] + [b"absent-%d" % i for i in range(50)]


def assert_same_rows(p, q):
    assert (p[1] == q[1]).all()
    assert (p[0]["node"] == q[0]["node"]).all()
    f = q[0]["node"] != ABSENT
    assert (p[0][f] == q[0][f]).all()


@needs_native
def test_a_consumer_node_resolves_natively_as_the_python_oracle_does(port):
    addr = f"127.0.0.1:{port}"
    keys = [b"nv-%d" % i for i in range(200)]
    with Node(addr, host_discovery=True, pool_slots=len(keys), slot_capacity=PAGE) as prod:
        prod.put_batch(keys, pages(keys))
        table, allk = a_table_with_doubtful_entries(prod, keys)
        with Node(addr, dir_cache_ttl=0.0) as cons:
            reader = cons.table_reader
            assert reader.reads_natively(reader.view)
            calls = counted(cons)
            got = {}
            for how in ("py", "native", "py", "native"):
                before = cons.table_resolved, cons.table_forwarded
                if how == "py":
                    rows, resolved, r = oracle_lookup(reader, table, allk)
                    got[how] = (rows, resolved, r, len(allk) - r)
                else:
                    rows, resolved = reader.lookup(allk)
                    got[how] = (rows.copy(), resolved.copy(), cons.table_resolved - before[0],
                                cons.table_forwarded - before[1])
                if how == "native" and "py" in got:
                    p, q = got["py"], got["native"]
                    assert_same_rows(p, q)
                    assert p[2:] == q[2:]
            rows, resolved, r, fwd = got["native"]
            assert fwd == 4 and r == len(allk) - 4     # big, ghost, the victim (twice): for the RPC
            assert not resolved[[17, len(keys), len(keys) + 1, len(keys) + 2]].any()
            assert (rows["offset"][:len(keys)] == [prod.pool.ref(k).offset for k in keys])[
                np.arange(len(keys)) != 17].all()
            assert "lookup" not in calls and calls.count("members") >= 2   # ghost: mapped again each time
            # keys that are bytes-like but not bytes are read by their bytes, with the same answers
            rows_b, resolved_b = reader.lookup([bytearray(k) for k in allk])
            assert (resolved_b == resolved).all() and (rows_b["node"] == rows["node"]).all()
            assert (reader.one(bytearray(keys[3])) == reader.one(keys[3])).all()
            # one key at a time, the latency path
            for k in allk[::7] + [allk[len(keys)], allk[len(keys) + 1], keys[17], b"absent-0"]:
                p, q = oracle_one(reader, table, k), reader.one(k)
                assert (p is None) == (q is None)
                if q is not None:
                    assert (p == q).all()
            # a new epoch: the numbers are mapped again with one members call, answers unchanged
            table.set_epoch(table.epoch + 3)
            calls.clear()
            rows2, resolved2 = reader.lookup(keys)
            assert calls == ["members"] and reader.epoch == table.epoch
            assert (rows2["node"][resolved2] != ABSENT).sum() == len(keys) - 1
            # and through a read, uncached, the RPC answering what the table could not
            dest = np.zeros(len(allk) * PAGE, np.uint8)
            r = cons.get_batch_into(allk, dest, np.arange(len(allk)) * PAGE)
            assert r.hits == len(keys) + 1 and calls.count("lookup") == 1   # the victim twice
        # the hosting node reads its own table in place, natively too
        host_calls = counted(prod)
        rows, resolved = prod.table_reader.lookup(keys)
        assert resolved.sum() == len(keys) - 1 and "lookup" not in host_calls


@needs_native
@pytest.mark.parametrize("how", ["python tcp", "registered memory"])
def test_the_table_read_through_the_transport_answers_as_the_native_one(port, how, monkeypatch):
    """Where the table node's handle cannot land the read in scratch of its own (a transport
    without native handles; one whose reads need registered memory, as rdma's: here tcp declaring
    it), the table is read through the transport's read_batch, parsed by TableView and mapped
    natively: the same rows, counts and calls as the native read and the oracle."""
    addr = f"127.0.0.1:{port}"
    keys = [b"tr-%d" % i for i in range(200)]
    made_by_the_node = node_module.make_transport

    def make_transport(protocol, python_client=False, **options):
        """The node's own, or with ``python_client`` the Python client of tests/oracles."""
        return PythonTcpTransport(**options) if python_client else made_by_the_node(protocol, **options)

    monkeypatch.setattr(node_module, "make_transport", make_transport)
    options = {"python_client": True} if how == "python tcp" else {}
    with Node(addr, host_discovery=True, pool_slots=len(keys), slot_capacity=PAGE) as prod:
        prod.put_batch(keys, pages(keys))
        table, allk = a_table_with_doubtful_entries(prod, keys)
        with Node(addr, dir_cache_ttl=0.0) as native, \
                Node(addr, dir_cache_ttl=0.0, transport_options=options) as cons:
            if how == "registered memory":
                cons.transport.needs_registered_memory = True
            reader = cons.table_reader
            assert not reader.reads_natively(reader.view) and reader.native is not None
            calls = counted(cons)
            for _ in range(2):
                before = cons.table_resolved, cons.table_forwarded
                rows, resolved = reader.lookup(allk)
                q = (rows.copy(), resolved.copy(), cons.table_resolved - before[0],
                     cons.table_forwarded - before[1])
                n_rows, n_resolved = native.table_reader.lookup(allk)
                o_rows, o_resolved, r = oracle_lookup(native.table_reader, table, allk)
                assert_same_rows((n_rows, n_resolved), q)
                assert_same_rows((o_rows, o_resolved), q)
                assert q[2:] == (r, len(allk) - r) == (len(allk) - 4, 4)
            assert "lookup" not in calls and calls.count("members") >= 2   # ghost: mapped again each time
            if how == "registered memory":
                assert len(reader._scratch.buf) >= 1 << 16       # one scratch buffer, kept
            for k in allk[::7] + [allk[len(keys)], allk[len(keys) + 1], keys[17], b"absent-0"]:
                p, q = native.table_reader.one(k), reader.one(k)
                assert (p is None) == (q is None), k
                if q is not None:
                    assert (p == q).all()
            assert (reader.one(bytearray(keys[3])) == reader.one(keys[3])).all()
            dest = np.zeros(len(allk) * PAGE, np.uint8)
            calls.clear()
            r = cons.get_batch_into(allk, dest, np.arange(len(allk)) * PAGE)
            assert r.hits == len(keys) + 1 and calls.count("lookup") == 1
