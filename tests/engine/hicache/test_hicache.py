"""peercache.hicache.PeerCacheStore: SGLang's HiCache storage contract, two processes (writer, reader).

In the main venv the store derives from the local stand-in of ``HiCacheStorage`` and values are
numpy arrays; tests/engine/hicache/test_hicache_sglang.py runs these same cases in the SGLang venv
(``make test-hicache``), through SGLang's own StorageBackendFactory, with torch tensors.
The host KV pool is a numpy-backed stand-in with SGLang's ``get_page_buffer_meta``
(tests/hicache_fixtures.py): SGLang's own host pool classes need transformers and kernels.
"""
from __future__ import annotations

import numpy as np
import pytest

from hicache_fixtures import NumpyHostPool, cluster, indices, make_store, page_bytes
from peercache import hicache, tags
from peercache.errors import ConfigError

#: True when this runs in the SGLang venv (the store is then a real SGLang HiCacheStorage).
SGLANG = hicache.SGLANG_MISSING is None
OBJ = 16384


def reader(addr: str, protocol: str, mla: bool, pages: int = 16, rank: int = 0, **extra):
    store = make_store(SGLANG, {"discovery_addr": addr, "protocol": protocol, "pool_bytes": 0,
                                "dir_cache_ttl": 30.0, **extra}, is_mla_model=mla, tp_rank=rank)
    pool = NumpyHostPool(pages, OBJ, mla)
    store.register_mem_pool_host(pool)
    return store, pool


def keys_of(tag: str, n: int) -> list[str]:
    return [f"{tag}{i:04d}deadbeef" for i in range(n)]


def assert_pages(pool: NumpyHostPool, keys, pages) -> None:
    for k, p in zip(keys, pages):
        for j, v in enumerate(pool.page_view(p)):
            assert np.array_equal(v, page_bytes(k, j, OBJ)), f"page {k} object {j} has wrong bytes"


@pytest.mark.parametrize("layout", ["mla", "mha"])
@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_v1_round_trip_lands_exact_bytes_in_host_pages(protocol, layout):
    mla = layout == "mla"
    with cluster(protocol, sglang=SGLANG, mla=mla, obj_bytes=OBJ) as (addr, lookups, w):
        keys = keys_of("v1", 8)
        assert w.call("set_v1", (keys, list(range(8)))) == [True] * 8
        store, pool = reader(addr, protocol, mla)
        try:
            dst = list(range(15, 7, -1))           # other host pages than the writer's
            before = lookups.n
            assert store.batch_exists(keys) == 8
            assert store.batch_get_v1(keys, indices(dst, torch_indices=SGLANG)) == [True] * 8
            # batch_exists primed the read: the prefetch cost one directory call, not two
            assert lookups.n - before == 1
            assert_pages(pool, keys, dst)
            s = store.get_stats()
            assert s["pages_read"] == 8 and s["hits"] == 8 and s["misses"] == 0
            assert s["bytes_read"] == 8 * OBJ * (1 if mla else 2) and s["read_bandwidth_GBps"] > 0
            ws = w.call("stats")
            assert ws["pages_written"] == 8 and ws["bytes_written"] == 8 * OBJ * (1 if mla else 2)
        finally:
            store.close()


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_batch_exists_is_the_consecutive_prefix(protocol):
    with cluster(protocol, sglang=SGLANG, obj_bytes=OBJ) as (addr, lookups, w):
        keys = keys_of("px", 6)
        w.call("set_v1", (keys, list(range(6))))
        store, pool = reader(addr, protocol, False)
        try:
            assert store.batch_exists(keys) == 6
            assert store.batch_exists(keys[:3] + ["absent0000"] + keys[3:]) == 3
            assert store.batch_exists(["absent0000"] + keys) == 0
            assert store.batch_exists([]) == 0
            got = store.batch_get_v1(keys[:2] + ["absent0000"], indices([0, 1, 2], torch_indices=SGLANG))
            assert got == [True, True, False]
            assert store.get_stats()["misses"] == 1
        finally:
            store.close()


