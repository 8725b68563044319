"""A directory entry redirected at another key's slot is a miss with a reason, never a hit.

Whoever can write the directory (the Redis password, a cluster member) can copy the entry of
``pc/1`` under the name ``pc/0``. The slot then holds consistent bytes whose tag matches the
entry, so a reader that checks the tag against the entry's own key hash serves ``pc/1``'s bytes
as ``pc/0``. The consumer checks each tag against the hash of the key it asked for, computed by
itself: such a read is a miss, counted in ``Node.redirected_entries`` and named in
``BatchResult.miss_reason``. Covered: both directory backends (the embedded one and Redis),
tcp and shm, the native and the pure-Python readers, the library, HiCache and drive; over rdma (the
native reader) in the Soft-RoCE guest (``make test-rdma``).
"""
from __future__ import annotations

import contextlib
import json
import subprocess

import numpy as np
import pytest

import peercache
from conftest import BENCH, free_port, rdma_sides, scaled
from hicache_fixtures import NumpyHostPool, indices, make_store, page_bytes
from peercache import tags
from peercache.bench import options
from peercache.bench.serve import READY_LINE, fill_page
from peercache.node import Get, Node
from peercache.transport.base import native_module

mod, _why = native_module()
PAGE = 4096
REASON = "points at another key's slot"


@pytest.fixture(params=["tcp", "shm"])
def protocol(request):
    if request.param == "shm" and mod is None:
        pytest.fail(f"shm needs the native module: {_why}")
    return request.param


@pytest.fixture(params=["native", "python"])
def path(request):
    if request.param == "native" and mod is None:
        pytest.fail(f"the native read path is not built: {_why}")
    return request.param


@pytest.fixture(params=["embedded", "redis"])
def backend(request):
    """``(spec, hosts, redirect)``: the directory (a node's ``discovery_addr``: HOST:PORT of the
    embedded one, or a redis:// URL), whether the producer hosts it, and ``redirect(host, key,
    other)``, which makes ``key``'s entry a byte-for-byte copy of ``other``'s (``host``: the node
    hosting the embedded directory; unused with Redis)."""
    if request.param == "embedded":
        addr = f"127.0.0.1:{free_port()}"

        def redirect(host, key: bytes, other: bytes) -> None:
            redirect_embedded(host, key, other)
        yield addr, True, redirect
    else:
        server = request.getfixturevalue("redis_server")

        def redirect(host, key: bytes, other: bytes) -> None:
            redirect_redis(server.url, key, other)
        yield server.url, False, redirect


def redirect_embedded(host: Node, key: bytes, other: bytes, **fields) -> None:
    """Publish ``other``'s location under ``key`` in the directory ``host`` serves (as its owner may),
    with ``fields`` (Location field name -> value) changed."""
    d = host.meta.directory
    loc = d.lookup([other])[0]._replace(**fields)
    d.publish(loc.node_id, [key], [loc])


def redirect_redis(url: str, key: bytes, other: bytes, prefix: str = "pc") -> None:
    """``SET P:e:<key> <the value of P:e:<other>>``: what anyone with the Redis password can do."""
    import redis
    r = redis.Redis.from_url(url)
    try:
        value = r.get(f"{prefix}:e:".encode() + other)
        assert value is not None, f"no entry for {other!r} in Redis"
        assert r.set(f"{prefix}:e:".encode() + key, value)
    finally:
        r.close()


@contextlib.contextmanager
def pair(backend, protocol, path, integrity=False, ttl=0.0):
    """A producer (hosting the embedded directory, if that is the backend) and a consumer."""
    spec, hosts, redirect = backend
    with peercache.Client(spec, protocol=protocol, host_discovery=hosts, pool_bytes=16 * 4200,
                          page_size=PAGE, integrity=integrity) as prod, \
            peercache.Client(spec, protocol=protocol, page_size=PAGE, integrity=integrity,
                             dir_cache_ttl=ttl) as cons:
        if path == "python":
            cons.node.reader.native = None
        yield prod, cons, lambda key, other: redirect(prod.node, key, other)


VALUES = {b"pc/0": b"0" * 1000, b"pc/1": b"1" * 1500, b"pc/2": b"2" * 700}


