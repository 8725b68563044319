"""Payload checks of a read: the opt-in slot checksum (integrity) and the bench pattern check.

The seqlock tag catches a slot that changed while it was read; a payload that changed without
its tag (a bug, a bit flip in host memory, a wrong DMA) is caught only by the checksum, and only
with integrity on. Both read paths (native and through the transport's read_batch) and the tcp and shm
transports are covered; over rdma the same native pass runs (tests/engine/transport/test_rdma_faults.py).
"""
from __future__ import annotations

import contextlib
import logging
import types

import numpy as np
import pytest

import peercache
from conftest import free_port
from oracles.checksum import checksum as reference_checksum
from peercache import tags
from peercache.errors import ConfigError, TransportError
from peercache.node import Get
import peercache.transport.base as base
from peercache.transport.base import checksum, native_module

mod, _why = native_module()
needs_native = pytest.mark.skipif(mod is None, reason=str(_why))
PAGE = 4096


@needs_native
@pytest.mark.parametrize("size", [0, 1, 7, 8, 63, 64, 240, 241, 1024, 4095, 131072, 1 << 20])
def test_native_checksum_is_the_reference_xxh3(size):
    buf = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    seed = tags.checksum_seed(0x1234_5678_9ABC_DEF0, 7)
    want = reference_checksum(buf, 0x1234_5678_9ABC_DEF0, 7)
    assert mod.checksum(buf, seed) == want
    assert checksum(buf, 0x1234_5678_9ABC_DEF0, 7) == want
    if size:
        buf[size // 2] ^= 1
        assert mod.checksum(buf, seed) != want


def corrupt_payload(node, key: bytes, at: int = 100) -> None:
    """Flip one payload byte of ``key``'s slot in the producer's pool, leaving its tag alone."""
    ref = node.pool.ref(key)
    node.pool.bytes[ref.offset + tags.HEADER_BYTES + at] ^= 0x40


@pytest.fixture(params=["native", "python"])
def path(request):
    if request.param == "native" and mod is None:
        pytest.skip(str(_why))
    return request.param


@pytest.fixture(params=["tcp", "shm"])
def protocol(request):
    if request.param == "shm" and mod is None:
        pytest.skip(str(_why))
    return request.param


@contextlib.contextmanager
def pair(protocol, path, producer_integrity, consumer_integrity, ttl=0.0):
    """A producer hosting discovery and a consumer (on the pure-Python read path if asked), closed after."""
    addr = f"127.0.0.1:{free_port()}"
    with peercache.Client(addr, protocol=protocol, host_discovery=True, pool_bytes=16 * 4200,
                          page_size=PAGE, integrity=producer_integrity) as prod, \
            peercache.Client(addr, protocol=protocol, page_size=PAGE, integrity=consumer_integrity,
                             dir_cache_ttl=ttl) as cons:
        if path == "python":
            cons.node.reader.native = None
        yield prod, cons


def test_a_payload_changed_under_its_tag_is_a_miss_with_integrity(protocol, path, caplog):
    with pair(protocol, path, True, True) as (prod, cons):
        pages = {f"k{i}".encode(): bytes([i]) * (PAGE - i) for i in range(4)}
        prod.put_batch(list(pages), list(pages.values()))
        assert cons.get_batch(list(pages)) == list(pages.values())
        assert cons.node.integrity_failures == 0
        corrupt_payload(prod.node, b"k2")
        with caplog.at_level(logging.WARNING, logger="peercache.node"):
            got = cons.get_batch(list(pages))
            assert got == [pages[b"k0"], pages[b"k1"], None, pages[b"k3"]]
            dest = np.zeros(4 * PAGE, np.uint8)
            r = cons.node.get_batch_into(list(pages), dest, np.arange(4) * PAGE)
            assert r.status.tolist() == [Get.HIT, Get.HIT, Get.MISS, Get.HIT]
        assert cons.node.integrity_failures == 2
        lines = [r.getMessage() for r in caplog.records if "integrity" in r.getMessage()]
        assert len(lines) == 1 and "did not match their slot checksum" in lines[0]   # rate-limited
        prod.put(b"k2", pages[b"k2"])                   # rewritten: a new checksum, a hit again
        assert cons.get(b"k2") == pages[b"k2"]


def test_without_integrity_a_payload_changed_under_its_tag_is_returned(protocol, path):
    """What the README says: with integrity off, the tag alone does not see such a change."""
    with pair(protocol, path, False, False) as (prod, cons):
        prod.put(b"k", b"\x11" * PAGE)
        corrupt_payload(prod.node, b"k")
        got = cons.get(b"k")
        assert got is not None and got != b"\x11" * PAGE and got[100] == 0x11 ^ 0x40


def test_a_consumer_with_integrity_refuses_pages_without_a_checksum(protocol, path):
    with pair(protocol, path, False, True) as (prod, cons):
        prod.put(b"k", b"x" * 100)
        assert cons.get(b"k") is None
        assert cons.node.integrity_missing == 1 and cons.node.integrity_failures == 0


def test_the_bench_pattern_check_lists_the_hits_whose_bytes_differ(protocol, path):
    with pair(protocol, path, False, False, ttl=30.0) as (prod, cons):
        keys = [f"p{i}".encode() for i in range(6)]

        def fill(view, ref):
            tags.fill_pattern(view, ref.key_hash, ref.generation)

        prod.node.put_batch(keys, fill=fill)
        dest = np.zeros(6 * PAGE, np.uint8)
        r = cons.node.get_batch_into(keys, dest, np.arange(6) * PAGE, check_pattern=True)
        assert r.hits == 6 and r.content_mismatch.tolist() == []
        corrupt_payload(prod.node, keys[1], at=PAGE - 1)      # the last byte: the tail compare
        corrupt_payload(prod.node, keys[4], at=8)
        r = cons.node.get_batch_into(keys, dest, np.arange(6) * PAGE, check_pattern=True)
        assert r.hits == 6 and r.content_mismatch.tolist() == [1, 4]     # hits, reported as wrong
        r = cons.node.get_batch_into(keys, dest, np.arange(6) * PAGE)    # not asked: not checked
        assert r.content_mismatch.tolist() == []


def test_pattern_check_at_odd_sizes_and_edges_agrees_with_the_reference(protocol, path):
    """Sizes around the 8-byte words, the 32-byte AVX2 blocks and the 2 KiB copy chunks, one byte
    flipped at the start, the end or the middle: the read pass and tags.verify_patterns agree."""
    sizes = [1, 7, 8, 9, 31, 33, 2047, 2049, 4095, 4097, 40000]
    addr = f"127.0.0.1:{free_port()}"
    prod = peercache.Client(addr, protocol=protocol, host_discovery=True, pool_bytes=64 * 40100,
                            page_size=40000)
    cons = peercache.Client(addr, protocol=protocol, page_size=40000)
    if path == "python":
        cons.node.reader.native = None
    try:
        keys, flips = [], {}
        for j, size in enumerate(sizes):
            for where in (None, 0, size - 1, size // 2):
                key = f"z{j}-{where}".encode()
                page = np.zeros(size, np.uint8)
                tags.fill_pattern(page, tags.key_hash(key), 1)      # a fresh slot's first generation
                if where is not None:
                    page[where] ^= 0x01
                    flips[len(keys)] = (size, where)
                keys.append(key)
                prod.put(key, page.tobytes())
        dest = np.zeros(len(keys) * 40000, np.uint8)
        r = cons.node.get_batch_into(keys, dest, np.arange(len(keys)) * 40000, check_pattern=True)
        assert (r.status == Get.HIT).all()
        assert r.content_mismatch.tolist() == sorted(flips), [flips.get(i) for i in r.content_mismatch]
    finally:
        cons.close()
        prod.close()


@pytest.fixture
def copy_way(request):
    """This process's way of making shm copies of 64 KiB or more (``_native.copy_way``), back to its own after."""
    mod, why = native_module()
    if mod is None:
        pytest.skip(f"the native module is not built: {why}")
    before = mod.copy_way()
    mod.copy_way(request.param)
    yield request.param
    mod.copy_way(before)


@pytest.mark.parametrize("protocol, copy_way", [("tcp", "glibc"), ("shm", "stream"), ("shm", "glibc")],
                         indirect=["copy_way"])
def test_pattern_check_of_large_pages_at_every_destination_alignment(protocol, path, copy_way):
    """Pages past the streaming threshold (64 KiB: the copy's stores bypass the cache from a cache line
    of the destination on, the words before it copied and checked apart), read to destinations 8 to 56
    bytes off a line as well as on it, one byte flipped in the words before the line, right after it,
    in the middle or at the end: the bytes land and every flip is found, with stores streamed or not."""
    size, room = 70001, 70400
    addr = f"127.0.0.1:{free_port()}"
    prod = peercache.Client(addr, protocol=protocol, host_discovery=True, pool_bytes=64 * (room + 256),
                            page_size=room)
    cons = peercache.Client(addr, protocol=protocol, page_size=room)
    if path == "python":
        cons.node.reader.native = None
    try:
        keys, flips, pages = [], {}, []
        for shift in (0, 8, 16, 24, 40, 56):
            for where in (None, 0, 8, 40, 56, 64, size // 2, size - 1):
                key = f"a{shift}-{where}".encode()
                page = np.zeros(size, np.uint8)
                tags.fill_pattern(page, tags.key_hash(key), 1)
                if where is not None:
                    page[where] ^= 0x10
                    flips[len(keys)] = (shift, where)
                keys.append(key)
                pages.append((shift, page))
                prod.put(key, page.tobytes())
        dest = np.zeros(len(keys) * room + 64, np.uint8)
        base = (-dest.ctypes.data) % 64                       # dest + base is on a cache line
        offsets = np.asarray([base + i * room + shift for i, (shift, _) in enumerate(pages)], np.uint64)
        r = cons.node.get_batch_into(keys, dest, offsets, check_pattern=True)
        assert (r.status == Get.HIT).all()
        assert r.content_mismatch.tolist() == sorted(flips), [flips.get(i) for i in r.content_mismatch]
        for i, (_, page) in enumerate(pages):
            assert (dest[int(offsets[i]):int(offsets[i]) + size] == page).all(), i
    finally:
        cons.close()
        prod.close()


@pytest.mark.parametrize("protocol, copy_way", [("tcp", "glibc"), ("shm", "stream"), ("shm", "glibc")],
                         indirect=["copy_way"])
def test_large_pages_land_whole_at_every_destination_alignment_unchecked(protocol, path, copy_way):
    """Unchecked reads of pages past the streaming threshold (shm streams their stores from a cache line of
    the destination on, the bytes before it and after the last whole line copied apart, or copies them with
    glibc's memcpy), next to each other in one buffer at 0 to 56 bytes off
    a line, sizes not a multiple of a line: every byte lands, and the bytes around the pages are left as
    they were."""
    sizes, room = (65536, 70001, 131072 - 8), 131072 + 128
    addr = f"127.0.0.1:{free_port()}"
    prod = peercache.Client(addr, protocol=protocol, host_discovery=True, pool_bytes=24 * (room + 256),
                            page_size=room)
    cons = peercache.Client(addr, protocol=protocol, page_size=room)
    if path == "python":
        cons.node.reader.native = None
    try:
        rng = np.random.default_rng(3)
        keys, pages = [], []
        for shift in (0, 8, 16, 24, 40, 56):
            for size in sizes:
                key = f"u{shift}-{size}".encode()
                page = rng.integers(0, 256, size, dtype=np.uint8)
                keys.append(key)
                pages.append((shift, page))
                prod.put(key, page.tobytes())
        dest = np.full(len(keys) * room + 128, 0xA5, np.uint8)
        base = (-dest.ctypes.data) % 64
        offsets = np.asarray([base + i * room + shift for i, (shift, _) in enumerate(pages)], np.uint64)
        r = cons.node.get_batch_into(keys, dest, offsets)
        assert (r.status == Get.HIT).all()
        written = np.zeros(len(dest), bool)
        for i, (_, page) in enumerate(pages):
            o = int(offsets[i])
            assert (dest[o:o + len(page)] == page).all(), (i, pages[i][0], len(page))
            written[o:o + len(page)] = True
        assert (dest[~written] == 0xA5).all()
    finally:
        cons.close()
        prod.close()


def test_the_shm_copy_way_follows_the_cpu_and_the_environment(monkeypatch):
    """Large shm copies stream on AMD CPUs and go through glibc's memcpy elsewhere, unless
    PEERCACHE_SHM_COPY says (read when a transport is made); a batch of 128 KiB pages read either way has
    the right bytes; any other value is refused, naming the two."""
    mod, why = native_module()
    if mod is None:
        pytest.skip(f"the native module is not built: {why}")
    size = 131072
    addr = f"127.0.0.1:{free_port()}"
    prod = peercache.Client(addr, protocol="shm", host_discovery=True, pool_bytes=40 * (size + 256),
                            page_size=size)
    clients = []
    before = mod.copy_way()
    try:
        with open("/proc/cpuinfo") as f:
            amd = "AuthenticAMD" in f.read()
        assert before == ("stream" if amd else "glibc")
        rng = np.random.default_rng(5)
        keys = [f"w{i}".encode() for i in range(40)]
        pages = rng.integers(0, 256, (40, size), dtype=np.uint8)
        for k, page in zip(keys, pages):
            prod.put(k, page.tobytes())
        for way in ("stream", "glibc"):
            monkeypatch.setenv("PEERCACHE_SHM_COPY", way)
            clients.append(peercache.Client(addr, protocol="shm", page_size=size))
            assert mod.copy_way() == way
            dest = np.zeros(40 * size + 16, np.uint8)[16:]
            assert (clients[-1].node.get_batch_into(keys, dest, np.arange(40) * size).status == Get.HIT).all()
            assert (dest.reshape(40, size) == pages).all()
        monkeypatch.setenv("PEERCACHE_SHM_COPY", "auto")
        with pytest.raises(TransportError, match="PEERCACHE_SHM_COPY='auto': one of glibc, stream"):
            peercache.Client(addr, protocol="shm", page_size=size)
    finally:
        mod.copy_way(before)
        for c in clients:
            c.close()
        prod.close()


def test_without_the_native_module_a_checksum_says_how_to_build_it(monkeypatch):
    """The checksum has one implementation, the native one: a pool with integrity on and no native
    module is refused, saying what to run."""
    def missing(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(base, "_native_cache", [])
    monkeypatch.setattr(base, "importlib", types.SimpleNamespace(import_module=missing))
    with pytest.raises(ConfigError, match=r"payload checksums \(integrity\) need the native module: .*make setup"):
        checksum(b"payload", 1, 1)