def test_mha_keys_carry_the_rank_and_mla_is_shared_by_every_rank():
    with cluster("shm", sglang=SGLANG, mla=False, obj_bytes=OBJ) as (addr, _, w):
        keys = keys_of("mha", 4)
        w.call("set_v1", (keys, [0, 1, 2, 3]))            # written by rank 0
        other, _ = reader(addr, "shm", False, rank=1)     # rank 1 holds other heads: nothing to read
        same, pool = reader(addr, "shm", False, rank=0)
        try:
            assert other.batch_exists(keys) == 0
            assert same.batch_exists(keys) == 4
            assert same.object_keys(keys[:1], 2) == [f"default/m/{keys[0]}_0_k".encode(),
                                                    f"default/m/{keys[0]}_0_v".encode()]
        finally:
            other.close()
            same.close()
    with cluster("shm", sglang=SGLANG, mla=True, obj_bytes=OBJ, writer_rank=1) as (addr, _, w):
        keys = keys_of("mlanw", 4)
        # rank 1 is not MLA's storage writer: it reports success and stores nothing
        assert w.call("set_v1", (keys, [0, 1, 2, 3])) == [True] * 4
        rank0, _ = reader(addr, "shm", True, rank=0)
        try:
            assert rank0.batch_exists(keys) == 0
        finally:
            rank0.close()
    with cluster("shm", sglang=SGLANG, mla=True, obj_bytes=OBJ, writer_rank=0) as (addr, _, w):
        keys = keys_of("mla", 4)
        w.call("set_v1", (keys, [0, 1, 2, 3]))
        rank3, pool = reader(addr, "shm", True, rank=3)   # every rank reads the writer's MLA pages
        try:
            assert rank3.batch_get_v1(keys, indices([4, 5, 6, 7], torch_indices=SGLANG)) == [True] * 4
            assert_pages(pool, keys, [4, 5, 6, 7])
        finally:
            rank3.close()


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_generic_set_get_batch_set_batch_get(protocol):
    with cluster(protocol, sglang=SGLANG, obj_bytes=OBJ) as (addr, _, w):
        keys = keys_of("gen", 5)
        assert w.call("set", keys) is True
        store, _ = reader(addr, protocol, False)
        try:
            assert all(store.exists(k) for k in keys) and not store.exists("absent0000")
            vals = store.batch_get(keys + ["absent0000"])
            assert vals[-1] is None
            for k, v in zip(keys, vals[:-1]):
                assert np.array_equal(np.asarray(v), page_bytes(k, 0, OBJ))
                if SGLANG:
                    import torch
                    assert isinstance(v, torch.Tensor)
            if SGLANG:
                import torch
                target = torch.zeros(OBJ, dtype=torch.uint8)
            else:
                target = np.zeros(OBJ, dtype=np.uint8)
            got = store.get(keys[2], target_location=target)
            assert got is target and np.array_equal(np.asarray(target), page_bytes(keys[2], 0, OBJ))
            assert store.get("absent0000") is None
        finally:
            store.close()


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_misses_after_eviction_even_with_primed_locations(protocol):
    # The writer's pool holds 8 pages (16 objects); a second batch evicts the first.
    with cluster(protocol, sglang=SGLANG, obj_bytes=OBJ, writer_pool_pages=8) as (addr, _, w):
        first, second = keys_of("ev1", 8), keys_of("ev2", 8)
        w.call("set_v1", (first, list(range(8))))
        store, pool = reader(addr, protocol, False)
        try:
            assert store.batch_exists(first) == 8          # locations now cached in the reader
            w.call("set_v1", (second, list(range(8, 16))))
            assert store.batch_get_v1(first, indices(range(8), torch_indices=SGLANG)) == [False] * 8
            assert store.batch_exists(first) == 0
            assert store.batch_get_v1(second, indices(range(8, 16), torch_indices=SGLANG)) == [True] * 8
            assert_pages(pool, second, range(8, 16))
            w.call("clear")                                 # the writer removes all it wrote
            assert store.batch_exists(second) == 0
        finally:
            store.close()


