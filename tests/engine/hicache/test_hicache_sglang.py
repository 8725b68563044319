"""The HiCache contract against SGLang itself (run in the SGLang venv by ``make test-hicache``).

PeerCacheStore is loaded through SGLang's real ``StorageBackendFactory.create_backend("dynamic", ...)``
with the extra config SGLang passes, must be a real ``HiCacheStorage``, and then runs every
round trip of tests/engine/hicache/test_hicache.py (imported below) through it with torch tensors. The host
KV pool is a numpy-backed stand-in with SGLang's ``get_page_buffer_meta``: SGLang's own host
pool classes need transformers and GPU kernels to build, which this CPU venv does not have.
The tests of test_hicache_sglang_faults.py (SGLang's fault-injection switches, its cache controller
driving the store) are imported too.
In the main venv (no SGLang) the whole module skips, saying so.
"""
from __future__ import annotations

import pytest

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
except Exception as e:  # noqa: BLE001 - any import failure means: not the SGLang venv
    pytest.skip(f"SGLang is not importable here ({type(e).__name__}: {e}); `make test-hicache` runs this "
                "module in .venv-sglang", allow_module_level=True)

from hicache_fixtures import free_port, make_store
from peercache import hicache
from peercache.errors import ConfigError
from test_hicache import *  # noqa: F401,F403 - the same round trips, now through SGLang
from test_hicache_sglang_faults import *  # noqa: F401,F403 - SGLang's own fault injection, its controller driving


def test_sglang_factory_builds_a_real_hicache_storage():
    assert hicache.SGLANG_MISSING is None and hicache.HiCacheStorage is HiCacheStorage
    store = make_store(True, {"pool_bytes": 0, "page_bytes": 16384, "host_discovery": True,
                                "discovery_addr": f"127.0.0.1:{free_port()}"})
    try:
        assert type(store).__name__ == "PeerCacheStore" and isinstance(store, HiCacheStorage)
        assert store.config.protocol == "tcp"
    finally:
        store.close()


def test_sglang_refuses_a_missing_loader_field_and_we_refuse_bad_values():
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="m", extra_config={"module_path": "peercache.hicache",
                                                             "class_name": "PeerCacheStore"})
    with pytest.raises(ValueError, match="backend_name"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)
    with pytest.raises(ConfigError, match="'protocol'"):
        make_store(True, {"protocol": "carrier-pigeon"})


def test_mla_writer_rank_is_sglangs():
    store = make_store(True, {"pool_bytes": 0, "page_bytes": 16384, "host_discovery": True,
                              "discovery_addr": f"127.0.0.1:{free_port()}"}, is_mla_model=True, tp_rank=1)
    try:
        assert store.storage_config.is_storage_writer is False and store.is_writer is False
    finally:
        store.close()


@pytest.mark.parametrize("mla", [True, False])
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_the_suites_writer_rule_is_sglangs(mla, rank):
    from peercache.bench.hicache.store import is_storage_writer
    cfg = HiCacheStorageConfig(tp_rank=rank, tp_size=4, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="m")
    assert is_storage_writer(mla, rank) is cfg.is_storage_writer
