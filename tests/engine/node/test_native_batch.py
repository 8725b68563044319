"""The native batch path: op placement, refused ops, mixed outcomes, threads."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import peercache.node as node_module
from peercache import tags
from peercache.node import Get, Node
from peercache.pool import Pool
from peercache.transport import make_transport
from peercache.transport.base import LOC_DTYPE, Status, make_ops, native_module
from peercache.transport.shm import ShmTransport
from peercache.transport.tcp import TcpTransport

from conftest import free_port
from oracles.tcp_client import PythonTcpTransport

mod, why = native_module()
pytestmark = pytest.mark.skipif(mod is None, reason=str(why))

RKEY = 0x5EED


@pytest.fixture
def region_pool():
    """A memfd pool whose bytes are i % 251, so every offset's content is known."""
    pool = Pool(4, 4000)
    pool.bytes[:] = (np.arange(pool.size) % 251).astype(np.uint8)
    yield pool
    pool.close()


@pytest.fixture(params=["shm", "tcp"])
def peer(request, region_pool):
    """A native Peer onto region 7 of ``region_pool`` through each backend."""
    prod = ShmTransport() if request.param == "shm" else TcpTransport()
    prod.expose(7, region_pool.mm, RKEY, fd=region_pool.fd, size=region_pool.size)
    info = prod.start("127.0.0.1")
    cons = ShmTransport() if request.param == "shm" else TcpTransport(max_channels=2)
    yield cons.native_peer("producer", info), region_pool
    cons.close()
    prod.close()


def _op(ops, i, off, ln, loff, region=7, rkey=RKEY, lr=0):
    ops[i] = (region, lr, rkey, off, ln, loff)


def test_every_op_lands_at_its_offset(peer):
    p, pool = peer
    rng = np.random.default_rng(5)
    n = 200
    ops = make_ops(n)
    locals_ = [np.zeros(70000, np.uint8), np.zeros(50000, np.uint8)]
    cursor = [0, 0]
    for i in range(n):
        lr = i % 2
        ln = int(rng.integers(1, 300))
        off = int(rng.integers(0, pool.size - ln))
        _op(ops, i, off, ln, cursor[lr], lr=lr)
        cursor[lr] += ln + int(rng.integers(0, 3))
    status = np.full(n, -1, np.int32)
    assert p.read_batch(ops, locals_, status) is None
    assert (status == Status.OK).all()
    expected = [np.zeros_like(b) for b in locals_]
    for o in ops:
        lr, lo, ln, ro = int(o["local_region"]), int(o["local_offset"]), int(o["length"]), int(o["remote_offset"])
        expected[lr][lo:lo + ln] = pool.bytes[ro:ro + ln]
    for got, want in zip(locals_, expected):
        assert np.array_equal(got, want)


def test_bad_ops_get_a_clear_status_and_good_ones_still_land(peer):
    p, pool = peer
    ops = make_ops(8)
    _op(ops, 0, 10, 20, 0)                               # good
    _op(ops, 1, 0, 0, 100)                               # zero length
    _op(ops, 2, pool.size - 5, 10, 200)                  # short: runs past the region's end
    _op(ops, 3, pool.size + 4096, 8, 300)                # entirely out of range
    _op(ops, 4, 0, 16, 400, rkey=RKEY + 1)               # wrong key
    _op(ops, 5, 0, 16, 500, region=99)                   # unknown region
    _op(ops, 6, 0, 16, 1020)                             # destination overruns the local buffer
    _op(ops, 7, 2**64 - 8, 16, 600)                      # offset + length wraps around
    local = np.zeros(1024, np.uint8)
    status = np.full(8, -1, np.int32)
    p.read_batch(ops, [local], status)
    assert status.tolist() == [Status.OK, Status.ZERO_LENGTH, Status.OUT_OF_RANGE, Status.OUT_OF_RANGE,
                               Status.BAD_REGION, Status.BAD_REGION, Status.LOCAL_RANGE,
                               Status.OUT_OF_RANGE]
    assert np.array_equal(local[:20], pool.bytes[10:30])
    assert not local[100:1024].any()  # refused ops wrote nothing


def test_bad_local_region_index_is_refused(peer):
    p, _ = peer
    ops = make_ops(1)
    _op(ops, 0, 0, 8, 0, lr=3)
    status = np.zeros(1, np.int32)
    p.read_batch(ops, [np.zeros(16, np.uint8)], status)
    assert status[0] == Status.LOCAL_RANGE