@pytest.mark.parametrize("extra,key", [
    ({"protocol": "udp"}, "protocol"),
    ({"pool_bytes": -1}, "pool_bytes"),
    ({"pool_bytes": "lots"}, "pool_bytes"),
    ({"dir_cache_ttl": "soon"}, "dir_cache_ttl"),
    ({"dir_cache_ttl": float("nan")}, "dir_cache_ttl"),
    ({"discovery_addr": "nohost"}, "discovery_addr"),
    ({"discovery_addr": "127.0.0.1:99999"}, "discovery_addr"),
    ({"devices": ["mlx5_0"]}, "devices"),
    ({"protocol": "rdma", "devices": "  "}, "devices"),
    ({"max_channels": 0}, "max_channels"),
    ({"timeout": 0}, "timeout"),
    ({"auth_key_file": "/nonexistent/peercache.key"}, "auth_key_file"),
    ({"tenant": "a b"}, "tenant"),
    ({"pol_bytes": 1}, "pol_bytes"),
])
def test_bad_config_is_refused_naming_the_key(extra, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        make_store(SGLANG, extra)


def test_config_values_and_sizes():
    c = hicache.StoreConfig.from_extra({"pool_bytes": "2GiB", "page_bytes": "128K", "protocol": "rdma",
                                        "devices": "mlx5_0,mlx5_1", "dir_cache_ttl": 0, "tenant": "t1",
                                        "backend_name": "peercache", "interface_v1": 1})
    assert (c.pool_bytes, c.page_bytes, c.devices, c.dir_cache_ttl) == (2 << 30, 128 << 10, ("mlx5_0", "mlx5_1"), 0.0)
    assert hicache.StoreConfig.from_extra(None) == hicache.StoreConfig()


def test_pool_too_small_and_unregistered_v1_are_refused():
    with pytest.raises(ConfigError, match="'pool_bytes'"):
        make_store(SGLANG, {"pool_bytes": 100, "page_bytes": OBJ})
    store = make_store(SGLANG, {"pool_bytes": 0})
    with pytest.raises(ConfigError, match="register_mem_pool_host"):
        store.batch_get_v1(["k"], indices([0]))
    store.close()


def test_the_store_is_a_hicache_storage_and_imports_without_sglang():
    assert issubclass(hicache.PeerCacheStore, hicache.HiCacheStorage)
    for m in ("get", "batch_get", "set", "batch_set", "exists", "batch_exists", "batch_get_v1", "batch_set_v1",
              "register_mem_pool_host", "clear", "get_stats", "close"):
        assert callable(getattr(hicache.PeerCacheStore, m))
    if not SGLANG:
        assert hicache.HiCacheStorage is hicache._StandInHiCacheStorage


def test_close_releases_node_and_region_and_is_idempotent():
    with cluster("shm", sglang=SGLANG, obj_bytes=OBJ) as (addr, _, w):
        store, _ = reader(addr, "shm", False)
        node = store.node
        store.close()
        store.close()
        assert node.transport is None and node.discovery is None and store._region is None
        with pytest.raises(ConfigError, match="closed"):
            store.batch_exists(["k"])


@pytest.mark.rdma
def test_v1_round_trip_over_rdma():
    from conftest import rdma_sides
    prod, cons = rdma_sides()
    with cluster("rdma", sglang=SGLANG, obj_bytes=OBJ, extra={"devices": prod}) as (addr, lookups, w):
        keys = keys_of("rd", 8)
        assert w.call("set_v1", (keys, list(range(8)))) == [True] * 8
        store, pool = reader(addr, "rdma", False, devices=cons)
        try:
            assert store.batch_exists(keys) == 8
            assert store.batch_get_v1(keys, indices(range(8), torch_indices=SGLANG)) == [True] * 8
            assert_pages(pool, keys, range(8))
        finally:
            store.close()


def test_batch_set_v1_is_one_native_copy_and_one_publish():
    from hicache_fixtures import LookupCounter, free_port
    addr = f"127.0.0.1:{free_port()}"
    store = make_store(SGLANG, {"discovery_addr": addr, "host_discovery": True, "protocol": "shm",
                                "pool_bytes": 32 * tags.slot_stride(OBJ)})
    try:
        pool = NumpyHostPool(16, OBJ, False)
        store.register_mem_pool_host(pool)
        if store._native is None:
            pytest.skip(f"the native module is not built: {store._native_why}")
        node = store.node
        publishes = {"n": 0}
        inner = node.server.handlers["publish"]

        def counted(msg):
            publishes["n"] += 1
            return inner(msg)
        node.server.handlers["publish"] = counted
        LookupCounter(node)
        copies = []

        class Counting:
            def __getattr__(self, name):
                return getattr(hicache.native_module()[0], name)

            def copy_pages(self, *a):
                copies.append(len(a[2]))
                return hicache.native_module()[0].copy_pages(*a)
        store._native = Counting()
        keys = keys_of("one", 8)
        for i, k in enumerate(keys):
            for j, v in enumerate(pool.page_view(i)):
                v[:] = page_bytes(k, j, OBJ)
        assert store.batch_set_v1(keys, indices(range(8), torch_indices=SGLANG)) == [True] * 8
        assert copies == [16] and publishes["n"] == 1      # 8 pages x (K, V): one copy, one publish
        # the published bytes are the host pages, read back into other host pages
        assert store.batch_get_v1(keys, indices(range(8, 16), torch_indices=SGLANG)) == [True] * 8
        assert_pages(pool, keys, range(8, 16))
    finally:
        store.close()