@pytest.mark.parametrize("integrity", [False, True], ids=["plain", "integrity"])
def test_a_redirected_entry_is_a_miss_with_its_reason_never_the_other_keys_bytes(backend, protocol, path,
                                                                                  integrity):
    with pair(backend, protocol, path, integrity) as (prod, cons, redirect):
        prod.put_batch(list(VALUES), list(VALUES.values()))
        assert cons.get_batch(list(VALUES)) == list(VALUES.values())
        redirect(b"pc/0", b"pc/1")
        assert cons.get("pc/0") is None                       # the old reader returned b"1" * 1500
        assert cons.get_batch(list(VALUES)) == [None, VALUES[b"pc/1"], VALUES[b"pc/2"]]
        dest = np.zeros(3 * PAGE, np.uint8)
        before = cons.node.redirected_entries
        r = cons.node.get_batch_into(list(VALUES), dest, np.arange(3, dtype=np.uint64) * PAGE, [PAGE] * 3)
        assert r.status.tolist() == [Get.MISS, Get.HIT, Get.HIT] and r.error is None
        assert r.redirected.tolist() == [0] and cons.node.redirected_entries == before + 1
        assert r.miss_reason == (f"the directory's entry for {b'pc/0'!r} points at another key's slot "
                                 f"(node {prod.node.node_id}, offset {prod.node.pool.ref(b'pc/1').offset}); "
                                 "read as a miss")
        assert cons.node.integrity_failures == 0              # the tag refused it, not the checksum
        assert cons.node.redirected_entries == 3              # counted once per read, after its retry


def test_an_entry_that_claims_the_key_but_holds_another_keys_slot_is_named_too(path, protocol):
    """The embedded directory: ``pc/0``'s entry carries ``pc/0``'s own key hash (so the directory
    table takes it) but the slot, generation and length of ``pc/1``. The slot is the one the entry
    describes, and it holds another key."""
    addr = f"127.0.0.1:{free_port()}"
    with pair((addr, True, None), protocol, path) as (prod, cons, _):
        prod.put_batch(list(VALUES), list(VALUES.values()))
        redirect_embedded(prod.node, b"pc/0", b"pc/1", key_hash=tags.key_hash(b"pc/0"))
        dest = np.zeros(2 * PAGE, np.uint8)
        r = cons.node.get_batch_into([b"pc/1", b"pc/0"], dest, [0, PAGE], [PAGE] * 2)
        assert r.status.tolist() == [Get.HIT, Get.MISS] and r.redirected.tolist() == [1]
        assert REASON in r.miss_reason and "b'pc/0'" in r.miss_reason
        assert cons.node.redirected_entries == 1


def test_a_stale_slot_is_a_miss_without_the_redirect_reason(path, protocol):
    """A slot evicted and reused by another key while its location was cached is a plain stale miss
    after the retry finds the key gone: not a redirected entry."""
    addr = f"127.0.0.1:{free_port()}"
    with pair((addr, True, None), protocol, path, ttl=30.0) as (prod, cons, _):
        prod.put_batch(list(VALUES), list(VALUES.values()))
        assert cons.get_batch(list(VALUES)) == list(VALUES.values())       # locations cached
        prod.remove("pc/0")
        prod.put_batch([f"new{i}" for i in range(16)], [b"n" * 900] * 16)  # reuses every slot
        dest = np.zeros(PAGE, np.uint8)
        r = cons.node.get_batch_into([b"pc/0"], dest, [0], [PAGE])
        assert r.status.tolist() == [Get.MISS] and r.redirected.tolist() == [] and r.miss_reason is None
        assert cons.node.redirected_entries == 0 and cons.node.stale_locations == 1


# ---------------------------------------------------------------- HiCache (PeerCacheStore v1)
OBJ = 16384


def test_hicache_v1_reads_a_redirected_page_as_a_miss(backend, protocol):
    spec, hosts, redirect = backend
    host = Node(spec, protocol=protocol, host_discovery=True, name="discovery") if hosts else None
    conf = {"protocol": protocol, "dir_cache_ttl": 0.0, "discovery_addr" if hosts else "directory": spec}
    writer = reader = None
    try:
        writer = make_store(False, {**conf, "pool_bytes": 16 * tags.slot_stride(OBJ)}, is_mla_model=True)
        wpool = NumpyHostPool(4, OBJ, True)
        writer.register_mem_pool_host(wpool)
        keys = ["a000deadbeef", "b000deadbeef"]
        for p, k in enumerate(keys):
            wpool.page_view(p)[0][:] = page_bytes(k, 0, OBJ)
        assert writer.batch_set_v1(keys, indices([0, 1])) == [True, True]
        reader = make_store(False, {**conf, "pool_bytes": 0}, is_mla_model=True)
        rpool = NumpyHostPool(4, OBJ, True)
        reader.register_mem_pool_host(rpool)
        assert reader.batch_get_v1(keys, indices([2, 3])) == [True, True]
        (k0,), (k1,) = (writer.object_keys([k], 1) for k in keys)
        redirect(host, k0, k1)
        assert reader.batch_get_v1(keys, indices([2, 3])) == [False, True]   # the old store: [True, True]
        assert np.array_equal(rpool.page_view(3)[0], page_bytes(keys[1], 0, OBJ))
        s = reader.get_stats()
        assert s["redirected_entries"] == 1 and s["misses"] == 1 and s["hits"] == 3
    finally:
        for s in (reader, writer):
            if s is not None:
                s.close()
        if host is not None:
            host.close()