def test_wrong_array_sizes_are_refused_not_overrun(peer):
    p, _ = peer
    with pytest.raises(ValueError, match="status"):
        p.read_batch(make_ops(4), [np.zeros(16, np.uint8)], np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="ops"):
        p.read_batch(np.zeros(7, np.uint8), [np.zeros(16, np.uint8)], np.zeros(0, np.int32))


def test_native_tcp_matches_the_python_reference(region_pool):
    prod = TcpTransport()
    prod.expose(7, region_pool.mm, RKEY)
    info = prod.start("127.0.0.1")
    ref, fast = PythonTcpTransport(), TcpTransport()
    rng = np.random.default_rng(9)
    ops = make_ops(64)
    for i in range(64):
        ln = int(rng.integers(0, 500))
        _op(ops, i, int(rng.integers(0, region_pool.size + 100)), ln, i * 512)
    try:
        a, b = np.zeros(64 * 512, np.uint8), np.zeros(64 * 512, np.uint8)
        sa = ref.read_batch("p", info, ops, [a])
        sb = fast.read_batch("p", info, ops, [b])
        assert sa.tolist() == sb.tolist()
        assert (sa == Status.OK).sum() > 40 and (sa != Status.OK).any()
        assert np.array_equal(a, b)
    finally:
        ref.close(), fast.close(), prod.close()


def test_native_tag_check_matches_python():
    rng = np.random.default_rng(3)
    n = 400
    locs = np.zeros(n, LOC_DTYPE)
    want = rng.integers(1, 2**63, n, dtype=np.uint64)             # the hash of each key asked for
    locs["key_hash"] = np.where(rng.random(n) < 0.5, want, 5)      # the entry's own word: never checked
    locs["generation"] = rng.integers(1, 5, n, dtype=np.uint64)
    locs["length"] = rng.integers(0, 100, n, dtype=np.uint64)
    t = np.zeros((n, tags.TAG_WORDS), np.uint64)
    seq = rng.integers(0, 6, n, dtype=np.uint64)
    t[:, 0] = seq
    t[:, tags.TRAILER_SEQ] = np.where(rng.random(n) < 0.8, seq, seq + 2)
    t[:, tags.CHECKSUM] = rng.integers(0, 2**63, n, dtype=np.uint64)   # not part of the tag check
    t[:, 1] = np.where(rng.random(n) < 0.8, want, 7)
    t[:, 2] = np.where(rng.random(n) < 0.8, locs["generation"], 9)
    t[:, 3] = np.where(rng.random(n) < 0.8, locs["length"], 1000)
    out = np.zeros(n, np.int32)
    good = mod.check_tags(t, locs, want, out)
    ref = tags.tag_check(t, want, locs["generation"], locs["length"])
    assert np.array_equal(out, ref)
    assert good == (ref == tags.TAG_OK).sum() and 0 < good < n
    assert {tags.TAG_OK, tags.TAG_MISMATCH, tags.KEY_MISMATCH} == set(out.tolist())
    assert (mod.TAG_MISMATCH, mod.KEY_MISMATCH) == (tags.TAG_MISMATCH, tags.KEY_MISMATCH)


# -- through Node ------------------------------------------------------------------------

@pytest.fixture(params=["shm", "tcp"])
def cluster(request):
    addr = f"127.0.0.1:{free_port()}"
    prod = Node(addr, protocol=request.param, host_discovery=True, pool_slots=64, slot_capacity=2048,
                name="prod")
    cons = Node(addr, protocol=request.param, dir_cache_ttl=60.0, max_channels=4, name="cons")
    assert cons.reader.native is not None, "the consumer should use the native batch path"
    yield prod, cons
    cons.close()
    prod.close()


def _fill(view, ref):
    tags.fill_pattern(view, ref.key_hash, ref.generation)