# ---------------------------------------------------------------- drive (serve's pages, redirected)
def _drive(where: list[str], protocol: str, out, *extra) -> subprocess.CompletedProcess:
    argv = [*BENCH, "drive", *where, "--protocol", protocol, "--working-set", "8", "--batch-size", "4",
            "--page-size", str(PAGE), "--duration", "1", "--warmup", "0.3", "--out", str(out),
            "--ready-timeout", "10", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=scaled(60))


def _assert_failed_with_the_reason(r: subprocess.CompletedProcess, out) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])       # the old drive: rc 0, hit rate 100 %
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(out.read_text())
    p = doc["points"][0]
    assert doc["status"] == "failed" and p["status"] == "failed"
    assert p["redirected"] > 0 and p["hit_rate"] < 1 and p["errors"] == 0
    assert f"the directory's entry for {b'pc/0'!r} {REASON}" in p["reason"], p["reason"]
    assert REASON in r.stderr


@pytest.mark.parametrize("integrity", [[], ["--integrity"]], ids=["plain", "integrity"])
def test_drive_against_a_redirected_redis_entry_fails_naming_it(redis_server, procs, protocol, integrity,
                                                                tmp_path):
    where = ["--directory", redis_server.url]
    serve = procs.start([*BENCH, "serve", *where, "--protocol", protocol, "--working-set", "8",
                         "--page-size", str(PAGE), "--readers", "1", *integrity])
    procs.wait_line(serve, READY_LINE)
    redirect_redis(redis_server.url, b"pc/0", b"pc/1")
    out = tmp_path / "d.json"
    _assert_failed_with_the_reason(_drive(where, protocol, out, *integrity), out)
    assert serve.wait(timeout=scaled(15)) == 0


@pytest.mark.parametrize("integrity", [False, True], ids=["plain", "integrity"])
def test_drive_against_a_redirected_embedded_entry_fails_naming_it(protocol, integrity, tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    keys = options.page_keys(8, "mla")
    with Node(addr, protocol=protocol, host_discovery=True, pool_slots=len(keys), slot_capacity=PAGE,
              integrity=integrity, name="serve") as host:
        host.add_handler("reader_done", lambda msg: {"readers_done": 1})
        host.put_batch(keys, fill=fill_page)
        redirect_embedded(host, b"pc/0", b"pc/1")
        out = tmp_path / "d.json"
        r = _drive(["--discovery-addr", addr], protocol, out, *(["--integrity"] if integrity else []))
    _assert_failed_with_the_reason(r, out)


# ---------------------------------------------------------------- rdma (the Soft-RoCE guest)
@pytest.mark.rdma
@pytest.mark.parametrize("integrity", [False, True], ids=["plain", "integrity"])
def test_a_redirected_entry_is_a_miss_over_rdma(backend, integrity):
    """The same over RDMA READ on the native reader (rdma's production path): the tag lands by DMA
    and is checked after the batch. (The pure-Python reader's check is the one tcp and shm test.)"""
    prod_devs, cons_devs = rdma_sides()
    spec, hosts, redirect = backend
    prod = cons = None
    try:
        prod = Node(spec, protocol="rdma", transport_options={"devices": prod_devs[:1]}, host_discovery=hosts,
                    pool_slots=8, slot_capacity=PAGE, integrity=integrity, name="prod")
        cons = Node(spec, protocol="rdma", transport_options={"devices": cons_devs[:1]}, dir_cache_ttl=0.0,
                    integrity=integrity, name="cons")
        assert cons.reader.native is not None, "the rdma test needs the native module built"
        keys = list(VALUES)
        prod.put_batch(keys, list(VALUES.values()))
        dest = np.zeros(3 * PAGE, np.uint8)
        offs = np.arange(3, dtype=np.uint64) * PAGE
        r = cons.get_batch_into(keys, dest, offs, [PAGE] * 3)
        assert (r.status == Get.HIT).all(), (r.status, r.error)
        redirect(prod, b"pc/0", b"pc/1")
        r = cons.get_batch_into(keys, dest, offs, [PAGE] * 3)
        assert r.status.tolist() == [Get.MISS, Get.HIT, Get.HIT], (r.status, r.error)
        assert r.redirected.tolist() == [0] and REASON in r.miss_reason
        assert dest[PAGE:PAGE + 1500].tobytes() == VALUES[b"pc/1"]
        assert cons.redirected_entries == 1 and cons.integrity_failures == 0
    finally:
        for n in (cons, prod):
            if n is not None:
                n.close()