def test_mixed_hits_misses_and_errors_in_one_batch(cluster):
    prod, cons = cluster
    keys = [f"obj/{i}".encode() for i in range(10)]
    prod.put_batch(keys, fill=_fill)
    cons.get_batch_into(keys, np.zeros(10 * 2048, np.uint8), np.arange(10, dtype=np.uint64) * 2048)
    prod.remove_batch([keys[3]])            # stale in the consumer's cache: a miss
    prod.put_batch([keys[5]], [b"fresh"])   # rewritten: one fresh lookup, then a hit
    batch = keys + [b"never-published"]
    dest = np.zeros(len(batch) * 2048, np.uint8)
    caps = np.full(len(batch), 2048, np.uint64)
    caps[7] = 100                           # too small for the 2048-byte object: an error
    r = cons.get_batch_into(batch, dest, np.arange(len(batch), dtype=np.uint64) * 2048, caps)
    want = [Get.HIT] * 10 + [Get.MISS]
    want[3], want[7] = Get.MISS, Get.ERROR
    assert r.status.tolist() == want
    assert bytes(dest[5 * 2048:5 * 2048 + 5]) == b"fresh" and r.lengths[5] == 5
    for i in (0, 1, 2, 4, 6, 8, 9):
        ref = prod.pool.ref(keys[i])
        assert r.generations[i] == ref.generation and r.lengths[i] == 2048
        assert tags.verify_patterns(dest[i * 2048:(i + 1) * 2048].reshape(1, -1),
                                    np.array([ref.key_hash], np.uint64), r.generations[i:i + 1])[0]


def test_concurrent_batches_do_not_corrupt_each_other(cluster):
    prod, cons = cluster
    keys = [f"obj/{i}".encode() for i in range(64)]
    prod.put_batch(keys, fill=_fill)
    khash = np.array([tags.key_hash(k) for k in keys], np.uint64)
    threads, batch, page = 4, 16, 2048
    dest = np.zeros(threads * batch * page, np.uint8)
    failures: list[str] = []
    done = [0] * threads

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        base = t * batch * page
        offs = base + np.arange(batch, dtype=np.uint64) * page
        deadline = time.monotonic() + 3.0
        for _ in range(150):  # bounded in count and time
            if time.monotonic() > deadline:
                break
            idx = rng.choice(64, batch, replace=False)
            r = cons.get_batch_into([keys[i] for i in idx], dest, offs)
            if (r.status != Get.HIT).any():
                failures.append(f"thread {t}: {r.status.tolist()} {r.error}")
                return
            ok = tags.verify_patterns(dest[base:base + batch * page].reshape(batch, page), khash[idx],
                                      r.generations)
            if not ok.all():
                failures.append(f"thread {t}: {int((~ok).sum())} pages with another batch's bytes")
                return
            done[t] += 1

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in ts)
    assert not failures, failures
    assert min(done) > 0


def test_python_tcp_path_still_works_as_reference(monkeypatch):
    """A node whose transport has no native batch path (the Python client of tests/oracles) reads
    through the transport's read_batch."""
    monkeypatch.setattr(node_module, "make_transport", lambda protocol, **options: PythonTcpTransport(**options))
    addr = f"127.0.0.1:{free_port()}"
    prod = Node(addr, protocol="tcp", host_discovery=True, pool_slots=8, slot_capacity=256, name="p")
    cons = Node(addr, protocol="tcp", name="c")
    try:
        assert cons.reader.native is None and type(cons.transport) is PythonTcpTransport
        prod.put_batch([b"a", b"b"], [b"alpha", b"bravo"])
        dest = np.zeros(512, np.uint8)
        r = cons.get_batch_into([b"a", b"x", b"b"], dest, [0, 256, 300])
        assert r.status.tolist() == [Get.HIT, Get.MISS, Get.HIT]
        assert bytes(dest[:5]) == b"alpha" and bytes(dest[300:305]) == b"bravo"
    finally:
        cons.close()
        prod.close()


def test_make_transport_picks_native_tcp_when_built():
    t = make_transport("tcp")
    try:
        assert type(t) is TcpTransport and t.native
    finally:
        t.close()


def test_without_the_extension_tcp_shm_and_the_node_say_how_to_build(monkeypatch):
    import types

    import peercache.transport.base as base
    from peercache.directory.cache import DirectoryCache
    from peercache.errors import ConfigError, TransportUnavailable

    def missing(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(base, "_native_cache", [])
    monkeypatch.setattr(base, "importlib", types.SimpleNamespace(import_module=missing))
    # tcp needs the module as shm does: its data server is the native loop (no Python fallback)
    for make in (lambda: make_transport("tcp"), TcpTransport, PythonTcpTransport, lambda: make_transport("shm")):
        with pytest.raises(TransportUnavailable, match=r"peercache\._native is unavailable .*run `make setup`"):
            make()
    with pytest.raises(ConfigError, match=r"directory cache needs the native module: .*run `make setup`"):
        DirectoryCache(5.0)
    with pytest.raises(ConfigError, match="make setup"):
        Node(f"127.0.0.1:{free_port()}", protocol="tcp")
